"""Coordination store and leases: what guards the writes a lakeFS merge cannot guard.

Backends live in their own modules (``memory``, ``lakefs_objects``, ``s3``, ``dynamodb``,
``put_and_verify``) and are imported on demand; :func:`build_store` picks one by name.
"""

from __future__ import annotations

from perago.coord.errors import (
    CoordStoreError,
    LeaseBusyError,
    LeaseExpiringError,
    LeaseLostError,
    PredicateFailedError,
)
from perago.coord.factory import KINDS, build_store
from perago.coord.lease import LEASE_PREFIX, Grant, LeaseManager, LeaseRecord
from perago.coord.memory import MemoryStore
from perago.coord.store import ABSENT, CoordStore, Versioned, generation

__all__ = [
    "ABSENT",
    "KINDS",
    "LEASE_PREFIX",
    "CoordStore",
    "CoordStoreError",
    "Grant",
    "LeaseBusyError",
    "LeaseExpiringError",
    "LeaseLostError",
    "LeaseManager",
    "LeaseRecord",
    "MemoryStore",
    "PredicateFailedError",
    "Versioned",
    "build_store",
    "generation",
]
