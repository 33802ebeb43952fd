"""The coordination store: a narrow key/value interface shaped like lakeFS's own KV design.

lakeFS cannot compare-and-swap a branch head, so the writes a merge cannot guard are
serialized through leases kept here. Every backend offers the same four calls, and the same
guarantees (each checked by ``tests/coord_contract.py``):

- read-after-write: a ``get`` that starts after a write finished sees that write or a later one;
- ``set_if`` / ``delete_if`` are atomic compare-and-swap operations on one key: of two writers
  holding the same version, at most one wins, the other gets :class:`PredicateFailedError`;
- versions start with a decimal *generation* that strictly increases with every successful
  write of a key, deletes included (a delete leaves a tombstone), so a version never repeats
  and a re-created key continues where it left off. Leases derive fencing tokens from it;
- ``scan`` lists live keys under a prefix in ascending key order.

There is no transaction across keys and no blind ``set``: every write states what it expects.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol

from perago.coord.errors import (
    CoordStoreError,
    LeaseBusyError,
    LeaseExpiringError,
    LeaseLostError,
    PredicateFailedError,
)

__all__ = [
    "ABSENT",
    "CoordStore",
    "CoordStoreError",
    "LeaseBusyError",
    "LeaseExpiringError",
    "LeaseLostError",
    "PredicateFailedError",
    "Versioned",
    "check_key",
    "check_prefix",
    "generation",
]

#: ``set_if(key, value, ABSENT)``: the key must not exist (or be deleted).
ABSENT: Final = None

_GENERATION = re.compile(r"^(\d+)(?::|$)")
_MAX_KEY = 512


@dataclass(frozen=True)
class Versioned:
    """A value and the opaque version to pass to the next conditional write."""

    value: bytes
    version: str


class CoordStore(Protocol):
    def get(self, key: str) -> Versioned | None:
        """The current value, or ``None`` when the key is absent or deleted."""
        ...

    def set_if(self, key: str, value: bytes, expected: str | None) -> str:
        """Write if the current version is ``expected`` (``None``: absent); the new version."""
        ...

    def delete_if(self, key: str, expected: str) -> None:
        """Delete if the current version is ``expected``; raises PredicateFailedError."""
        ...

    def scan(self, prefix: str) -> Iterator[tuple[str, Versioned]]:
        """Live keys starting with ``prefix``, in ascending key order."""
        ...


def generation(version: str) -> int | None:
    """The generation a version starts with (``None`` for a version that carries none)."""
    m = _GENERATION.match(version)
    return int(m.group(1)) if m else None


def check_key(key: str) -> str:
    """Keys are '/'-separated paths: non-empty segments, printable, at most 512 characters."""
    if (
        not key
        or len(key) > _MAX_KEY
        or key.startswith("/")
        or key.endswith("/")
        or "//" in key
        or not key.isprintable()
    ):
        raise ValueError(
            f"invalid coordination key {key!r}: use non-empty '/'-separated segments of "
            f"printable characters, at most {_MAX_KEY} characters"
        )
    return key


def check_prefix(prefix: str) -> str:
    """A scan prefix: empty, or a key prefix that does not start with '/'."""
    if prefix.startswith("/") or "//" in prefix or not prefix.isprintable():
        raise ValueError(f"invalid coordination scan prefix {prefix!r}")
    return prefix
