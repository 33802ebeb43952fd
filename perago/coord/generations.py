"""A key/value store on top of create-if-absent objects: each write is a new generation object.

Stores that can only *create* a path atomically (lakeFS: ``If-None-Match: *``; plain object
stores through put-and-verify) still give compare-and-swap: key ``k`` is the sequence of
objects ``<root>/k/g<20-digit generation>``, its value is the highest one, and writing over
version ``n`` means creating ``g<n+1>``, which only one writer can do. A delete is an empty
(tombstone) generation, so generations never restart.

Old generations are pruned, and pruning is the one hazard: a writer that listed ``g<n>`` as
the newest, stalled, and then created ``g<n+1>`` *after* a pruner deleted it would resurrect
a stale generation and believe it won. So a generation is deleted only once this process has
seen it exist for ``prune_grace`` (the newest ``keep`` are always kept), and a writer gives
up (PredicateFailedError) rather than send a create later than ``prune_grace / 2`` after its
listing began: a stale create then reaches the store before the prune, and fails.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from perago.coord.errors import CoordStoreError, PredicateFailedError
from perago.coord.store import Versioned, check_key, check_prefix

__all__ = ["GenerationLogStore", "ObjectEntry", "ObjectLog"]

_LIVE = b"v"
_GEN = re.compile(r"^(?P<key>.+)/g(?P<gen>\d{20})$")
_READ_RETRIES = 8


@dataclass(frozen=True)
class ObjectEntry:
    path: str
    size: int


class ObjectLog(Protocol):
    """The object primitives a generation log needs."""

    def list(self, prefix: str) -> Iterator[ObjectEntry]:
        """Objects under ``prefix`` in ascending path order."""
        ...

    def read(self, path: str) -> bytes | None:
        """The object's bytes, ``None`` if it does not exist."""
        ...

    def create(self, path: str, data: bytes, *, deadline: float) -> bool:
        """Create ``path`` unless it exists (False); never send the write after ``deadline``."""
        ...

    def delete(self, paths: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class _Gen:
    gen: int
    size: int
    path: str

    @property
    def live(self) -> bool:
        return self.size > 0


class GenerationLogStore:
    """A :class:`~perago.coord.store.CoordStore` over an :class:`ObjectLog`."""

    def __init__(
        self,
        objects: ObjectLog,
        root: str,
        *,
        keep: int = 8,
        prune_grace: timedelta = timedelta(minutes=10),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep < 1 or prune_grace <= timedelta(0):
            raise ValueError("a generation log needs keep >= 1 and prune_grace > 0")
        self._objects = objects
        self._root = root.strip("/")
        self._keep = keep
        self._grace = prune_grace.total_seconds()
        self._clock = clock
        self._lock = threading.Lock()
        #: key -> generation -> when this process first saw it (for pruning)
        self._seen: dict[str, dict[int, float]] = {}

    # -- paths -----------------------------------------------------------------------------

    def _dir(self, key: str) -> str:
        return f"{self._root}/{key}/" if self._root else f"{key}/"

    def _path(self, key: str, gen: int) -> str:
        return f"{self._dir(key)}g{gen:020d}"

    def _generations(self, key: str) -> list[_Gen]:
        base = self._dir(key)
        found: list[_Gen] = []
        for e in self._objects.list(base + "g"):
            tail = e.path[len(base) :]
            if len(tail) == 21 and tail[1:].isdigit():
                found.append(_Gen(int(tail[1:]), e.size, e.path))
        found.sort(key=lambda g: g.gen)
        self._observe(key, found)
        return found

    def _observe(self, key: str, gens: Sequence[_Gen], *, complete: bool = True) -> None:
        now = self._clock()
        with self._lock:
            seen = self._seen.setdefault(key, {})
            if complete and gens:
                for gone in [n for n in seen if n < gens[0].gen]:
                    del seen[gone]  # pruned by someone: forget it
            for g in gens:
                seen.setdefault(g.gen, now)

    # -- the interface ---------------------------------------------------------------------

    def get(self, key: str) -> Versioned | None:
        check_key(key)
        for _ in range(_READ_RETRIES):
            gens = self._generations(key)
            if not gens or not gens[-1].live:
                return None
            data = self._objects.read(gens[-1].path)
            if data is None:
                continue  # pruned between the listing and the read: list again
            return Versioned(_decode(data, gens[-1].path), str(gens[-1].gen))
        raise CoordStoreError(f"coordination key {key!r} kept changing while being read; try again")

    def set_if(self, key: str, value: bytes, expected: str | None) -> str:
        check_key(key)
        return str(self._write(key, _LIVE + value, expected))

    def delete_if(self, key: str, expected: str) -> None:
        check_key(key)
        self._write(key, b"", expected)

    def scan(self, prefix: str) -> Iterator[tuple[str, Versioned]]:
        check_prefix(prefix)
        base = f"{self._root}/" if self._root else ""
        newest: dict[str, _Gen] = {}
        for e in self._objects.list(base + prefix):
            m = _GEN.match(e.path[len(base) :])
            if not m:
                continue  # put-and-verify intention files, foreign objects
            g = _Gen(int(m.group("gen")), e.size, e.path)
            k = m.group("key")
            if k not in newest or newest[k].gen < g.gen:
                newest[k] = g
        for k in sorted(newest):
            g = newest[k]
            if not g.live:
                continue
            data = self._objects.read(g.path)
            if data is not None:
                yield k, Versioned(_decode(data, g.path), str(g.gen))
                continue
            current = self.get(k)  # pruned meanwhile: the key moved on
            if current is not None:
                yield k, current

    # -- writing ---------------------------------------------------------------------------

    def _write(self, key: str, data: bytes, expected: str | None) -> int:
        started = self._clock()
        gens = self._generations(key)
        latest = gens[-1] if gens else None
        current = latest.gen if latest and latest.live else None
        if expected is None:
            if current is not None:
                raise PredicateFailedError(_failed(key, expected, current))
        elif current is None or expected != str(current):
            raise PredicateFailedError(_failed(key, expected, current))
        new = latest.gen + 1 if latest else 1
        if not self._objects.create(self._path(key, new), data, deadline=started + self._grace / 2):
            raise PredicateFailedError(
                f"coordination key {key!r} changed after version {expected or 'absent'} was "
                "read (another writer won): re-read it and decide again"
            )
        self._prune(key, [*gens, _Gen(new, len(data), self._path(key, new))])
        return new

    def _prune(self, key: str, gens: list[_Gen]) -> None:
        """Delete the oldest generations once they are older than the grace (see above)."""
        if len(gens) < 2 * self._keep:
            return
        self._observe(key, gens[-1:], complete=False)
        now = self._clock()
        with self._lock:
            seen = dict(self._seen.get(key, {}))
        doomed: list[_Gen] = []
        for g in gens[: -self._keep]:
            first = seen.get(g.gen)
            if first is None or now - first < self._grace:
                break
            doomed.append(g)
        if not doomed:
            return
        self._objects.delete([g.path for g in doomed])
        with self._lock:
            remaining = self._seen.get(key, {})
            for g in doomed:
                remaining.pop(g.gen, None)


def _decode(data: bytes, path: str) -> bytes:
    if not data.startswith(_LIVE):
        raise CoordStoreError(
            f"coordination object {path} is not a Perago generation: was it written by "
            "something else? Keep other writers out of the coordination root"
        )
    return data[1:]


def _failed(key: str, expected: str | None, current: int | None) -> str:
    want = "absent" if expected is None else f"version {expected}"
    have = "absent" if current is None else f"version {current}"
    return f"coordination key {key!r} is {have}, not {want}: re-read it and decide again"
