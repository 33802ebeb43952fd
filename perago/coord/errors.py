"""The coordination errors, re-exported for the backends: they live in :mod:`perago.errors`.

``CoordStoreError`` (the backend failed) is a ``ServiceError`` like lakeFS's and Conductor's
errors; ``PredicateFailedError`` and ``LeaseBusyError`` are ``CoordinationError`` (the store
works and says no); ``LeaseLostError`` and ``LeaseExpiringError`` are ``LeaseEndedError``
(an ``Interrupt``: the holder stops writing).
"""

from __future__ import annotations

from perago.errors import (
    CoordStoreError,
    LeaseBusyError,
    LeaseEndedError,
    LeaseExpiringError,
    LeaseLostError,
    PredicateFailedError,
)

__all__ = [
    "CoordStoreError",
    "LeaseBusyError",
    "LeaseEndedError",
    "LeaseExpiringError",
    "LeaseLostError",
    "PredicateFailedError",
]
