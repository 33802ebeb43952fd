"""The coordination contract on in-process stores, and the parts only unit tests can reach."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta

import pytest

from perago.coord import (
    KINDS,
    CoordStore,
    MemoryStore,
    PredicateFailedError,
    Versioned,
    build_store,
    generation,
)
from perago.coord.generations import GenerationLogStore, ObjectEntry
from perago.coord.put_and_verify import (
    INTENT,
    MemoryObjects,
    PutAndVerify,
    PutAndVerifyStore,
    RWLock,
    TargetExistsError,
)
from perago.coord.store import check_key
from perago.errors import ConfigError
from tests.coord_contract import Clock, CoordContract, FakeClock


class TestMemoryStore(CoordContract):
    @pytest.fixture
    def coord(self) -> Iterator[CoordStore]:
        yield MemoryStore()

    @pytest.fixture
    def clock(self) -> Clock:
        return FakeClock()

    @pytest.fixture
    def lease_ttl(self) -> timedelta:
        return timedelta(seconds=30)


class TestPutAndVerifyOnMemoryObjects(CoordContract):
    """The generation log and the exclusive-write protocol, without a server."""

    @pytest.fixture
    def coord(self) -> Iterator[CoordStore]:
        yield PutAndVerifyStore(MemoryObjects(), root="coord")

    @pytest.fixture
    def clock(self) -> Clock:
        return FakeClock()

    @pytest.fixture
    def lease_ttl(self) -> timedelta:
        return timedelta(seconds=30)


# -- generation log -------------------------------------------------------------------------


def test_generation_objects_layout_and_tombstones() -> None:
    objects = MemoryObjects()
    store = PutAndVerifyStore(objects, root="r")
    v1 = store.set_if("a/b", b"x", None)
    store.delete_if("a/b", v1)
    assert sorted(objects.objects) == [f"r/a/b/g{1:020d}", f"r/a/b/g{2:020d}"]
    assert objects.objects[f"r/a/b/g{1:020d}"] == b"vx"
    assert objects.objects[f"r/a/b/g{2:020d}"] == b""  # a tombstone is empty
    assert store.get("a/b") is None
    assert store.set_if("a/b", b"y", None) == "3"


def test_pruning_waits_for_the_grace_and_keeps_the_newest() -> None:
    objects = MemoryObjects()
    clock = FakeClock()
    store = PutAndVerifyStore(
        objects, root="r", keep=4, prune_grace=timedelta(seconds=60), clock=clock.now
    )
    v = store.set_if("k", b"0", None)
    for i in range(1, 20):
        v = store.set_if("k", str(i).encode(), v)
    assert len(objects.objects) == 20  # nothing is old enough yet
    clock.sleep(61)
    v = store.set_if("k", b"20", v)
    gens = sorted(int(p.rsplit("/g", 1)[1]) for p in objects.objects)
    assert gens == [18, 19, 20, 21]  # old enough ones pruned, the newest `keep` kept
    assert store.get("k") == Versioned(b"20", v)


def test_a_stalled_writer_gives_up_instead_of_resurrecting_a_pruned_generation() -> None:
    objects = MemoryObjects()
    clock = FakeClock()

    class Stalling(PutAndVerify):
        def list(self, prefix: str):  # type: ignore[no-untyped-def]
            entries = list(super().list(prefix))
            clock.sleep(stall)
            return iter(entries)

    stall = 0.0
    engine = Stalling(objects, clock=clock.now)
    log = GenerationLogStore(
        engine, "r", keep=1, prune_grace=timedelta(seconds=60), clock=clock.now
    )
    v = log.set_if("k", b"0", None)
    # Another process (nothing cached) lists, and stalls more than half the grace before
    # creating.
    other = GenerationLogStore(
        engine, "r", keep=1, prune_grace=timedelta(seconds=60), clock=clock.now
    )
    stall = 31.0
    with pytest.raises(PredicateFailedError, match="too long"):
        other.set_if("k", b"1", v)
    assert log.get("k") is not None


class CountingLog:
    """An :class:`ObjectLog` with atomic create-if-absent (like lakeFS), counting requests."""

    def __init__(self) -> None:
        self.objects = MemoryObjects()
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def list(self, prefix: str) -> Iterator[ObjectEntry]:
        self.calls.append("list")
        return self.objects.list(prefix)

    def read(self, path: str) -> bytes | None:
        self.calls.append("read")
        return self.objects.get(path)

    def create(self, path: str, data: bytes, *, deadline: float) -> bool:
        self.calls.append("create")
        with self._lock:
            if self.objects.get(path) is not None:
                return False
            self.objects.put(path, data)
            return True

    def delete(self, paths: Sequence[str]) -> None:
        for p in paths:
            self.objects.delete(p)


def test_a_known_key_is_read_with_one_probe_and_written_without_a_listing() -> None:
    objects = CountingLog()
    clock = FakeClock()
    log = GenerationLogStore(objects, "r", prune_grace=timedelta(seconds=60), clock=clock.now)
    other = GenerationLogStore(objects, "r", clock=clock.now)
    v1 = log.set_if("k", b"a", None)
    objects.calls.clear()
    assert log.get("k") == Versioned(b"a", v1)
    assert objects.calls == ["read"]  # g2 is absent: g1 (known) is the value
    objects.calls.clear()
    v2 = log.set_if("k", b"b", v1)
    assert objects.calls == ["create"]
    # A write by someone else is seen by the next read (read-after-write), and a write on
    # the stale version fails.
    v3 = other.set_if("k", b"c", v2)
    assert log.get("k") == Versioned(b"c", v3)
    with pytest.raises(PredicateFailedError):
        log.set_if("k", b"x", v2)
    v4 = other.set_if("k", b"d", v3)
    with pytest.raises(PredicateFailedError):
        log.set_if("k", b"y", v3)  # the cache says v3: the create of g4 fails
    assert log.get("k") == Versioned(b"d", v4)
    # Knowledge older than half the grace is never trusted: the key is listed again.
    clock.sleep(31)
    objects.calls.clear()
    assert log.get("k") == Versioned(b"d", v4)
    assert objects.calls[0] == "list"


def test_scan_ignores_intention_files_and_foreign_objects() -> None:
    objects = MemoryObjects()
    store = PutAndVerifyStore(objects, root="r")
    store.set_if("a", b"1", None)
    objects.put(f"r/a/g{2:020d}{INTENT}deadbeef", b"")
    objects.put("r/a/README", b"not a generation")
    assert [k for k, _ in store.scan("")] == ["a"]
    assert store.get("a") == Versioned(b"1", "1")


# -- put-and-verify -------------------------------------------------------------------------


def test_exclusive_write_once_and_intentions_cleaned_up() -> None:
    objects = MemoryObjects()
    engine = PutAndVerify(objects)
    engine.exclusive_write("lock", b"mine")
    with pytest.raises(TargetExistsError):
        engine.exclusive_write("lock", b"yours")
    assert objects.objects == {"lock": b"mine"}


def test_a_live_intention_makes_writers_back_off_then_give_up() -> None:
    objects = MemoryObjects()
    clock = FakeClock()
    engine = PutAndVerify(objects, attempts=3, clock=clock.now, sleep=lambda s: None)
    objects.put(f"t{INTENT}other", b"")
    with pytest.raises(PredicateFailedError, match="busy"):
        engine.exclusive_write("t", b"x")
    assert "t" not in objects.objects
    assert f"t{INTENT}other" in objects.objects


def test_an_intention_seen_for_too_long_is_removed() -> None:
    objects = MemoryObjects()
    clock = FakeClock()
    engine = PutAndVerify(
        objects, stale_intent_after=timedelta(seconds=2), clock=clock.now, sleep=clock.sleep
    )
    objects.put(f"t{INTENT}dead", b"")
    with pytest.raises(PredicateFailedError):
        PutAndVerify(objects, attempts=1, clock=clock.now, sleep=clock.sleep).exclusive_write(
            "t", b"x"
        )
    engine.exclusive_write("t", b"x")  # its backoff sleeps past the staleness of "dead"
    assert objects.objects == {"t": b"x"}


def test_rw_lock_many_readers_or_one_writer() -> None:
    objects = MemoryObjects()
    engine = PutAndVerify(objects, attempts=2, sleep=lambda s: None)
    lock = RWLock(engine, "backup/archive")
    r1 = lock.try_lock_read()
    r2 = lock.try_lock_read()
    with pytest.raises(PredicateFailedError):
        lock.try_lock_write()
    lock.unlock(r1)
    with pytest.raises(PredicateFailedError):
        lock.try_lock_write()
    lock.unlock(r2)
    w = lock.try_lock_write()
    assert w == "backup/archive.WRIT"
    with pytest.raises(PredicateFailedError):
        lock.try_lock_read()
    with pytest.raises(PredicateFailedError):
        lock.try_lock_write()
    # a neighbour whose name extends ours is not a conflict
    RWLock(engine, "backup/archive-2").try_lock_write()
    lock.unlock(w)
    lock.unlock(lock.try_lock_read())
    assert objects.objects == {"backup/archive-2.WRIT": b""}


def test_rw_lock_refuses_while_a_writer_intends_to_write() -> None:
    objects = MemoryObjects()
    engine = PutAndVerify(objects, attempts=1, sleep=lambda s: None)
    objects.put(f"p.WRIT{INTENT}someone", b"")
    with pytest.raises(PredicateFailedError):
        RWLock(engine, "p").try_lock_read()


# -- helpers and the factory ----------------------------------------------------------------


def test_generation_of_versions() -> None:
    assert generation("42") == 42
    assert generation("7:0cc175b9c0f1b6a831c399e269772661") == 7
    assert generation("0cc175b9") is None


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", "a\nb", "x" * 513])
def test_bad_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        check_key(key)
    with pytest.raises(ValueError):
        MemoryStore().get(key)


def test_lease_records_are_json_with_owner_and_token() -> None:
    from perago.coord import LeaseManager

    store = MemoryStore()
    grant = LeaseManager(store, ttl=timedelta(seconds=5)).acquire("repo/main", "w1")
    record = store.get("leases/repo/main")
    assert record is not None
    body = json.loads(record.value)
    assert body["owner"] == "w1" and body["token"] == grant.token and body["ttl"] == 5.0
    assert {"acquired_at", "renewed_at"} <= set(body)


def test_factory_builds_memory_and_explains_mistakes() -> None:
    assert isinstance(build_store("memory", {}, lakefs=None), MemoryStore)
    assert set(KINDS) == {"lakefs", "s3", "dynamodb", "put_and_verify", "memory"}
    with pytest.raises(ConfigError, match="unknown coordination backend 'etcd'"):
        build_store("etcd", {}, lakefs=None)
    with pytest.raises(ConfigError, match="backend s3 needs PERAGO_COORD_BUCKET"):
        build_store("s3", {"bucket": ""}, lakefs=None)
    with pytest.raises(ConfigError, match="backend dynamodb needs PERAGO_COORD_TABLE"):
        build_store("dynamodb", {}, lakefs=None)
    with pytest.raises(ConfigError, match="backend lakefs needs a repository"):
        build_store("lakefs", {}, lakefs=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a lakeFS connection"):
        build_store("lakefs", {"repository": "r"}, lakefs=None)
    with pytest.raises(ConfigError, match="PERAGO_COORD_BUKET"):
        build_store("s3", {"buket": "b"}, lakefs=None)


def test_branch_leases_follow_the_settings() -> None:
    from perago import config
    from perago.coord.factory import branch_leases

    assert branch_leases(config.load(env={"PERAGO_COORD_BACKEND": "none"}), None) is None
    with pytest.raises(ConfigError, match="PERAGO_COORD_BACKEND"):
        config.load(env={"PERAGO_COORD_BACKEND": "zookeeper"})
    with pytest.raises(ConfigError, match="backend s3 needs PERAGO_COORD_BUCKET"):
        branch_leases(config.load(env={"PERAGO_COORD_BACKEND": "s3"}), None)
    # The default: lakeFS objects in each target repository, built on first use.
    settings = config.load(env={"PERAGO_LEASE_TTL": "4"})
    assert settings.coord_backend == "lakefs"
    leases = branch_leases(settings, None)
    assert leases is not None and leases.wait.total_seconds() == pytest.approx(4 * 1.5 * 2 + 5)
    with pytest.raises(ConfigError, match="needs a lakeFS connection"):
        leases.manager("repo")
    shared = branch_leases(config.load(env={"PERAGO_COORD_BACKEND": "memory"}), None)
    assert shared is not None and shared.manager("a") is shared.manager("b")


def test_janitor_removes_released_leases_and_watched_dead_ones_only() -> None:
    from perago.coord.branch_leases import BranchLeases
    from perago.coord.lease import LeaseManager
    from perago.publish.janitor import sweep_leases

    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    store = MemoryStore()
    manager = LeaseManager(store, ttl=timedelta(seconds=4), clock=lambda: clock[0], sleep=sleep)
    leases = BranchLeases.shared(manager, wait=timedelta(0))
    done = leases.acquire("r", "done", "w-finished")
    done.release()
    leases.acquire("r", "dead", "w-killed")
    live = leases.acquire("r", "live", "w-alive")
    leases.acquire("other", "main", "w-elsewhere")

    first = sweep_leases(leases, repositories=["r"])  # no watch: only released ones
    assert [name for _, name, _ in first.removed] == ["branches/r/done"]
    assert sorted(name for _, name, _ in first.kept) == ["branches/r/dead", "branches/r/live"]

    def renew_meanwhile(seconds: float) -> None:
        live.renew()  # the live holder renews while the janitor watches
        sleep(seconds)

    report = sweep_leases(
        leases, repositories=["r"], watch=timedelta(seconds=6.5), sleep=renew_meanwhile
    )
    assert [(n, why) for _, n, why in report.removed] == [
        ("branches/r/dead", "holder w-killed silent")
    ]
    assert [name for _, name, _ in report.kept] == ["branches/r/live"]
    assert {r.name for r in manager.records()} == {"branches/r/live", "branches/other/main"}
    manager.check(live.grant)  # untouched


def test_a_fresh_janitor_watches_a_dead_holders_lease_and_removes_it() -> None:
    """One pass of a just-started janitor (a worker's start-up pass, `perago janitor`): its
    first look must start the watch, or a dead holder's lease is never removed (found by
    `make chaos`: leases left held after the janitor)."""
    from perago.coord.branch_leases import BranchLeases
    from perago.coord.lease import LeaseManager
    from perago.publish.janitor import sweep_leases

    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    store = MemoryStore()
    holder = LeaseManager(store, ttl=timedelta(seconds=4), clock=lambda: clock[0], sleep=sleep)
    BranchLeases.shared(holder, wait=timedelta(0)).acquire("r", "dead", "w-killed")
    janitor = LeaseManager(store, ttl=timedelta(seconds=4), clock=lambda: clock[0], sleep=sleep)
    report = sweep_leases(
        BranchLeases.shared(janitor, wait=timedelta(0)),
        repositories=["r"],
        watch=timedelta(seconds=6.5),
        sleep=sleep,
    )
    assert [(n, why) for _, n, why in report.removed] == [
        ("branches/r/dead", "holder w-killed silent")
    ]


class _CountingStore(MemoryStore):
    """Counts reads and can hold writes back, to see what a lease call does and when."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.writes_open = threading.Event()
        self.writes_open.set()

    def get(self, key: str) -> Versioned | None:
        self.gets += 1
        return super().get(key)

    def set_if(self, key: str, value: bytes, expected: str | None) -> str:
        assert self.writes_open.wait(10), "a held-back write was never let through"
        return super().set_if(key, value, expected)


