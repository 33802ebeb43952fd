"""Try/Confirm/Cancel against the in-memory store: decisions, races and lost answers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from perago.coord.branch_leases import BranchLeases
from perago.coord.errors import LeaseBusyError, LeaseLostError
from perago.coord.lease import LeaseManager
from perago.coord.memory import MemoryStore as CoordMemory
from perago.core.orchestrator import TaskSnapshot
from perago.errors import AttemptFenceError, PublishFenceError, StoreError
from perago.publish import AttemptIdentity, Publication, Publisher, WorkspaceTarget
from perago.publish.scope import SCOPE_MARKER_ROOT
from perago.testing import MemoryStore, StaticLedger
from perago.worker import failpoints
from perago.workspace import Diff


def ident(wf: str = "wf", task: str = "t0", retry: int = 0, ref: str = "step") -> AttemptIdentity:
    return AttemptIdentity(wf, ref, task, retry_count=retry, poll_count=1, task_type="tt")


def snap(me: AttemptIdentity, status: str = "IN_PROGRESS") -> TaskSnapshot:
    return TaskSnapshot(
        me.task_id,
        "tt",
        me.reference_name,
        me.workflow_id,
        status,
        me.retry_count,
        me.poll_count,
        "w",
        60,
        {},
    )


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore()
    s.create_repository("r")
    return s


def _workspace(tmp_path: Path, name: str, text: str) -> tuple[Path, Diff]:
    ws = tmp_path / name
    ws.mkdir()
    (ws / "out.txt").write_text(text)
    return ws, Diff(added=("out.txt",))


def _publish(store: MemoryStore, me: AttemptIdentity, ws: Path, diff: Diff, input_ref: str) -> str:
    pub = Publisher(store, StaticLedger(snap(me)), worker_id="w")
    return pub.publish(me, WorkspaceTarget("r", "main", input_ref), "data/", ws, diff).ref


def test_first_publication_is_a_merge_on_the_input_ref(store: MemoryStore, tmp_path: Path) -> None:
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "A")
    out = _publish(store, ident(), ws, diff, base)
    head = store.get_commit("r", "main")
    assert out == head.id and head.parents[0] == base
    assert store.tree("r", "main")["data/out.txt"] == b"A"
    assert any(p.startswith(f"{SCOPE_MARKER_ROOT}{base}/") for p in store.tree("r", "main"))
    assert store.list_branches("r", prefix="perago-stg-") == []


def test_retry_replaces_the_abandoned_publication_and_tags_it(
    store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "first")
    abandoned = _publish(store, ident(task="t0", retry=0), ws, diff, base)
    ws2, diff2 = _workspace(tmp_path, "b", "second")
    out = _publish(store, ident(task="t1", retry=1), ws2, diff2, base)
    head = store.get_commit("r", "main")
    assert out == head.id and head.parents == (base,)  # the staged commit itself
    assert store.tree("r", "main")["data/out.txt"] == b"second"
    assert store.get_tag("r", f"perago-replaced-{abandoned[:16]}-r1") == abandoned


def test_a_later_attempts_head_is_never_replaced(store: MemoryStore, tmp_path: Path) -> None:
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "later")
    _publish(store, ident(task="t2", retry=2), ws, diff, base)
    with pytest.raises(PublishFenceError, match="refusing to replace"):
        _publish(store, ident(task="t1", retry=1), ws, diff, base)


def test_a_stale_attempt_stages_nothing(store: MemoryStore, tmp_path: Path) -> None:
    me = ident()
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "x")
    pub = Publisher(store, StaticLedger(snap(me, "TIMED_OUT")), worker_id="w")
    with pytest.raises(AttemptFenceError):
        pub.publish(me, WorkspaceTarget("r", "main", base), "data/", ws, diff)
    assert store.branch_head("r", "main") == base
    assert store.list_branches("r", prefix="perago-stg-") == []


def test_noop_relocates_an_abandoned_publication(store: MemoryStore, tmp_path: Path) -> None:
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "x")
    abandoned = _publish(store, ident(task="t0"), ws, diff, base)
    out = _publish(store, ident(task="t1", retry=1), ws, Diff(), base)
    assert out == base == store.branch_head("r", "main")
    assert store.get_tag("r", f"perago-replaced-{abandoned[:16]}-r1") == abandoned


class _MergeBarrier(MemoryStore):
    """Both publishers reach the merge having passed the fence on the same head."""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=10)

    def merge(self, *args: object, **kwargs: object) -> str:
        self.barrier.wait()
        return super().merge(*args, **kwargs)  # type: ignore[arg-type]


def test_the_marker_makes_the_store_reject_the_second_of_two_racing_merges(tmp_path: Path) -> None:
    store = _MergeBarrier()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    results: dict[str, object] = {}

    def run(wf: str) -> None:
        ws = tmp_path / wf
        ws.mkdir()
        (ws / f"{wf}.txt").write_text(wf)
        try:
            results[wf] = _publish(
                store, ident(wf=wf, task=wf), ws, Diff(added=(f"{wf}.txt",)), base
            )
        except PublishFenceError as e:
            results[wf] = e

    threads = [threading.Thread(target=run, args=(w,)) for w in ("wa", "wb")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results.values() if isinstance(r, PublishFenceError)]
    assert len(errors) == 1 and "rejected the merge" in str(errors[0])
    head = store.get_commit("r", "main")
    assert head.parents[0] == base and head.id in results.values()


class _LostAnswer(MemoryStore):
    def merge(self, *args: object, **kwargs: object) -> str:
        super().merge(*args, **kwargs)  # type: ignore[arg-type]
        raise StoreError("connection reset while reading the merge answer")


def test_a_merge_whose_answer_was_lost_is_found_in_history(tmp_path: Path) -> None:
    store = _LostAnswer()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "x")
    out = _publish(store, ident(), ws, diff, base)
    assert out == store.branch_head("r", "main") != base


class _Throttled(MemoryStore):
    """lakeFS under contention: the first ``busy`` merges into main answer 429 (its own
    branch-update retries ran out), the first one after a sibling landed meanwhile."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy = busy
        self.throttled = 0

    def merge(self, repository: str, source: str, destination: str, **kwargs: Any) -> str:
        if destination == "main" and self.throttled < self.busy:
            self.throttled += 1
            if self.throttled == 1:  # a disjoint sibling's publication landed meanwhile
                sibling = ident(wf="other", task="s1", ref="sibling")
                sibling = replace(sibling, scope="elsewhere/")
                self.upload_bytes(repository, "main", "elsewhere/x.txt", b"x")
                head = self.branch_head(repository, "main")
                self.commit(repository, "main", message="sibling", metadata=sibling.metadata(head))
            raise StoreError("merge: too many attempts, try again later", status=429)
        return super().merge(repository, source, destination, **kwargs)


