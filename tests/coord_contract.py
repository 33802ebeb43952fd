"""The coordination-store contract: one suite, run unchanged against every backend.

A backend's test class inherits :class:`CoordContract` and provides the ``coord`` fixture (a
fresh, empty store per test). ``clock`` and ``lease_ttl`` default to the real clock and a 1 s
lease; in-process backends override them with a fake clock so the lease tests take no time.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from perago.coord import (
    CoordStore,
    LeaseBusyError,
    LeaseExpiringError,
    LeaseLostError,
    LeaseManager,
    PredicateFailedError,
    Versioned,
    generation,
)

SKEW = 1.5


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class FakeClock:
    """Time that moves only when someone sleeps; thread-safe."""

    def __init__(self) -> None:
        self._t = 1000.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self._t += max(0.0, seconds)


Clock = RealClock | FakeClock


class CoordContract:
    """Everything Perago relies on from a coordination store and the leases on top of it."""

    @pytest.fixture
    def coord(self) -> Iterator[CoordStore]:
        raise NotImplementedError("a backend's test class provides the coord fixture")

    @pytest.fixture
    def clock(self) -> Clock:
        return RealClock()

    @pytest.fixture
    def lease_ttl(self) -> timedelta:
        return timedelta(seconds=1)

    def manager(self, coord: CoordStore, clock: Clock, ttl: timedelta) -> LeaseManager:
        return LeaseManager(
            coord, ttl=ttl, max_clock_skew_rate=SKEW, clock=clock.now, sleep=clock.sleep
        )

    # -- the store -------------------------------------------------------------------------

    def test_get_of_missing_key_is_none(self, coord: CoordStore) -> None:
        assert coord.get("missing/key") is None

    def test_create_if_absent_succeeds_once(self, coord: CoordStore) -> None:
        v1 = coord.set_if("c/k", b"first", None)
        assert coord.get("c/k") == Versioned(b"first", v1)
        with pytest.raises(PredicateFailedError):
            coord.set_if("c/k", b"second", None)
        assert coord.get("c/k") == Versioned(b"first", v1)

    def test_compare_and_swap(self, coord: CoordStore) -> None:
        v1 = coord.set_if("cas", b"1", None)
        v2 = coord.set_if("cas", b"2", v1)
        assert v2 != v1
        with pytest.raises(PredicateFailedError):
            coord.set_if("cas", b"3", v1)  # stale version
        assert coord.get("cas") == Versioned(b"2", v2)
        # the same value again still makes a new, distinct version (no ABA)
        v3 = coord.set_if("cas", b"1", v2)
        assert v3 not in (v1, v2)
        with pytest.raises(PredicateFailedError):
            coord.set_if("cas", b"x", v1)

    def test_set_if_with_a_version_on_a_missing_key_fails(self, coord: CoordStore) -> None:
        other = coord.set_if("other", b"o", None)
        with pytest.raises(PredicateFailedError):
            coord.set_if("missing", b"x", other)
        assert coord.get("missing") is None

    def test_delete_if(self, coord: CoordStore) -> None:
        v1 = coord.set_if("d", b"x", None)
        v2 = coord.set_if("d", b"y", v1)
        with pytest.raises(PredicateFailedError):
            coord.delete_if("d", v1)  # stale
        assert coord.get("d") == Versioned(b"y", v2)
        coord.delete_if("d", v2)
        assert coord.get("d") is None
        with pytest.raises(PredicateFailedError):
            coord.delete_if("d", v2)  # gone already
        with pytest.raises(PredicateFailedError):
            coord.set_if("d", b"z", v2)  # a deleted key is absent
        v3 = coord.set_if("d", b"again", None)
        assert coord.get("d") == Versioned(b"again", v3)

    def test_generations_strictly_increase_even_across_deletes(self, coord: CoordStore) -> None:
        gens = []
        v = coord.set_if("g", b"a", None)
        gens.append(generation(v))
        v = coord.set_if("g", b"b", v)
        gens.append(generation(v))
        coord.delete_if("g", v)
        v = coord.set_if("g", b"c", None)
        gens.append(generation(v))
        assert None not in gens
        assert gens == sorted(set(gens)), gens

    def test_scan_is_sorted_and_prefix_isolated(self, coord: CoordStore) -> None:
        for key in ("s/b", "s/a", "s/a/x", "s/a-b", "t/a", "sx", "s/gone"):
            coord.set_if(key, key.encode(), None)
        gone = coord.get("s/gone")
        assert gone is not None
        coord.delete_if("s/gone", gone.version)
        found = list(coord.scan("s/"))
        assert [k for k, _ in found] == ["s/a", "s/a-b", "s/a/x", "s/b"]
        assert all(v.value == k.encode() for k, v in found)
        assert all(coord.get(k) == v for k, v in found)
        assert [k for k, _ in coord.scan("s/a")] == ["s/a", "s/a-b", "s/a/x"]
        assert list(coord.scan("nothing/")) == []

    def test_values_are_bytes_including_empty(self, coord: CoordStore) -> None:
        v = coord.set_if("bin", bytes(range(256)), None)
        assert coord.get("bin") == Versioned(bytes(range(256)), v)
        v = coord.set_if("bin", b"", v)
        assert coord.get("bin") == Versioned(b"", v)

    def test_racing_increments_lose_nothing(self, coord: CoordStore) -> None:
        coord.set_if("counter", b"0", None)

        def increment() -> int:
            rejected = 0
            for _ in range(50):
                while True:
                    current = coord.get("counter")
                    assert current is not None
                    try:
                        coord.set_if(
                            "counter", str(int(current.value) + 1).encode(), current.version
                        )
                        break
                    except PredicateFailedError:
                        rejected += 1
            return rejected

        with ThreadPoolExecutor(2) as pool:
            rejected = [f.result() for f in [pool.submit(increment) for _ in range(2)]]
        final = coord.get("counter")
        assert final is not None and final.value == b"100"
        print(f"racing increments: {sum(rejected)} writes rejected")

    # -- leases ----------------------------------------------------------------------------

    def test_lease_is_exclusive_while_held(
        self, coord: CoordStore, clock: Clock, lease_ttl: timedelta
    ) -> None:
        a, b = self.manager(coord, clock, lease_ttl), self.manager(coord, clock, lease_ttl)
        grant = a.acquire("repo/main", "worker-a")
        assert grant.token >= 1 and grant.owner == "worker-a"
        with pytest.raises(LeaseBusyError) as busy:
            b.acquire("repo/main", "worker-b")
        assert busy.value.holder == "worker-a" and busy.value.token == grant.token
        with pytest.raises(LeaseBusyError):
            a.acquire("repo/main", "worker-c")
        a.check(grant)
        other = b.acquire("repo/other", "worker-b")  # leases are per name
        assert other.owner == "worker-b"

    def test_takeover_only_after_ttl_times_skew(
        self, coord: CoordStore, clock: Clock, lease_ttl: timedelta
    ) -> None:
        a, b = self.manager(coord, clock, lease_ttl), self.manager(coord, clock, lease_ttl)
        first = a.acquire("l", "a")
        stale_after = lease_ttl.total_seconds() * SKEW
        with pytest.raises(LeaseBusyError):
            b.acquire("l", "b")  # b starts watching the record
        clock.sleep(stale_after * 0.6)
        with pytest.raises(LeaseBusyError):
            b.acquire("l", "b")
        clock.sleep(stale_after * 0.5)
        second = b.acquire("l", "b")
        assert second.token > first.token

    def test_renewal_keeps_the_lease_and_its_token(
        self, coord: CoordStore, clock: Clock, lease_ttl: timedelta
    ) -> None:
        a, b = self.manager(coord, clock, lease_ttl), self.manager(coord, clock, lease_ttl)
        grant = a.acquire("r", "a")
        with pytest.raises(LeaseBusyError):
            b.acquire("r", "b")
        clock.sleep(lease_ttl.total_seconds() * 0.6)
        renewed = a.renew(grant)
        assert renewed.token == grant.token and renewed.expires_at > grant.expires_at
        clock.sleep(lease_ttl.total_seconds())  # b has now watched for more than ttl * skew
        with pytest.raises(LeaseBusyError):
            b.acquire("r", "b")  # the renewal is a new version: b watches from scratch
        a.check(renewed)

    def test_acquire_waits_for_a_silent_holder(
        self, coord: CoordStore, clock: Clock, lease_ttl: timedelta
    ) -> None:
        a, b = self.manager(coord, clock, lease_ttl), self.manager(coord, clock, lease_ttl)
        first = a.acquire("w", "a")
        started = clock.now()
        second = b.acquire("w", "b", wait=lease_ttl * SKEW * 3)
        assert clock.now() - started >= lease_ttl.total_seconds() * SKEW
        assert second.token > first.token

    def test_tokens_strictly_increase_across_all_grants(
        self, coord: CoordStore, clock: Clock, lease_ttl: timedelta
    ) -> None:
        a, b = self.manager(coord, clock, lease_ttl), self.manager(coord, clock, lease_ttl)
        stale_after = lease_ttl.total_seconds() * SKEW
        tokens = []
        g = a.acquire("t", "a")
        tokens.append(g.token)
        a.release(g)
        g = b.acquire("t", "b")  # released: free at once
        tokens.append(g.token)
        g = b.renew(g)
        with pytest.raises(LeaseBusyError):
            a.acquire("t", "a")
        clock.sleep(stale_after + 0.05)
        g = a.acquire("t", "a")  # takeover of a silent holder
        tokens.append(g.token)
        a.release(g)
        assert [r.name for r in b.expired()] == ["t"]
        assert b.delete_expired() == ["t"]
        assert coord.get("leases/t") is None
        g = b.acquire("t", "b")  # after the janitor deleted the record
        tokens.append(g.token)
        assert tokens == sorted(set(tokens)), tokens

    def test_paused_holder_loses_the_lease(
        self, coord: CoordStore, clock: Clock, lease_ttl: timedelta
    ) -> None:
        a, b = self.manager(coord, clock, lease_ttl), self.manager(coord, clock, lease_ttl)
        paused = a.acquire("p", "a")
        with pytest.raises(LeaseBusyError):
            b.acquire("p", "b")
        clock.sleep(lease_ttl.total_seconds() * SKEW + 0.05)  # a is "paused" all this time
        winner = b.acquire("p", "b")
        with pytest.raises(LeaseLostError):
            a.check(paused)
        with pytest.raises(LeaseLostError):
            a.renew(paused)
        written: list[float] = []
        with pytest.raises(LeaseLostError):
            a.guarded(paused, written.append)
        assert written == []
        a.release(paused)  # a no-op: it is not a's any more
        b.check(winner)
        assert issubclass(LeaseLostError, BaseException)
        assert not issubclass(LeaseLostError, Exception)

    def test_guarded_caps_writes_by_the_time_left(
        self, coord: CoordStore, clock: Clock, lease_ttl: timedelta
    ) -> None:
        m = self.manager(coord, clock, lease_ttl)
        grant = m.acquire("gw", "a")
        budgets: list[float] = []
        assert m.guarded(grant, lambda timeout: budgets.append(timeout) or "done") == "done"
        assert 0 < budgets[0] < lease_ttl.total_seconds() * 0.8 + 1e-6
        clock.sleep(lease_ttl.total_seconds() * 0.9)  # less than the margin (ttl/5) is left
        with pytest.raises(LeaseExpiringError):
            m.guarded(grant, budgets.append)
        assert len(budgets) == 1
        renewed = m.renew(grant)
        m.guarded(renewed, budgets.append)
        assert len(budgets) == 2

    def test_janitor_sees_released_at_once_and_held_only_when_stale(
        self, coord: CoordStore, clock: Clock, lease_ttl: timedelta
    ) -> None:
        a, janitor = self.manager(coord, clock, lease_ttl), self.manager(coord, clock, lease_ttl)
        a.acquire("j/held", "a")
        a.release(a.acquire("j/released", "a"))
        a.acquire("other/held", "a")
        assert [r.name for r in janitor.expired("j/")] == ["j/released"]
        clock.sleep(lease_ttl.total_seconds() * SKEW + 0.05)
        assert [r.name for r in janitor.expired("j/")] == ["j/held", "j/released"]
        assert janitor.delete_expired("j/") == ["j/held", "j/released"]
        assert [k for k, _ in coord.scan("leases/")] == ["leases/other/held"]
        fresh = janitor.acquire("j/held", "b")
        assert fresh.owner == "b"


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