def test_a_guarded_write_on_a_fresh_grant_reads_the_lease_only_after_the_write() -> None:
    """While the grant lasts on the holder's clock no taker can hold it, so the read before
    the write is skipped (issue 15: the lease's calls per publication); the read after it,
    which catches a holder paused past its lease, stays. A lost grant still fails."""
    from perago.coord.errors import LeaseBusyError, LeaseLostError
    from perago.coord.lease import LeaseManager

    clock = [0.0]
    store = _CountingStore()
    manager = LeaseManager(store, ttl=timedelta(seconds=4), clock=lambda: clock[0])
    grant = manager.acquire("g", "a")
    store.gets = 0
    seen: list[int] = []
    assert manager.guarded(grant, lambda _budget: seen.append(store.gets) or "done") == "done"
    assert seen == [0] and store.gets == 1
    # Paused past its lease and taken over: the read before the write reports the loss.
    taker = LeaseManager(store, ttl=timedelta(seconds=4), clock=lambda: clock[0])
    with pytest.raises(LeaseBusyError):
        taker.acquire("g", "b")
    clock[0] += 6.5
    taker.acquire("g", "b")
    with pytest.raises(LeaseLostError):
        manager.guarded(grant, seen.append)
    assert seen == [0]
    # A grant this manager did not write is read before the write.
    other = LeaseManager(store, ttl=timedelta(seconds=4), clock=lambda: clock[0])
    with pytest.raises(LeaseLostError):
        other.guarded(grant, seen.append)
    assert seen == [0]


