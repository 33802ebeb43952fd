"""Leases with fencing tokens, on any :class:`~perago.coord.store.CoordStore`.

A lease ``name`` is the record ``leases/<name>``: JSON ``{owner, token, acquired_at, ttl,
renewed_at}`` (``owner`` empty once released). Every grant carries a token greater than every
earlier grant's: a grant is a conditional write over the version it replaces, and its token
is ``max(stored token, generation of that version) + 1``, i.e. the generation of the granting
write itself. Generations survive deletes (tombstones), so tokens keep rising even after the
janitor removed a record.

Staleness follows delta-rs's DynamoCommit: clocks are never compared across machines. A
taker must itself watch the *same version* of a record stay unchanged for ``ttl *
max_clock_skew_rate`` of its own clock, then take over with a conditional write on that
version, so of two takers at most one wins and a holder that renewed in time wins against
both. The holder counts its ``ttl`` from just before the write that granted or renewed it,
so its own clock says the lease is over before any taker's clock can (for clock rates that
differ by less than the skew rate); :meth:`LeaseManager.guarded` writes only inside that
window and re-reads the lease after each write.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, TypeVar

import structlog

from perago.coord.errors import (
    CoordStoreError,
    LeaseBusyError,
    LeaseExpiringError,
    LeaseLostError,
    PredicateFailedError,
)
from perago.coord.store import CoordStore, Versioned, check_key, generation

__all__ = ["LEASE_PREFIX", "Grant", "LeaseManager", "LeaseRecord"]

T = TypeVar("T")
LEASE_PREFIX = "leases/"
#: Marks the background releaser's thread (its own release must not wait for itself).
_releasing_thread = threading.local()
log = structlog.get_logger("perago.coord.lease")


@dataclass(frozen=True)
class Grant:
    """A held lease. ``expires_at`` is on the manager's clock; write only before it."""

    name: str
    owner: str
    token: int
    expires_at: float


@dataclass(frozen=True)
class LeaseRecord:
    """A lease as stored (``owner`` empty: released)."""

    name: str
    owner: str
    token: int
    acquired_at: float
    ttl: float
    renewed_at: float
    version: str

    @property
    def held(self) -> bool:
        return bool(self.owner)


