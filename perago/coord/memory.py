"""An in-process coordination store for unit tests: a dict and a lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from perago.coord.errors import PredicateFailedError
from perago.coord.store import Versioned, check_key, check_prefix

__all__ = ["MemoryStore"]


class MemoryStore:
    """Linearizable by construction; tombstones keep each key's generation after a delete."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: key -> (generation, value); value None is a tombstone
        self._data: dict[str, tuple[int, bytes | None]] = {}

    def get(self, key: str) -> Versioned | None:
        check_key(key)
        with self._lock:
            gen, value = self._data.get(key, (0, None))
        return None if value is None else Versioned(value, str(gen))

    def set_if(self, key: str, value: bytes, expected: str | None) -> str:
        check_key(key)
        with self._lock:
            gen, current = self._data.get(key, (0, None))
            live = current is not None
            if (expected is None and live) or (
                expected is not None and (not live or expected != str(gen))
            ):
                raise PredicateFailedError(_failed(key, expected, gen if live else None))
            self._data[key] = (gen + 1, bytes(value))
            return str(gen + 1)

    def delete_if(self, key: str, expected: str) -> None:
        check_key(key)
        with self._lock:
            gen, current = self._data.get(key, (0, None))
            if current is None or expected != str(gen):
                live = gen if current is not None else None
                raise PredicateFailedError(_failed(key, expected, live))
            self._data[key] = (gen + 1, None)

    def scan(self, prefix: str) -> Iterator[tuple[str, Versioned]]:
        check_prefix(prefix)
        with self._lock:
            found = [
                (k, Versioned(v, str(g)))
                for k, (g, v) in self._data.items()
                if k.startswith(prefix) and v is not None
            ]
        yield from sorted(found, key=lambda kv: kv[0])


def _failed(key: str, expected: str | None, current: int | None) -> str:
    want = "absent" if expected is None else f"version {expected}"
    have = "absent" if current is None else f"version {current}"
    return f"coordination key {key!r} is {have}, not {want}: re-read it and decide again"
