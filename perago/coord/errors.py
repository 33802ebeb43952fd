"""The coordination errors, re-exported for the backends: they live in :mod:`perago.errors`.

``CoordStoreError`` (the backend failed) is a ``ServiceError`` like lakeFS's and Conductor's
errors; ``PredicateFailedError``, ``LeaseBusyError`` and ``LeaseExpiringError`` are
``CoordinationError`` (the store works and says no); ``LeaseLostError`` is an ``Interrupt``.
"""

from __future__ import annotations

from perago.errors import (
    CoordStoreError,
    LeaseBusyError,
    LeaseExpiringError,
    LeaseLostError,
    PredicateFailedError,
)

__all__ = [
    "CoordStoreError",
    "LeaseBusyError",
    "LeaseExpiringError",
    "LeaseLostError",
    "PredicateFailedError",
]