def test_a_background_release_frees_the_lease_and_the_next_acquire_waits_for_it() -> None:
    from perago.coord.lease import LeaseManager

    store = _CountingStore()
    manager = LeaseManager(store, ttl=timedelta(seconds=4))
    grant = manager.acquire("r", "a")
    store.writes_open.clear()  # the release's write is held back
    errors: list[Exception] = []
    manager.release_soon(grant, errors.append)  # returns at once
    taken: list[int] = []
    racer = threading.Thread(target=lambda: taken.append(manager.acquire("r", "b").token))
    racer.start()
    racer.join(0.3)
    assert racer.is_alive() and taken == []  # waiting for the release, not for the ttl
    store.writes_open.set()
    racer.join(10)
    assert len(taken) == 1 and taken[0] > grant.token and errors == []
    assert manager.holder("r") is not None and manager.holder("r").owner == "b"  # type: ignore[union-attr]


def test_a_failed_background_release_is_reported_and_the_lease_expires_as_usual() -> None:
    from perago.coord.errors import CoordStoreError
    from perago.coord.lease import LeaseManager

    class Failing(MemoryStore):
        def set_if(self, key: str, value: bytes, expected: str | None) -> str:
            if json.loads(value)["owner"] == "":
                raise CoordStoreError("no answer from the store")
            return super().set_if(key, value, expected)

    manager = LeaseManager(Failing(), ttl=timedelta(seconds=4))
    grant = manager.acquire("f", "a")
    errors: list[Exception] = []
    manager.release_soon(grant, errors.append)
    holder = manager.holder("f")  # waits for the release to finish
    assert holder is not None and holder.owner == "a"
    assert [str(e) for e in errors] == ["no answer from the store"]