@pytest.mark.parametrize(("busy", "lands"), [(2, True), (4, False)])
def test_a_throttled_merge_is_retried_under_the_lease(
    tmp_path: Path, busy: int, lands: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 from lakeFS is not a task failure: the publisher waits, fences again against
    the head (a sibling may have landed) and merges again, while it holds the lease; only
    when every try is refused does the attempt fail (retryable)."""
    from perago.core import retry_policy

    monkeypatch.setattr(retry_policy, "MERGE_THROTTLE_FIRST_S", 0.001)
    store = _Throttled(busy)
    store.create_repository("r")
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "x")
    me = replace(ident(), scope="data/")
    if not lands:
        with pytest.raises(StoreError, match="too many attempts") as e:
            _publish(store, me, ws, diff, base)
        assert not e.value.non_retryable
        assert store.tree("r", "main").get("data/out.txt") is None
        return
    out = _publish(store, me, ws, diff, base)
    head = store.get_commit("r", "main")
    assert out == head.id and store.throttled == busy
    assert store.tree("r", "main")["data/out.txt"] == b"x"
    assert store.tree("r", "main")["elsewhere/x.txt"] == b"x"  # beside the sibling


def _leases(clock: list[float], wait: float = 0) -> BranchLeases:
    manager = LeaseManager(
        CoordMemory(), ttl=timedelta(seconds=10), clock=lambda: clock[0], sleep=lambda s: None
    )
    return BranchLeases.shared(manager, wait=timedelta(seconds=wait))


def test_publications_carry_the_fencing_token_of_the_branch_lease(
    store: MemoryStore, tmp_path: Path
) -> None:
    leases = _leases([0.0])
    base = store.branch_head("r", "main")
    me = ident(task="t0")
    pub = Publisher(store, StaticLedger(snap(me)), worker_id="w", leases=leases)
    ws, diff = _workspace(tmp_path, "a", "first")
    publication = pub.publish(me, WorkspaceTarget("r", "main", base), "data/", ws, diff)
    publication.release(wait=True)
    merge = store.get_commit("r", publication.ref)
    staged = store.get_commit("r", merge.parents[1])
    first = int(merge.metadata["perago.fencing_token"])
    assert first >= 1 and staged.metadata["perago.fencing_token"] == str(first)
    # The retry replaces that publication under a later grant: its token is higher.
    me2 = ident(task="t1", retry=1)
    pub2 = Publisher(store, StaticLedger(snap(me2)), worker_id="w", leases=leases)
    ws2, diff2 = _workspace(tmp_path, "b", "second")
    retry = pub2.publish(me2, WorkspaceTarget("r", "main", base), "data/", ws2, diff2)
    retry.release(wait=True)
    assert int(store.get_commit("r", retry.ref).metadata["perago.fencing_token"]) > first
    # Both released their lease: the next grant is free at once and higher still.
    grant = leases.acquire("r", "main", "someone-else")
    assert grant.token > first + 1


def test_a_held_branch_lease_blocks_the_publication(store: MemoryStore, tmp_path: Path) -> None:
    leases = _leases([0.0])
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "first")
    abandoned = _publish(store, ident(task="t0"), ws, diff, base)
    leases.acquire("r", "main", "another-publisher")
    me = ident(task="t1", retry=1)
    pub = Publisher(store, StaticLedger(snap(me)), worker_id="w", leases=leases)
    ws2, diff2 = _workspace(tmp_path, "b", "second")
    with pytest.raises(LeaseBusyError):
        pub.publish(me, WorkspaceTarget("r", "main", base), "data/", ws2, diff2)
    assert store.branch_head("r", "main") == abandoned  # nothing was reset
    assert store.list_branches("r", prefix="perago-stg-") == []


def _take_over_at(
    point: str, leases: BranchLeases, clock: list[float], taken: list[int]
) -> Callable[[str], None]:
    """A failpoint hook: at ``point`` a taker watches the held lease for ttl x skew, takes it."""

    def hit(name: str) -> None:
        if name != point:
            return
        manager = leases.manager("r")
        with pytest.raises(LeaseBusyError):
            manager.acquire("branches/r/main", "taker")  # first look starts the watch
        clock[0] += 15.1
        taken.append(manager.acquire("branches/r/main", "taker").token)

    return hit


def test_a_holder_whose_lease_was_taken_over_never_resets(
    store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The paused-holder story with a fake clock: the taker's later grant wins."""
    clock = [0.0]
    leases = _leases(clock)
    base = store.branch_head("r", "main")
    ws, diff = _workspace(tmp_path, "a", "first")
    abandoned = _publish(store, ident(task="t0"), ws, diff, base)
    me = ident(task="t1", retry=1)
    sleeper = Publisher(store, StaticLedger(snap(me)), worker_id="w", leases=leases)
    taken: list[int] = []

    monkeypatch.setattr(failpoints, "hit", _take_over_at("before_reset", leases, clock, taken))
    ws2, diff2 = _workspace(tmp_path, "b", "second")
    with pytest.raises(LeaseLostError):
        sleeper.publish(me, WorkspaceTarget("r", "main", base), "data/", ws2, diff2)
    assert taken and store.branch_head("r", "main") == abandoned
    assert taken[0] > int(store.get_commit("r", abandoned).metadata.get("perago.fencing_token", 0))


def test_a_holder_whose_lease_was_taken_over_never_merges(
    store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused between the publish fence and the merge past its lease: no merge."""
    clock = [0.0]
    leases = _leases(clock)
    base = store.branch_head("r", "main")
    me = ident(task="t0")
    sleeper = Publisher(store, StaticLedger(snap(me)), worker_id="w", leases=leases)

    taken: list[int] = []
    hit = _take_over_at("after_publish_fence", leases, clock, taken)
    monkeypatch.setattr(failpoints, "hit", hit)
    ws, diff = _workspace(tmp_path, "a", "late")
    with pytest.raises(LeaseLostError):
        sleeper.publish(me, WorkspaceTarget("r", "main", base), "data/", ws, diff)
    assert store.branch_head("r", "main") == base


def test_a_noop_waits_for_a_lease_an_earlier_attempt_holds(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Model-check finding F1: an earlier attempt past its fence #2 may still merge."""
    leases = _leases([0.0])
    base = store.branch_head("r", "main")
    target = WorkspaceTarget("r", "main", base)
    empty = tmp_path / "empty"
    empty.mkdir()
    me = ident(task="t1", retry=1)
    pub = Publisher(store, StaticLedger(snap(me)), worker_id="w", leases=leases)
    # The first attempt holds the lease (between its fence #2 and its merge).
    held = leases.acquire("r", "main", "t0-p1")
    with pytest.raises(LeaseBusyError):
        pub.publish(me, target, "data/", empty, Diff())
    held.release()
    noop = pub.publish(me, target, "data/", empty, Diff())
    assert noop.ref == base and noop.lease is not None
    noop.release(wait=True)


def test_materialize_skips_folder_markers_and_refuses_unsafe_names(tmp_path: Path) -> None:
    from perago.errors import UnsafePathError
    from perago.workspace import materialize

    store = MemoryStore()
    store.create_repository("r")
    store.upload_bytes("r", "main", "data/sub/", b"")
    store.upload_bytes("r", "main", "data/sub/f.txt", b"f")
    store.commit("r", "main", message="m", metadata={})
    (tmp_path / "ws").mkdir()
    manifest = materialize(store, "r", "main", "data/", tmp_path / "ws", parallelism=2)
    assert sorted(manifest.entries) == ["sub/f.txt"]
    store.upload_bytes("r", "main", "data/a/../../escape", b"x")
    store.commit("r", "main", message="m", metadata={})
    (tmp_path / "ws2").mkdir()
    with pytest.raises(UnsafePathError) as e:
        materialize(store, "r", "main", "data/", tmp_path / "ws2", parallelism=2)
    assert e.value.non_retryable


def test_a_cluster_id_names_the_staging_branches_apart() -> None:
    from dataclasses import replace

    from perago import config
    from perago.errors import ConfigError
    from perago.publish import staging_branch_name

    me = ident()
    assert staging_branch_name(me) == "perago-stg-t0-p1"
    assert staging_branch_name(replace(me, cluster_id="blue")) == "perago-blue-stg-t0-p1"
    assert replace(me, cluster_id="blue") == me  # the same attempt, wherever it is named
    with pytest.raises(ConfigError):  # a hyphen would let one cluster's prefix start another's
        config.load(env={"PERAGO_CLUSTER_ID": "blue-stg"})


def test_a_publication_and_a_no_op_hand_over_the_branch_lease_for_the_report(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Finding F3's fix: the lease outlives the publication (the worker reports under it and
    then releases it); the no-op path takes it too, though it is free and the head is the
    input ref; a failed publication releases it."""
    leases = _leases([0.0])
    base = store.branch_head("r", "main")
    me = ident(task="t0")
    pub = Publisher(store, StaticLedger(snap(me)), worker_id="w", leases=leases)
    ws, diff = _workspace(tmp_path, "a", "first")
    first = pub.publish(me, WorkspaceTarget("r", "main", base), "data/", ws, diff)
    assert first.lease is not None and leases.held("r", "main")
    first.release(wait=True)
    assert not leases.held("r", "main")
    me2 = ident(wf="wf2", task="n0")
    noop = Publisher(store, StaticLedger(snap(me2)), worker_id="w", leases=leases)
    out = noop.publish(me2, WorkspaceTarget("r", "main", first.ref), "data/", ws, Diff())
    assert out.ref == first.ref and out.lease is not None and leases.held("r", "main")
    out.release(wait=True)
    stale = Publisher(store, StaticLedger(snap(me, "TIMED_OUT")), worker_id="w", leases=leases)
    with pytest.raises(AttemptFenceError):
        stale.publish(me, WorkspaceTarget("r", "main", first.ref), "data/", ws, diff)
    assert not leases.held("r", "main")
    # Without leases a publication holds none.
    bare = Publisher(store, StaticLedger(snap(me2)), worker_id="w")
    assert bare.publish(me2, WorkspaceTarget("r", "main", first.ref), "data/", ws, Diff()) == (
        Publication(first.ref)
    )


class _UploadWatcher(MemoryStore):
    """Records, at each upload, whether the branch lease was held; can fail uploads."""

    def __init__(self, leases: BranchLeases, *, fail: bool = False) -> None:
        super().__init__()
        self.create_repository("r")
        self._leases = leases
        self._fail = fail
        self.held_at_upload: list[bool] = []

    def upload(self, repository: str, branch: str, path: str, source: Path, **kw: bool):  # type: ignore[no-untyped-def]
        deadline = threading.Event()
        held = False
        for _ in range(50):  # the lease is being taken on another thread: give it 0.5 s
            held = self._leases.held("r", "main")
            if held:
                break
            deadline.wait(0.01)
        self.held_at_upload.append(held)
        if self._fail:
            raise StoreError("upload refused (the test's fault)", status=500)
        return super().upload(repository, branch, path, source, **kw)


def test_a_small_diff_takes_the_branch_lease_while_it_uploads(tmp_path: Path) -> None:
    """Issue 15: the lease's round trips overlap the upload of a small diff (at most
    EARLY_LEASE_MAX_FILES files and EARLY_LEASE_MAX_BYTES); a large one uploads first, so its
    upload never keeps fan-out siblings waiting for the lease."""
    from perago.publish.transaction import EARLY_LEASE_MAX_BYTES

    leases = _leases([0.0])
    store = _UploadWatcher(leases)
    me = ident(task="small")
    pub = Publisher(store, StaticLedger(snap(me)), worker_id="w", leases=leases)
    ws, diff = _workspace(tmp_path, "small", "x")
    small = pub.publish(
        me, WorkspaceTarget("r", "main", store.branch_head("r", "main")), "d/", ws, diff
    )
    small.release(wait=True)
    out = small.ref
    assert store.held_at_upload == [True]
    assert "perago.fencing_token" in store.get_commit("r", out).metadata
    assert not leases.held("r", "main")
    big = tmp_path / "big"
    big.mkdir()
    (big / "out.bin").write_bytes(b"\0" * (EARLY_LEASE_MAX_BYTES + 1))
    me2 = ident(wf="wf2", task="big")
    pub2 = Publisher(store, StaticLedger(snap(me2)), worker_id="w", leases=leases)
    pub2.publish(
        me2, WorkspaceTarget("r", "main", out), "e/", big, Diff(added=("out.bin",))
    ).release(wait=True)
    assert store.held_at_upload == [True, False]


def test_a_failed_upload_gives_back_the_lease_it_was_taking(tmp_path: Path) -> None:
    leases = _leases([0.0])
    store = _UploadWatcher(leases, fail=True)
    me = ident(task="fails")
    pub = Publisher(store, StaticLedger(snap(me)), worker_id="w", leases=leases)
    ws, diff = _workspace(tmp_path, "a", "x")
    with pytest.raises(StoreError, match="the test's fault"):
        pub.publish(
            me, WorkspaceTarget("r", "main", store.branch_head("r", "main")), "d/", ws, diff
        )
    assert store.held_at_upload == [True]
    for _ in range(100):  # released in the background
        if not leases.held("r", "main"):
            break
        threading.Event().wait(0.01)
    assert not leases.held("r", "main")
    assert leases.acquire("r", "main", "next").token > 0
