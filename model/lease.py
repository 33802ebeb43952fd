"""The branch lease (perago/coord/lease.py) reduced to what decides who may write.

Abstract time: a grant ends only by an environment step (``expire``), which the explorer
may take between any two steps of the holder, i.e. while the holder is paused or dead. That
is the holder's clock guarantee: a taker's clock reaches ``ttl * skew`` only after the
holder's own clock said the lease is over. A guarded write is one atomic step that happens
only while the holder's clock says the lease lasts, so it cannot straddle a takeover.
"""

from __future__ import annotations

from model.state import Lease
from model.store import NO_REF

__all__ = ["acquire", "delete", "expire", "guard", "holds", "release", "renew"]


def acquire(lease: Lease, me: int) -> Lease | None:
    """Take the lease if free or expired (takeover); None while a live grant blocks it."""
    if lease.holder == NO_REF or (lease.holder != me and lease.expired):
        return Lease(me, False)
    return None


def holds(lease: Lease, me: int) -> bool:
    """``check``: the record still names this holder's grant (expired or not)."""
    return lease.holder == me


def renew(lease: Lease, me: int) -> Lease | None:
    """A full ttl again, or None (LeaseLostError) if someone took it over."""
    return lease._replace(expired=False) if lease.holder == me else None


def guard(lease: Lease, me: int) -> str:
    """Why a guarded write may not start now ("" if it may)."""
    if lease.holder != me:
        return "LeaseLostError"
    if lease.expired:
        return "LeaseExpiringError"
    return ""


def release(lease: Lease, me: int) -> Lease:
    """Give the lease up; a no-op if it was taken over meanwhile."""
    return Lease() if lease.holder == me else lease


def expire(lease: Lease) -> Lease | None:
    """The holder's time runs out (it is paused or dead); None if nothing can expire."""
    if lease.holder == NO_REF or lease.expired:
        return None
    return lease._replace(expired=True)


def delete(lease: Lease) -> Lease | None:
    """The janitor deletes a run-out record (``sweep_leases``); None unless one has run out.

    For a taker this is a takeover by nobody; for a reader (``BranchLeases.held``) the lease
    is free again, while its holder may still be paused: it can no longer renew or write.
    """
    return Lease() if lease.holder != NO_REF and lease.expired else None