def test_janitor_removes_records_of_superseded_deliveries_once_nobody_reads_them() -> None:
    """A record of an ended delivery is read only during a re-delivery's wait (22.5 s from its
    poll); the janitor removes those older than ``RECORD_KEEP`` and leaves younger ones."""
    import json

    from perago.coord.branch_leases import BranchLeases
    from perago.coord.lease import LeaseManager
    from perago.publish.deliveries import RECORD_KEEP, EndedRecords
    from perago.publish.janitor import sweep_leases

    store = MemoryStore()
    leases = BranchLeases.shared(LeaseManager(store, ttl=timedelta(seconds=4)), wait=timedelta(0))
    records = EndedRecords(lambda _repository: store, worker_id="w1")
    records.write("r", "young", 1)
    old = json.dumps({"worker": "w0", "ended_at": time.time() - RECORD_KEEP.total_seconds() - 5})
    store.set_if("deliveries/old/p1", old.encode(), None)
    assert records.all_ended("r", "old", [1]) and records.all_ended("r", "young", [1])

    dry = sweep_leases(leases, repositories=["r"], dry_run=True)
    assert [key for _, key, _ in dry.removed] == ["deliveries/old/p1"]
    assert records.all_ended("r", "old", [1])  # a dry run removes nothing
    report = sweep_leases(leases, repositories=["r"])
    assert [key for _, key, _ in report.removed] == ["deliveries/old/p1"]
    assert not records.all_ended("r", "old", [1]) and records.all_ended("r", "young", [1])
