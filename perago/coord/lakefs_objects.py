"""The default coordination store: generation objects on a dedicated lakeFS branch.

No extra infrastructure: lakeFS OSS atomically creates an object path only if it is absent
(``If-None-Match: *``, 412 otherwise; ``If-Match`` is 501), and that is all a generation log
needs (:mod:`perago.coord.generations`). The objects are *uncommitted* writes on the branch
``_perago_coord``, created from the repository's default branch on first use: reads on a
branch see its staged objects, and nothing is ever committed there. Never commit, reset or
revert that branch (it would drop or freeze the staged state), and keep it out of
``perago-stg-*`` names so the staging janitor never touches it. The branch is created
*hidden*, so users' branch lists (lakeFS UI, ``lakectl branch list``) do not show it.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta

from perago.coord.errors import CoordStoreError, PredicateFailedError
from perago.coord.generations import GenerationLogStore, ObjectEntry
from perago.coord.store import Versioned
from perago.core import lakefs_names as names
from perago.core.store import VersionStore
from perago.errors import ConflictError, NotFoundError, StoreError

__all__ = ["DEFAULT_BRANCH", "DEFAULT_ROOT", "LakeFSObjectsStore"]

DEFAULT_BRANCH = names.COORD_BRANCH
DEFAULT_ROOT = names.COORD_ROOT


class _BranchObjects:
    """The :class:`~perago.coord.generations.ObjectLog` primitives on one lakeFS branch."""

    def __init__(
        self,
        lakefs: VersionStore,
        repository: str,
        branch: str,
        source: str | None,
        clock: Callable[[], float],
    ) -> None:
        self._lakefs = lakefs
        self._repo = repository
        self._branch = branch
        self._source = source
        self._clock = clock
        self._ready = False
        self._lock = threading.Lock()

    def ensure_branch(self) -> None:
        """Create the coordination branch on first use (idempotent, safe to race)."""
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            names = {b for b, _ in self._lakefs.list_branches(self._repo, prefix=self._branch)}
            if self._branch not in names:
                source = self._source or self._lakefs.default_branch(self._repo)
                with contextlib.suppress(ConflictError):  # someone else created it first
                    self._lakefs.create_branch(self._repo, self._branch, source, hidden=True)
            self._ready = True

    def list(self, prefix: str) -> Iterator[ObjectEntry]:
        # Reads never create the branch: a janitor scan must not touch an unused repository.
        try:
            for o in self._lakefs.list_objects(self._repo, self._branch, prefix):
                yield ObjectEntry(o.path, o.size)
        except NotFoundError:
            if self._ready:
                raise
            return  # no coordination branch yet: no records

    def read(self, path: str) -> bytes | None:
        buf = io.BytesIO()
        try:
            self._lakefs.download(self._repo, self._branch, path, buf)
        except NotFoundError:
            return None
        return buf.getvalue()

    def create(self, path: str, data: bytes, *, deadline: float) -> bool:
        self.ensure_branch()
        if self._clock() > deadline:
            raise PredicateFailedError(
                f"gave up writing {path}: too long since its generation was listed (a pruner "
                "may have run); re-read and try again"
            )
        try:
            # Not retried on purpose: a retry of a create that landed would see 412.
            self._lakefs.upload_bytes(self._repo, self._branch, path, data, if_absent=True)
        except ConflictError:
            return False
        except StoreError as e:
            if e.status is not None:
                raise  # lakeFS answered: the create did not happen
            raise CoordStoreError(
                f"lakeFS create {self._repo}/{self._branch}/{path} got no answer ({e.message}); "
                "whether it landed is unknown: re-read the key before deciding again"
            ) from e
        return True

    def delete(self, paths: Sequence[str]) -> None:
        self.ensure_branch()
        self._lakefs.delete_objects(self._repo, self._branch, list(paths))


class LakeFSObjectsStore:
    """Keys as generation objects under ``root`` on ``branch`` of ``repository``."""

    def __init__(
        self,
        lakefs: VersionStore,
        repository: str,
        *,
        branch: str = DEFAULT_BRANCH,
        root: str = DEFAULT_ROOT,
        source_branch: str | None = None,
        keep: int = 8,
        prune_grace: timedelta = timedelta(minutes=10),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repository = repository
        self.branch = branch
        self._objects = _BranchObjects(lakefs, repository, branch, source_branch, clock)
        self._log = GenerationLogStore(
            self._objects, root, keep=keep, prune_grace=prune_grace, clock=clock
        )

    def ensure_branch(self) -> None:
        self._objects.ensure_branch()

    def get(self, key: str) -> Versioned | None:
        return self._log.get(key)

    def set_if(self, key: str, value: bytes, expected: str | None) -> str:
        return self._log.set_if(key, value, expected)

    def delete_if(self, key: str, expected: str) -> None:
        self._log.delete_if(key, expected)

    def scan(self, prefix: str) -> Iterator[tuple[str, Versioned]]:
        return self._log.scan(prefix)
