"""Errors of the coordination store and its leases.

::

    PeragoError
    ├── PredicateFailedError        a conditional write lost: the key changed (or never existed)
    ├── StoreError
    │   └── CoordStoreError         the coordination backend answered with an error
    ├── LeaseBusyError              someone else holds the lease and it is not stale yet
    └── LeaseExpiringError          too little lease time left to start a guarded write

    Interrupt (BaseException)
    └── LeaseLostError              the lease now belongs to someone else: stop writing
"""

from __future__ import annotations

from perago.errors import Interrupt, PeragoError, StoreError

__all__ = [
    "CoordStoreError",
    "LeaseBusyError",
    "LeaseExpiringError",
    "LeaseLostError",
    "PredicateFailedError",
]


class PredicateFailedError(PeragoError):
    """The expected version is no longer current: re-read and decide again."""


class CoordStoreError(StoreError):
    """The coordination backend failed; the outcome of a write may be unknown."""


class LeaseBusyError(PeragoError):
    """The lease is held by a live (or not yet provably stale) holder."""

    def __init__(self, message: str, *, holder: str, token: int) -> None:
        super().__init__(message)
        self.holder = holder
        self.token = token


class LeaseExpiringError(PeragoError):
    """Too little of the lease is left to start a write safely; renew it first."""


class LeaseLostError(Interrupt):
    """Another owner holds the lease now; derives from BaseException so no body swallows it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
