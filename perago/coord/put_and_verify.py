"""Exclusive writes on stores that only promise consistent PUT, GET, LIST and DELETE.

The put-and-verify protocol (``reference/put-and-verify-exclusive-write.txt``, from TiKV's
backup storage): to write ``target`` exactly once, put an intention file
``<target>.INTENT.<txn>``, list ``<target>*``, and write the target only if our intention is
the only file there; otherwise remove it, back off and retry. Two writers may both back off,
never both write. On top of it: create-if-absent (so a generation log, i.e. a full
:class:`~perago.coord.store.CoordStore`: :class:`PutAndVerifyStore`) and the reference's
read/write lock (:class:`RWLock`).

Crashes leave intention files behind. One this process has seen for ``stale_intent_after``
is removed; a writer that has not reached its final PUT within half of that gives up, so a
removed intention's writer cannot still write (unless a single PUT takes that long).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from perago.coord.generations import GenerationLogStore, ObjectEntry
from perago.coord.s3 import retry_reads
from perago.coord.store import Versioned
from perago.core.retry_policy import contention_wait
from perago.errors import CoordStoreError, PredicateFailedError, TargetExistsError

__all__ = [
    "MemoryObjects",
    "ObjectStorage",
    "PutAndVerify",
    "PutAndVerifyStore",
    "RWLock",
    "S3Objects",
    "TargetExistsError",
    "VerifyContext",
]

INTENT = ".INTENT."


class ObjectStorage(Protocol):
    """Unconditional object operations with read-after-write and list-after-write consistency."""

    def put(self, path: str, data: bytes) -> None: ...
    def get(self, path: str) -> bytes | None: ...
    def list(self, prefix: str) -> Iterator[ObjectEntry]: ...
    def delete(self, path: str) -> None: ...


@dataclass(frozen=True)
class VerifyContext:
    """What a ``verify`` callback may look at: the storage, the target and our intention."""

    storage: ObjectStorage
    target: str
    intent: str

    def assert_no_other_with_prefix(self, prefix: str, expect: str = "") -> None:
        """Fail if any file under ``prefix`` is not ``expect`` (the reference's helper)."""
        for e in self.storage.list(prefix):
            if e.path != expect:
                raise PredicateFailedError(f"{self.target}: conflicting file {e.path} exists")


class _Busy(Exception):
    """Another writer's intention is present: back off and retry."""


class PutAndVerify:
    """The exclusive-write engine; one per process and storage (it remembers intentions seen)."""

    def __init__(
        self,
        storage: ObjectStorage,
        *,
        attempts: int = 30,
        backoff: timedelta = timedelta(milliseconds=10),
        max_backoff: timedelta = timedelta(milliseconds=500),
        stale_intent_after: timedelta = timedelta(minutes=2),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.storage = storage
        self._attempts = attempts
        self._backoff = backoff.total_seconds()
        self._max_backoff = max_backoff.total_seconds()
        self._stale = stale_intent_after.total_seconds()
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._intents_seen: dict[str, float] = {}

    def exclusive_write(
        self,
        target: str,
        content: bytes,
        *,
        verify: Callable[[VerifyContext], None] | None = None,
        deadline: float | None = None,
    ) -> str:
        """Write ``target`` if it is absent and ``verify`` passes; the transaction id.

        PredicateFailedError if the target exists, ``verify`` fails, or other writers kept
        the target busy for every attempt. It always means: nothing was written.
        """
        txn = uuid.uuid4().hex
        cx = VerifyContext(self.storage, target, f"{target}{INTENT}{txn}")
        for attempt in range(self._attempts):
            try:
                self._check(cx, verify)
                started = self._clock()
                self.storage.put(cx.intent, b"")
                try:
                    self._check(cx, verify)
                    now = self._clock()
                    if now - started > self._stale / 2 or (deadline is not None and now > deadline):
                        raise PredicateFailedError(
                            f"gave up writing {target}: the check took too long to trust it"
                        )
                    self.storage.put(target, content)
                    return txn
                finally:
                    self.storage.delete(cx.intent)
            except _Busy:
                self._sleep(contention_wait(attempt, first=self._backoff, cap=self._max_backoff))
        raise PredicateFailedError(
            f"{target} stayed busy with other writers for {self._attempts} attempts; try again"
        )

    def _check(self, cx: VerifyContext, verify: Callable[[VerifyContext], None] | None) -> None:
        if verify is not None:
            verify(cx)
        busy = False
        others: set[str] = set()
        for e in self.storage.list(cx.target):
            if e.path == cx.intent:
                continue
            if e.path == cx.target:
                raise TargetExistsError(f"{cx.target} already exists")
            if e.path.startswith(cx.target + INTENT):
                others.add(e.path)
                if self._stale_intent(e.path):
                    self.storage.delete(e.path)  # its writer died (or gives up, see above)
                else:
                    busy = True
                continue
            raise PredicateFailedError(
                f"{e.path} shares the prefix of {cx.target}: an exclusive write needs it alone"
            )
        mine = cx.target + INTENT
        with self._lock:
            for gone in [p for p in self._intents_seen if p.startswith(mine) and p not in others]:
                del self._intents_seen[gone]
        if busy:
            raise _Busy()

    def _stale_intent(self, path: str) -> bool:
        now = self._clock()
        with self._lock:
            first = self._intents_seen.setdefault(path, now)
            if now - first < self._stale:
                return False
            del self._intents_seen[path]
            return True

    # -- create-if-absent for a generation log -----------------------------------------------

    def create(self, path: str, data: bytes, *, deadline: float) -> bool:
        try:
            self.exclusive_write(path, data, deadline=deadline)
        except TargetExistsError:
            return False
        return True

    def list(self, prefix: str) -> Iterator[ObjectEntry]:
        return self.storage.list(prefix)

    def read(self, path: str) -> bytes | None:
        return self.storage.get(path)

    def delete(self, paths: Sequence[str]) -> None:
        for p in paths:
            self.storage.delete(p)


class PutAndVerifyStore:
    """A coordination store on plain PUT/GET/LIST/DELETE: generations written exclusively."""

    def __init__(
        self,
        storage: ObjectStorage,
        *,
        root: str = "perago/coord",
        keep: int = 8,
        prune_grace: timedelta = timedelta(minutes=10),
        stale_intent_after: timedelta = timedelta(minutes=2),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine = PutAndVerify(
            storage, stale_intent_after=stale_intent_after, clock=clock, sleep=sleep
        )
        self._log = GenerationLogStore(
            self.engine, root, keep=keep, prune_grace=prune_grace, clock=clock
        )

    def get(self, key: str) -> Versioned | None:
        return self._log.get(key)

    def set_if(self, key: str, value: bytes, expected: str | None) -> str:
        return self._log.set_if(key, value, expected)

    def delete_if(self, key: str, expected: str) -> None:
        self._log.delete_if(key, expected)

    def scan(self, prefix: str) -> Iterator[tuple[str, Versioned]]:
        return self._log.scan(prefix)


class RWLock:
    """The reference's remote read/write lock on ``path``: many readers or one writer.

    A write lock is ``<path>.WRIT``, written only if nothing else exists under ``<path>.``;
    a read lock is ``<path>.READ.<random>``, written only if no ``<path>.WRIT*`` exists. The
    ``try_*`` calls fail fast (PredicateFailedError); ``unlock`` takes what they returned.
    Locks of crashed holders stay until removed by hand (``unlock``).
    """

    def __init__(self, engine: PutAndVerify, path: str) -> None:
        self._engine = engine
        self.path = path

    def try_lock_write(self, content: bytes = b"") -> str:
        target = f"{self.path}.WRIT"

        def verify(cx: VerifyContext) -> None:
            # ``<path>.`` rather than the reference's bare ``<path>``: "locks/a" must not see
            # "locks/ab" as a conflict. Our own intention is the one file allowed.
            for e in cx.storage.list(f"{self.path}."):
                if e.path not in (cx.intent, cx.target) and not e.path.startswith(
                    cx.target + INTENT
                ):
                    raise PredicateFailedError(f"{self.path} is locked: {e.path} exists")

        self._engine.exclusive_write(target, content, verify=verify)
        return target

    def try_lock_read(self, content: bytes = b"") -> str:
        target = f"{self.path}.READ.{random.getrandbits(64):016x}"

        def verify(cx: VerifyContext) -> None:
            # The reference checks "<read lock>.WRIT", which can never exist; the writer's
            # lock (and its intentions) live under "<path>.WRIT".
            cx.assert_no_other_with_prefix(f"{self.path}.WRIT")

        self._engine.exclusive_write(target, content, verify=verify)
        return target

    def unlock(self, lock: str) -> None:
        if not lock.startswith(f"{self.path}."):
            raise ValueError(f"{lock} is not a lock of {self.path}")
        self._engine.storage.delete(lock)


class S3Objects:
    """:class:`ObjectStorage` on S3 (or any S3 API) without conditional headers."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._s3 = client
        self._bucket = bucket

    def _fail(self, what: str, e: Exception) -> CoordStoreError:
        status = None
        if isinstance(e, ClientError):
            raw = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            status = int(raw) if raw is not None else None
        return CoordStoreError(f"S3 {what} s3://{self._bucket} failed: {e}", status=status)

    def put(self, path: str, data: bytes) -> None:
        try:
            self._s3.put_object(Bucket=self._bucket, Key=path, Body=data)
        except (ClientError, BotoCoreError) as e:
            raise self._fail(f"put {path} in", e) from e

    def get(self, path: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                r = self._s3.get_object(Bucket=self._bucket, Key=path)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise self._fail(f"get {path} from", e) from e
            except BotoCoreError as e:
                raise self._fail(f"get {path} from", e) from e
            with r["Body"] as body:
                return bytes(body.read())

        return retry_reads(read)

    def list(self, prefix: str) -> Iterator[ObjectEntry]:
        def read() -> list[ObjectEntry]:
            found: list[ObjectEntry] = []
            try:
                pages = self._s3.get_paginator("list_objects_v2").paginate(
                    Bucket=self._bucket, Prefix=prefix
                )
                for page in pages:
                    found.extend(
                        ObjectEntry(str(o["Key"]), int(o["Size"])) for o in page.get("Contents", [])
                    )
            except (ClientError, BotoCoreError) as e:
                raise self._fail(f"list {prefix} in", e) from e
            return found

        return iter(retry_reads(read))

    def delete(self, path: str) -> None:
        try:
            self._s3.delete_object(Bucket=self._bucket, Key=path)
        except (ClientError, BotoCoreError) as e:
            raise self._fail(f"delete {path} from", e) from e


class MemoryObjects:
    """:class:`ObjectStorage` in a dict, for unit tests of the protocol."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.objects: dict[str, bytes] = {}

    def put(self, path: str, data: bytes) -> None:
        with self._lock:
            self.objects[path] = bytes(data)

    def get(self, path: str) -> bytes | None:
        with self._lock:
            return self.objects.get(path)

    def list(self, prefix: str) -> Iterator[ObjectEntry]:
        with self._lock:
            found = sorted((p, len(d)) for p, d in self.objects.items() if p.startswith(prefix))
        return iter([ObjectEntry(p, n) for p, n in found])

    def delete(self, path: str) -> None:
        with self._lock:
            self.objects.pop(path, None)