class LeaseManager:
    """Acquire, renew, check and release leases; one per process is enough (thread-safe)."""

    def __init__(
        self,
        store: CoordStore,
        *,
        ttl: timedelta,
        max_clock_skew_rate: float = 1.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        safety_margin: timedelta | None = None,
    ) -> None:
        if ttl <= timedelta(0) or max_clock_skew_rate < 1:
            raise ValueError("a lease needs ttl > 0 and max_clock_skew_rate >= 1")
        self._store = store
        self._ttl = ttl.total_seconds()
        self._skew = max_clock_skew_rate
        self._clock = clock
        self._sleep = sleep
        self._margin = (safety_margin or ttl / 5).total_seconds()
        self._lock = threading.Lock()
        #: key -> (version, when this manager first saw that version)
        self._seen: dict[str, tuple[str, float]] = {}
        #: key -> the record this manager last wrote, if its write succeeded: the version
        #: a release or the next acquire expects (a compare-and-swap on it replaces a read)
        self._wrote: dict[str, Versioned] = {}
        #: key -> a release running in the background (:meth:`release_soon`); every read or
        #: write of that key by this manager waits for it first, so it is never overtaken
        self._releasing: dict[str, Future[None]] = {}
        self._releaser: ThreadPoolExecutor | None = None

    # -- granting ----------------------------------------------------------------------------

    def acquire(self, name: str, owner: str, *, wait: timedelta = timedelta(0)) -> Grant:
        """Take the lease if free or provably stale, waiting up to ``wait`` for that."""
        if not owner:
            raise ValueError("a lease owner must be a non-empty string")
        key = _key(name)
        self._settle(key)
        deadline = self._clock() + wait.total_seconds()
        # Our own release is the likely current version: try a swap on it before reading.
        # Only a released record is trusted this way (a held one must be watched); if
        # anything was written since, the swap fails and the loop reads as usual.
        guess = self._last_written(key, name, held=False)
        while True:
            current, guess = (guess, None) if guess is not None else (self._store.get(key), None)
            record = _parse(name, current)
            if record is not None and record.held and not self._stale(key, record):
                now = self._clock()
                if now >= deadline:
                    raise LeaseBusyError(
                        f"lease {name!r} is held by {record.owner!r} (token {record.token}); "
                        f"it can be taken over once its holder has been silent for "
                        f"{record.ttl * self._skew:.1f}s: retry later or acquire with wait=",
                        holder=record.owner,
                        token=record.token,
                    )
                self._sleep(min(self._poll(record.ttl), deadline - now))
                continue
            sent = self._clock()
            token = _next_token(current, record)
            expected = current.version if current else None
            body = _encode(owner, token or 0, self._ttl, None)
            try:
                version = self._set(key, body, expected)
            except PredicateFailedError:
                continue  # someone else moved first: look again
            if token is None:
                token = self._record_token(key, name, owner, version)
            with self._lock:
                self._seen.pop(key, None)
            log.info(
                "lease_acquired",
                lease=name,
                owner=owner,
                token=token,
                previous_owner=record.owner if record and record.held else None,
            )
            return Grant(name, owner, token, sent + self._ttl)

    def _record_token(self, key: str, name: str, owner: str, version: str) -> int:
        # A fresh (or deleted) record has no stored token to go on: the token is the
        # generation of the write that created it, recorded by a second write.
        token = generation(version) or 1
        try:
            self._set(key, _encode(owner, token, self._ttl, None), version)
        except PredicateFailedError as e:
            raise LeaseLostError(
                f"lease {name!r} changed right after {owner!r} acquired it; acquire again"
            ) from e
        return token

    def renew(self, grant: Grant) -> Grant:
        """Extend the lease by its ttl; LeaseLostError if someone else holds it now."""
        key = _key(grant.name)
        while True:
            current, record = self._ours(grant)
            sent = self._clock()
            body = _encode(grant.owner, grant.token, self._ttl, record.acquired_at)
            try:
                self._set(key, body, current.version)
            except PredicateFailedError:
                continue  # taken over (the re-read raises LeaseLostError) or renewed meanwhile
            return replace(grant, expires_at=sent + self._ttl)

    def holder(self, name: str) -> LeaseRecord | None:
        """The lease's record if someone holds it now (one read; no watch is started)."""
        self._settle(_key(name))
        record = _parse(name, self._store.get(_key(name)))
        return record if record is not None and record.held else None

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` on this manager's clock, the one staleness is judged on (a
        waiter polling with one-try acquires waits here between them)."""
        self._sleep(seconds)

    def time_left(self, grant: Grant) -> float:
        """Seconds of ``grant`` left on this manager's clock (negative once over)."""
        return grant.expires_at - self._clock()

    @property
    def store(self) -> CoordStore:
        """The store its records are kept in (the protocol's other records share it)."""
        return self._store

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def skew(self) -> float:
        """How much faster than a holder's clock a taker's may run."""
        return self._skew

    def check(self, grant: Grant) -> None:
        """Re-read the lease: LeaseLostError unless it is still ours with the same token."""
        self._ours(grant)

    def release_soon(self, grant: Grant, on_error: Callable[[Exception], None]) -> None:
        """:meth:`release` on a background thread, so the caller does not wait for it.

        The lease is free a write later than with :meth:`release`, never earlier, and this
        manager's next acquire, read or release of it waits for the release first. A release
        that fails goes to ``on_error`` (the lease then expires by itself, as when a holder
        dies). Releases still running when the interpreter exits are finished first.
        """
        key = _key(grant.name)
        run = contextvars.copy_context().run  # the caller's log context goes along

        def release() -> None:
            _releasing_thread.active = True
            try:
                run(self.release, grant)
            except Exception as e:  # noqa: BLE001 - reported to the caller's handler
                run(on_error, e)

        with self._lock:
            if self._releaser is None:
                self._releaser = ThreadPoolExecutor(1, thread_name_prefix="perago-lease-release")
            self._releasing[key] = self._releaser.submit(release)

    def release(self, grant: Grant) -> None:
        """Give the lease up (keeping its token for the next grant); no-op if already lost."""
        key = _key(grant.name)
        if not getattr(_releasing_thread, "active", False):
            self._settle(key)
        # The version this manager wrote for the grant is the expected one unless someone
        # took over: swap on it without a read first; the read path decides otherwise.
        current = self._last_written(key, grant.name, held=True)
        record = _parse(grant.name, current)
        if current is not None and record is not None and _same(record, grant):
            try:
                self._set(key, json.dumps(_released(record)).encode(), current.version)
            except PredicateFailedError:
                pass
            else:
                log.info("lease_released", lease=grant.name, owner=grant.owner, token=grant.token)
                return
        current = self._store.get(key)
        record = _parse(grant.name, current)
        if current is None or record is None or not _same(record, grant):
            return
        try:
            self._set(key, json.dumps(_released(record)).encode(), current.version)
        except PredicateFailedError:
            return  # taken over meanwhile: nothing of ours to release
        log.info("lease_released", lease=grant.name, owner=grant.owner, token=grant.token)

    def guarded(self, grant: Grant, write: Callable[[float], T]) -> T:
        """Run ``write(timeout_seconds)`` only while the lease surely lasts, then re-check it.

        The timeout handed to ``write`` ends ``safety_margin`` before the lease does; the
        caller must pass it on to the real I/O. LeaseExpiringError (renew first) if less than
        the margin is left; LeaseLostError if the lease is not ours before or after.
        """
        budget = grant.expires_at - self._clock() - self._margin
        if budget <= 0 or not self._granted_here(grant):
            # While the grant lasts on this manager's clock no taker can hold it (a taker
            # must watch our own write for ttl x skew first): the read is needed only to
            # tell a lost lease from an expiring one, or for a grant written elsewhere.
            self.check(grant)
        if budget <= 0:
            raise LeaseExpiringError(
                f"lease {grant.name!r} (token {grant.token}) has less than its safety margin "
                f"of {self._margin:.1f}s left: renew it before writing"
            )
        result = write(budget)
        self.check(grant)
        return result

    # -- the janitor -------------------------------------------------------------------------

    def records(self, prefix: str = "") -> list[LeaseRecord]:
        """Every lease whose name starts with ``prefix``, held or released."""
        found: list[LeaseRecord] = []
        for key, current in self._store.scan(LEASE_PREFIX + prefix):
            record = _parse(key[len(LEASE_PREFIX) :], current)
            if record is not None:
                found.append(record)
        return found

    def is_expired(self, record: LeaseRecord) -> bool:
        """Released, or watched by this manager unchanged for ``ttl * max_clock_skew_rate``.

        A manager must have seen a record unchanged for the takeover time to call it stale,
        so right after start-up only released leases count.
        """
        return not record.held or self._stale(_key(record.name), record)

    def expired(self, prefix: str = "") -> list[LeaseRecord]:
        """The leases :meth:`is_expired` calls expired."""
        return [r for r in self.records(prefix) if self.is_expired(r)]

    def remove(self, record: LeaseRecord) -> bool:
        """Delete ``record`` if it is still that very version (a renewal racing wins)."""
        try:
            self._store.delete_if(_key(record.name), record.version)
        except PredicateFailedError:
            return False
        log.info("lease_deleted", lease=record.name, owner=record.owner or None)
        return True

    def delete_expired(self, prefix: str = "") -> list[str]:
        """Delete what :meth:`expired` reports; their names."""
        return [r.name for r in self.expired(prefix) if self.remove(r)]

    # -- helpers -----------------------------------------------------------------------------

    def _set(self, key: str, body: bytes, expected: str | None) -> str:
        """A conditional write; remembers what was written only if it surely landed."""
        with self._lock:
            self._wrote.pop(key, None)
        version = self._store.set_if(key, body, expected)
        with self._lock:
            self._wrote[key] = Versioned(body, version)
        return version

    def _settle(self, key: str) -> None:
        """Wait for a background release of ``key`` (its outcome was already reported)."""
        with self._lock:
            pending = self._releasing.get(key)
        if pending is not None:
            pending.result()
            with self._lock:
                if self._releasing.get(key) is pending:
                    del self._releasing[key]

    def _granted_here(self, grant: Grant) -> bool:
        """Whether this manager's last write of the lease is ``grant``'s record."""
        record = _parse(grant.name, self._last_written(_key(grant.name), grant.name, held=True))
        return record is not None and _same(record, grant)

    def _last_written(self, key: str, name: str, *, held: bool) -> Versioned | None:
        with self._lock:
            last = self._wrote.get(key)
        record = _parse(name, last)
        if last is None or record is None or record.held != held:
            return None
        return last

    def _ours(self, grant: Grant) -> tuple[Versioned, LeaseRecord]:
        current = self._store.get(_key(grant.name))
        record = _parse(grant.name, current)
        if current is None or record is None or not _same(record, grant):
            holder = f"{record.owner!r} (token {record.token})" if record and record.held else None
            log.warning("lease_lost", lease=grant.name, owner=grant.owner, holder=holder)
            raise LeaseLostError(
                f"lease {grant.name!r} (token {grant.token}) is no longer held by "
                f"{grant.owner!r}; now held by {holder or 'nobody'}: stop writing"
            )
        return current, record

    def _stale(self, key: str, record: LeaseRecord) -> bool:
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen[0] != record.version:
                self._seen[key] = (record.version, now)
                return False
            return now - seen[1] >= record.ttl * self._skew

    def _poll(self, ttl: float) -> float:
        return max(0.05, min(1.0, ttl * self._skew / 10))


def _key(name: str) -> str:
    return check_key(LEASE_PREFIX + name)


def _same(record: LeaseRecord, grant: Grant) -> bool:
    return record.held and record.owner == grant.owner and record.token == grant.token


def _next_token(current: Versioned | None, record: LeaseRecord | None) -> int | None:
    if current is None or record is None:
        return None
    return max(record.token, generation(current.version) or 0) + 1


def _encode(owner: str, token: int, ttl: float, acquired_at: float | None) -> bytes:
    now = time.time()
    body: dict[str, Any] = {
        "owner": owner,
        "token": token,
        "acquired_at": now if acquired_at is None else acquired_at,
        "ttl": ttl,
        "renewed_at": now,
    }
    return json.dumps(body, sort_keys=True).encode()


def _released(record: LeaseRecord) -> dict[str, Any]:
    return {
        "owner": "",
        "token": record.token,
        "acquired_at": record.acquired_at,
        "ttl": record.ttl,
        "renewed_at": time.time(),
    }


def _parse(name: str, current: Versioned | None) -> LeaseRecord | None:
    if current is None:
        return None
    try:
        body = json.loads(current.value)
        return LeaseRecord(
            name=name,
            owner=str(body["owner"]),
            token=int(body["token"]),
            acquired_at=float(body["acquired_at"]),
            ttl=float(body["ttl"]),
            renewed_at=float(body.get("renewed_at", body["acquired_at"])),
            version=current.version,
        )
    except (ValueError, KeyError, TypeError) as e:
        raise CoordStoreError(
            f"lease record {LEASE_PREFIX}{name} is not a Perago lease ({e}); delete it by hand"
        ) from e
