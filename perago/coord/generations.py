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

Listing is the expensive part (a lakeFS listing, then a read of the newest). So the store
remembers, per key, the generations it last listed, read or wrote and *when* that was true:
"at time ``t`` nothing newer than ``g<n>`` existed". Generations are created in order, so
while that knowledge is younger than ``prune_grace / 2``, ``g<n+1>`` cannot have been
created *and* pruned since ``t``: a read of ``g<n+1>`` that finds nothing proves ``g<n>``
still newest (one call instead of list + read), and a write creates ``g<n+1>`` directly
(create-if-absent is the compare-and-swap; the same deadline as after a listing applies).
Older knowledge is dropped and the key listed again.
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
#: Reads of the next generations before a cached key is listed again instead.
_PROBES = 3


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


@dataclass(frozen=True)
class _Known:
    """What was true of a key at ``at``: its generations, newest last, and the newest's value."""

    gens: tuple[_Gen, ...]
    value: bytes | None  # the newest's value; None: no generation or a tombstone
    at: float

    @property
    def newest(self) -> int:
        return self.gens[-1].gen if self.gens else 0

    def current(self) -> Versioned | None:
        if not self.gens or self.value is None:
            return None
        return Versioned(self.value, str(self.newest))


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
        #: key -> what was true of it lately (see the module docstring)
        self._known: dict[str, _Known] = {}

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
        known = self._fresh(key)
        if known is not None:
            probed = self._probe(key, known)
            if probed is not None:
                return probed.current()
        return self._read_listed(key).current()

    def _read_listed(self, key: str) -> _Known:
        for _ in range(_READ_RETRIES):
            started = self._clock()
            gens = self._generations(key)
            value: bytes | None = None
            if gens and gens[-1].live:
                data = self._objects.read(gens[-1].path)
                if data is None:
                    continue  # pruned between the listing and the read: list again
                value = _decode(data, gens[-1].path)
            return self._remember(key, _Known(tuple(gens), value, started))
        raise CoordStoreError(f"coordination key {key!r} kept changing while being read; try again")

    # -- what this process knows of a key ---------------------------------------------------

    def _fresh(self, key: str) -> _Known | None:
        with self._lock:
            known = self._known.get(key)
        if known is None or self._clock() - known.at >= self._grace / 2:
            return None
        return known

    def _remember(self, key: str, known: _Known) -> _Known:
        with self._lock:
            self._known[key] = known
        return known

    def _forget(self, key: str) -> None:
        with self._lock:
            self._known.pop(key, None)

    def _probe(self, key: str, known: _Known) -> _Known | None:
        """Read the generations after the known newest until one is missing (None: too many).

        Only called while ``known`` is fresh: then a missing ``g<n+1>`` was never created
        (see the module docstring), so what is read is the key's value now.
        """
        gens = list(known.gens)
        value = known.value
        for _ in range(_PROBES):
            started = self._clock()
            path = self._path(key, (gens[-1].gen if gens else 0) + 1)
            data = self._objects.read(path)
            if data is None:
                self._observe(key, gens, complete=False)
                return self._remember(key, _Known(tuple(gens), value, started))
            gens.append(_Gen(int(path[-20:]), len(data), path))
            value = _decode(data, path) if data else None
        return None

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
        known = self._fresh(key)
        if known is None or not _matches(known, expected):
            known = self._listed(key)  # cold, or the cache disagrees: decide on a listing
        gens = list(known.gens)
        latest = gens[-1] if gens else None
        current = latest.gen if latest and latest.live else None
        if expected is None:
            if current is not None:
                raise PredicateFailedError(_failed(key, expected, current))
        elif current is None or expected != str(current):
            raise PredicateFailedError(_failed(key, expected, current))
        new = latest.gen + 1 if latest else 1
        sent = self._clock()
        try:
            created = self._objects.create(
                self._path(key, new), data, deadline=known.at + self._grace / 2
            )
        except BaseException:
            self._forget(key)  # the outcome is unknown
            raise
        if not created:
            self._forget(key)
            raise PredicateFailedError(
                f"coordination key {key!r} changed after version {expected or 'absent'} was "
                "read (another writer won): re-read it and decide again"
            )
        gens.append(_Gen(new, len(data), self._path(key, new)))
        self._observe(key, gens[-1:], complete=False)
        # Everything newer than ``new`` was created after this create was sent.
        value = _decode(data, gens[-1].path) if data else None
        self._remember(key, _Known(tuple(self._prune(key, gens)), value, sent))
        return new

    def _listed(self, key: str) -> _Known:
        """The key's generations from a listing; remembered only if the newest's value is known."""
        started = self._clock()
        gens = tuple(self._generations(key))
        with self._lock:
            before = self._known.get(key)
        if gens and gens[-1].live:
            if before is None or before.newest != gens[-1].gen:
                self._forget(key)  # writes decide on versions; the next get reads the value
                return _Known(gens, None, started)
            return self._remember(key, _Known(gens, before.value, started))
        return self._remember(key, _Known(gens, None, started))

    def _prune(self, key: str, gens: list[_Gen]) -> list[_Gen]:
        """Delete the oldest generations once older than the grace (see above); the rest."""
        if len(gens) < 2 * self._keep:
            return gens
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
            return gens
        self._objects.delete([g.path for g in doomed])
        with self._lock:
            remaining = self._seen.get(key, {})
            for g in doomed:
                remaining.pop(g.gen, None)
        return gens[len(doomed) :]


def _matches(known: _Known, expected: str | None) -> bool:
    current = known.current()
    return (
        (current is None)
        if expected is None
        else (current is not None and current.version == expected)
    )


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
