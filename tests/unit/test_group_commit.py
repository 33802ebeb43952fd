"""Group commit: disjoint publications of one process share a branch lease grant."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from perago.adapters.conductor import TaskSnapshot
from perago.adapters.objects import error_for
from perago.coord import MemoryStore as CoordMemory
from perago.coord.branch_leases import BranchLeases, HeldLease, lease_name
from perago.coord.lease import LeaseManager
from perago.core.lakefs_names import HEAD_MOVED
from perago.core.store import Commit
from perago.errors import (
    AttemptFenceError,
    LeaseBusyError,
    PeragoError,
    PublishFenceError,
)
from perago.publish import AttemptIdentity, Publisher, WorkspaceTarget, group_commit
from perago.publish.deliveries import EndedRecords, LocalDeliveries
from perago.publish.expected_head_hook import install, installed
from perago.publish.group_commit import GroupMember, LeaseGroups
from perago.telemetry import steps
from perago.telemetry.steps import Boundary
from perago.testing import MemoryStore
from perago.workspace import Diff
from tests.unit.test_fanout import LEFT, RIGHT, WIDE, ident, snap


class CountingLeases(BranchLeases):
    """Branch leases on an in-process store that count the grants they hand out."""

    def __init__(self, wait: float = 5.0) -> None:
        manager = LeaseManager(CoordMemory(), ttl=timedelta(seconds=30))
        super().__init__(lambda _repository: manager, wait=timedelta(seconds=wait))
        self.grants = 0
        self.tries = 0
        self.waits: list[timedelta | None] = []
        self._tried = threading.Condition()

    def acquire(
        self, repository: str, branch: str, owner: str, *, wait: timedelta | None = None
    ) -> HeldLease:
        with self._tried:
            self.tries += 1
            self.waits.append(wait)
            self._tried.notify_all()
        lease = super().acquire(repository, branch, owner, wait=wait)
        self.grants += 1
        return lease

    def tried_again(self, times: int = 2) -> None:
        """Until a waiter has asked for the lease ``times`` more times: it has looked at the
        process's groups again in between (``LeaseGroups.acquire`` checks them first)."""
        with self._tried:
            start = self.tries
            assert self._tried.wait_for(lambda: self.tries >= start + times, timeout=10)


def test_a_waiter_behind_another_process_polls_in_one_loop() -> None:
    """Issue 42: the group's waiter is the only loop that waits; each look at the lease
    record is one try of the lease manager (no second poll nested inside), and the holder's
    release is seen at a later look."""
    leases = CountingLeases(wait=5)
    other = leases.acquire("r", "main", "another process")
    groups = LeaseGroups(leases)
    leases.waits.clear()
    thread, got = _acquire_later(groups, LEFT)
    leases.tried_again(4)  # the waiter looked at the record again and again
    other.release()
    thread.join(5)
    assert got and not thread.is_alive()
    assert set(leases.waits) == {timedelta(0)}, "the manager never waits on its own"
    got[0].release()


def _acquire_later(groups: LeaseGroups, me: AttemptIdentity) -> tuple[threading.Thread, list]:
    got: list[GroupMember] = []
    thread = threading.Thread(target=lambda: got.append(groups.acquire("r", "main", "w", me)))
    thread.start()
    return thread, got


def test_disjoint_publications_share_one_grant_and_the_last_to_leave_releases_it() -> None:
    leases = CountingLeases()
    groups = LeaseGroups(leases)
    left = groups.acquire("r", "main", "left", LEFT)
    right = groups.acquire("r", "main", "right", RIGHT)
    assert not left.joined and right.joined and left.token == right.token
    assert leases.grants == 1
    left.release()
    assert leases.held("r", "main")  # the right publication still reports under it
    right.release()
    assert not leases.held("r", "main")
    left.release()  # leaving twice changes nothing
    again = groups.acquire("r", "main", "again", LEFT)
    assert not again.joined and again.token > left.token and leases.grants == 2
    again.release()


@pytest.mark.parametrize(
    "waiter",
    [WIDE, ident("whole", None)],
    ids=["overlapping-scope", "unknown-scope"],
)
def test_an_overlapping_publication_waits_for_the_group_to_end(waiter: AttemptIdentity) -> None:
    leases = CountingLeases()
    groups = LeaseGroups(leases)
    left = groups.acquire("r", "main", "left", LEFT)
    right = groups.acquire("r", "main", "right", RIGHT)
    thread, got = _acquire_later(groups, waiter)
    leases.tried_again()
    assert thread.is_alive() and got == []
    left.release()
    leases.tried_again()
    assert thread.is_alive() and got == []  # it overlaps the right publication too
    right.release()
    thread.join(5)
    assert len(got) == 1 and not got[0].joined and got[0].token > left.token
    got[0].release()


def test_another_attempt_of_a_step_joins_only_once_the_earlier_one_left() -> None:
    """As with a lone lease: the retry's section starts after the earlier attempt's ended
    (reported or failed), never beside it."""
    leases = CountingLeases()
    groups = LeaseGroups(leases)
    left = groups.acquire("r", "main", "left", LEFT)
    right = groups.acquire("r", "main", "right", RIGHT)
    thread, got = _acquire_later(groups, ident("left", "a/l/", retry=1))
    leases.tried_again()
    assert thread.is_alive() and got == []
    left.release()
    thread.join(5)
    assert len(got) == 1 and got[0].joined and got[0].token == right.token
    right.release()
    got[0].release()


def test_a_waiter_joins_a_group_that_opens_while_it_waits() -> None:
    leases = CountingLeases()
    groups = LeaseGroups(leases)
    wide = groups.acquire("r", "main", "wide", WIDE)
    thread, got = _acquire_later(groups, LEFT)  # overlaps the wide group: waits
    other, got_other = _acquire_later(groups, RIGHT)  # so does this one
    leases.tried_again()  # the waiters looked at the wide group again: neither joined
    assert thread.is_alive()
    wide.release()
    thread.join(5)
    other.join(5)
    assert len(got) == len(got_other) == 1
    assert got[0].token == got_other[0].token and got[0].joined != got_other[0].joined
    assert leases.grants == 2
    got[0].release()
    got_other[0].release()


def test_a_group_closes_after_its_limits() -> None:
    now = [0.0]
    leases = CountingLeases(wait=0)
    groups = LeaseGroups(leases, max_members=2, max_seconds=2.0, clock=lambda: now[0])
    a = groups.acquire("r", "main", "a", ident("a", "x/a/"))
    b = groups.acquire("r", "main", "b", ident("b", "x/b/"))
    with pytest.raises(LeaseBusyError):  # full
        groups.acquire("r", "main", "c", ident("c", "x/c/"))
    a.release()
    b.release()
    c = groups.acquire("r", "main", "c", ident("c", "x/c/"))
    now[0] = 2.5
    with pytest.raises(LeaseBusyError):  # too old
        groups.acquire("r", "main", "d", ident("d", "x/d/"))
    c.release()


def test_members_take_turns_and_a_turn_may_end_early() -> None:
    groups = LeaseGroups(CountingLeases())
    left = groups.acquire("r", "main", "left", LEFT)
    right = groups.acquire("r", "main", "right", RIGHT)
    entered = threading.Event()

    def other_turn() -> None:
        with right.turn():
            entered.set()

    with left.turn():
        thread = threading.Thread(target=other_turn)
        thread.start()
        _waiting_for_turns(left, 1)  # blocked on the left member's turn, not entered
        assert not entered.is_set()
        left.end_turn()
        assert entered.wait(5)
    thread.join(5)
    with left.turn():  # the early end released the turn exactly once
        pass
    left.release()
    right.release()


def test_a_members_wait_for_its_turn_and_its_time_in_it_are_measured() -> None:
    """The branch's serial section shows in ``perago_branch_turn_seconds`` and on the
    member (the ``published`` event's turn_wait_ms / turn_held_ms)."""
    from prometheus_client import REGISTRY

    def count(part: str) -> float:
        value = REGISTRY.get_sample_value("perago_branch_turn_seconds_count", {"part": part})
        return value or 0.0

    groups = LeaseGroups(CountingLeases())
    left = groups.acquire("r", "main", "left", LEFT)
    right = groups.acquire("r", "main", "right", RIGHT)
    assert left.turn_waited is None and left.turn_held is None
    waits, helds = count("wait"), count("held")

    def other_turn() -> None:
        with right.turn():
            pass

    with left.turn():
        thread = threading.Thread(target=other_turn)
        thread.start()
        _waiting_for_turns(left, 1)
        threading.Event().wait(0.2)  # the right member waits this long at least
        left.end_turn()
        held = left.turn_held
        left.end_turn()  # a second end (the context's) measures nothing more
    thread.join(5)
    assert held is not None and held >= 0.2
    assert left.turn_held == held
    assert right.turn_waited is not None and right.turn_waited >= 0.2
    assert left.turn_waited is not None and left.turn_waited < right.turn_waited
    assert (count("wait"), count("held")) == (waits + 2, helds + 2)
    left.release()
    right.release()


def _waiting_for_turns(member: GroupMember, n: int) -> None:
    """Until ``n`` members wait for their turn (threading.Condition's waiters)."""
    turns = member.group.turns
    deadline = threading.Event()
    for _ in range(500):
        with turns:
            if len(turns._waiters) >= n:  # type: ignore[attr-defined]
                return
        deadline.wait(0.01)
    raise AssertionError(f"{n} member(s) never waited for their turn")


def test_a_turn_not_given_within_the_lease_wait_fails_the_waiter() -> None:
    groups = LeaseGroups(CountingLeases(wait=0.3))
    left = groups.acquire("r", "main", "left", LEFT)
    right = groups.acquire("r", "main", "right", RIGHT)
    with left.turn(), pytest.raises(LeaseBusyError) as e, right.turn():
        pass
    assert "held its turn" in e.value.message
    with right.turn():  # the failed wait took nothing
        pass
    left.release()
    right.release()


def test_an_interrupt_while_waiting_for_a_turn_leaves_the_turns_to_the_others() -> None:
    """The drain's last resort (an exception raised in the attempt's thread) reaches a
    member waiting for its turn, and the turn is never left taken by it."""
    from perago.errors import WorkerShutdown
    from perago.worker.loop import _raise_in_thread

    groups = LeaseGroups(CountingLeases(wait=30))
    left = groups.acquire("r", "main", "left", LEFT)
    right = groups.acquire("r", "main", "right", RIGHT)
    third = groups.acquire("r", "main", "third", ident("t3", "parts/p=3/"))
    ended: list[BaseException] = []

    def wait_for_turn() -> None:
        try:
            with right.turn():
                pass
        except BaseException as e:  # noqa: BLE001 - what ended it is the assertion
            ended.append(e)

    waiter = threading.Thread(target=wait_for_turn)
    with left.turn():
        waiter.start()
        _waiting_for_turns(left, 1)
        assert waiter.ident is not None
        _raise_in_thread(waiter.ident, WorkerShutdown)
        waiter.join(5)
        assert not waiter.is_alive() and isinstance(ended[0], WorkerShutdown)
    took = threading.Event()

    def take() -> None:
        with third.turn():
            took.set()

    threading.Thread(target=take, daemon=True).start()
    assert took.wait(5), "the interrupted waiter left the turn taken"
    for member in (left, right, third):
        member.release()


class _FlippingLedger:
    """Answers IN_PROGRESS, then (from the second read on) CANCELED for ``cancelled``."""

    def __init__(self, snaps: list[TaskSnapshot], cancelled: str) -> None:
        self._snaps = {s.task_id: s for s in snaps}
        self._reads: dict[str, int] = {}
        self._cancelled = cancelled
        self._lock = threading.Lock()

    def get_task(self, task_id: str) -> TaskSnapshot | None:
        with self._lock:
            self._reads[task_id] = self._reads.get(task_id, 0) + 1
            if task_id == self._cancelled and self._reads[task_id] > 1:
                return replace(self._snaps[task_id], status="CANCELED")
            return self._snaps[task_id]


def _publish_all(
    publisher: Publisher, parts: list[AttemptIdentity], base: str, tmp_path: Path
) -> dict[str, object]:
    """Publish every part at once from ``base``: its output ref, or the error it raised."""
    start = threading.Barrier(len(parts))
    results: dict[str, object] = {}

    def publish(me: AttemptIdentity) -> None:
        ws = tmp_path / me.reference_name
        ws.mkdir()
        (ws / "part.txt").write_text(me.reference_name)
        start.wait()
        try:
            publication = publisher.publish(
                me,
                WorkspaceTarget("r", "main", base),
                me.scope or "",
                ws,
                Diff(added=("part.txt",)),
            )
        except PeragoError as e:
            results[me.task_id] = e
            return
        results[me.task_id] = publication.ref
        publication.release(wait=True)

    threads = [threading.Thread(target=publish, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_a_fan_out_publishes_through_few_grants_and_a_failing_member_fails_alone(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    parts = [ident(f"p{i}", f"parts/p={i}/") for i in range(12)]
    leases = CountingLeases()
    doomed = parts[5].task_id  # its attempt fence #2 finds the task cancelled
    publisher = Publisher(
        store, _FlippingLedger([snap(p) for p in parts], doomed), worker_id="w", leases=leases
    )
    with capture_logs() as logs:
        results = _publish_all(publisher, parts, base, tmp_path)
    published = [e for e in logs if e["event"] == "published"]
    assert len(published) == 11  # each with the branch's serial section as it saw it
    assert all(
        e["turn_held_ms"] >= e["merge_ms"] >= 0 and e["turn_wait_ms"] >= 0 for e in published
    )
    assert isinstance(results.pop(doomed), AttemptFenceError)
    assert all(isinstance(r, str) for r in results.values()), results
    tree = store.tree("r", "main")
    for me in parts:
        published = f"parts/p={me.reference_name[1:]}/part.txt"
        assert (published in tree) is (me.task_id != doomed)
        if me.task_id != doomed:  # its output ref holds its publication
            assert (
                store.tree("r", str(results[me.task_id]))[published] == me.reference_name.encode()
            )
    history = store.log("r", "main", amount=20)
    publications = [c for c in history if c.metadata.get("perago.kind") == "publication"]
    assert len(publications) == 11
    assert leases.grants < len(parts)  # the group shared grants
    assert not leases.held("r", "main")
    assert store.list_branches("r", prefix="perago-stg-") == []


class HookedStore(MemoryStore):
    """The in-memory store that runs the expected-head hook's check on a merge as lakeFS
    does (tests/integration has the real hook): only when the hook is in the merge source's
    tree and the server runs hooks (``runs_hooks=False``: ``actions.enabled: false``, or a
    hook that fails to load). Counts the reads of a branch's head."""

    def __init__(self, *, runs_hooks: bool = True) -> None:
        super().__init__()
        self.runs_hooks = runs_hooks
        self.head_reads = 0

    def get_commit(self, repository: str, ref: str) -> Commit:
        if ref == "main":
            self.head_reads += 1
        return super().get_commit(repository, ref)

    def merge(
        self,
        repository: str,
        source: str,
        destination: str,
        *,
        message: str,
        metadata: dict[str, str],
        timeout: float | None = None,
    ) -> str:
        with self._lock:  # the hook runs inside lakeFS's branch update: one step with it
            expected = metadata.get("perago.expected_head")
            head = self.branch_head(repository, destination)
            hooked = self.runs_hooks and installed(self, repository, source)
            if hooked and expected and head != expected:
                # What lakeFS answers when the hook's Lua errors, through the adapter's
                # translation of its answers (a HeadMovedError).
                answer = f"pre-merge hook: {HEAD_MOVED}{head}, expected {expected}"
                raise error_for(412, "Precondition Failed", answer, "lakeFS merge")
            return super().merge(
                repository, source, destination, message=message, metadata=metadata
            )


def _group_of(publisher: Publisher, members: int) -> None:
    """Wait until ``members`` publications share the branch's grant (a member hands its
    head on only to siblings that joined before its merge)."""
    groups = publisher._groups
    assert groups is not None
    with groups._changed:
        assert groups._changed.wait_for(
            lambda: len(getattr(groups._groups.get(("r", "main")), "members", {})) >= members,
            timeout=10,
        ), "the members never shared one grant"


@pytest.mark.parametrize(
    ("hook", "runs_hooks"),
    [(True, True), (True, False), (False, True)],
    ids=["hook-run", "hook-file-not-run", "no-hook"],
)
def test_members_hand_on_the_head_lakefs_made_with_or_without_the_hook(
    tmp_path: Path, hook: bool, runs_hooks: bool
) -> None:
    """A member fences on the merge commit the previous member read back instead of
    reading the head (about a head read per grant, not per publication), whether or not a
    hook guards the merges; each part lands once."""
    store = HookedStore(runs_hooks=runs_hooks)
    store.create_repository("r")
    if hook:
        install(store, "r", "main")
    base = store.branch_head("r", "main")
    parts = [ident(f"p{i}", f"parts/p={i}/") for i in range(12)]
    leases = CountingLeases()
    publisher = Publisher(
        store, _FlippingLedger([snap(p) for p in parts], ""), worker_id="w", leases=leases
    )
    store.head_reads = 0
    results = _publish_all(publisher, parts, base, tmp_path)
    assert all(isinstance(r, str) for r in results.values()), results
    history = store.log("r", "main", amount=20)
    assert sum(c.metadata.get("perago.kind") == "publication" for c in history) == len(parts)
    for me in parts:  # each output ref holds its own publication
        tree = store.tree("r", str(results[me.task_id]))
        assert tree[f"parts/p={me.reference_name[1:]}/part.txt"] == me.reference_name.encode()
    assert leases.grants < len(parts)
    assert store.head_reads <= 2 * leases.grants + 1, store.head_reads


def _foreign_commit_at_turn(
    tmp_path: Path, *, runs_hooks: bool, turn: int
) -> tuple[dict[str, object], list[Commit], Commit]:
    """Four disjoint members of one group publish from one base, the hook's file in the
    tree; a foreign commit lands right after the publish fence of the ``turn``-th turn.
    Returns the results, the branch's history and the foreign commit."""
    store = HookedStore(runs_hooks=runs_hooks)
    store.create_repository("r")
    install(store, "r", "main")
    base = store.branch_head("r", "main")
    parts = [ident(f"p{i}", f"parts/p={i}/") for i in range(4)]
    publisher = Publisher(
        store,
        _FlippingLedger([snap(p) for p in parts], ""),
        worker_id="w",
        leases=CountingLeases(),
    )
    fences, foreign = [0], []

    def land_foreign(boundary: Boundary, _attempt: steps.Attempt) -> None:
        if boundary is not Boundary.AFTER_PUBLISH_FENCE:
            return
        fences[0] += 1
        if fences[0] == 1:  # every member has joined before the first merge
            _group_of(publisher, len(parts))
        if fences[0] == turn:
            store.upload_bytes("r", "main", "elsewhere/foreign.txt", b"someone else")
            foreign.append(store.commit("r", "main", message="foreign", metadata={}))

    remove = steps.observe(land_foreign)
    try:
        results = _publish_all(publisher, parts, base, tmp_path)
    finally:
        remove()
    history = store.log("r", "main", amount=20)
    assert foreign[0].id in {c.id for c in history}  # never replaced
    return results, history, foreign[0]


@pytest.mark.parametrize("runs_hooks", [True, False], ids=["hook-run", "hook-file-not-run"])
def test_a_foreign_commit_before_the_first_merge_of_a_group_is_never_published_over(
    tmp_path: Path, runs_hooks: bool
) -> None:
    """Issue 38's reproduction: the hook's file is in the tree, four disjoint members share
    a grant, and a foreign commit lands between the first member's publish fence and its
    merge. Whether or not lakeFS runs the hook, no member completes: with the hook the
    first merge is refused (412), without it the first merge lands on the foreign commit
    and its post-publish check fails it; that merge hands nothing on (its first parent is
    not the head its fence saw), so the others read the head, see the foreign commit and
    fail closed. Handing on a merge commit built from the fence's head instead lets the
    second member complete over the foreign commit."""
    results, history, foreign = _foreign_commit_at_turn(tmp_path, runs_hooks=runs_hooks, turn=1)
    assert all(isinstance(r, PublishFenceError) for r in results.values()), results
    over = history[: [c.id for c in history].index(foreign.id)]
    # Without the hook, the first member's merge landed on it (and failed its check).
    assert len(over) == (0 if runs_hooks else 1), [c.message for c in over]


@pytest.mark.parametrize("runs_hooks", [True, False], ids=["hook-run", "hook-file-not-run"])
def test_a_foreign_commit_after_a_handed_over_head_is_refused(
    tmp_path: Path, runs_hooks: bool
) -> None:
    """The member whose turn comes second fences on the head the first one's merge made;
    a foreign commit lands right then. With the hook its merge names the handed-over head
    and is refused (412): it reads the head again, finds the foreign commit and fails
    closed. Without the hook its merge lands on the foreign commit and the post-publish
    check fails it. The members after it read the head (nothing was handed on) and fail
    closed; the first member's publication and the foreign commit stay."""
    results, history, foreign = _foreign_commit_at_turn(tmp_path, runs_hooks=runs_hooks, turn=2)
    failed = [r.message for r in results.values() if isinstance(r, PublishFenceError)]
    assert len(failed) == 3, results  # every member after the foreign commit fails closed
    second = "destination head is" if runs_hooks else "post-publish check"
    assert sum(second in m for m in failed) == 1, failed
    over = history[: [c.id for c in history].index(foreign.id)]
    assert len(over) == (0 if runs_hooks else 1), [c.message for c in over]
    publications = [c for c in history if c.metadata.get("perago.kind") == "publication"]
    assert len(publications) == 1 + len(over)


def test_a_redelivered_attempt_waits_out_the_report_windows_before_it_takes_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Report windows (F3, docs/protocol.md): a delivery with poll count 2 waits, before it
    takes the branch lease, for a fresh fence's age plus a window, times the clock-skew
    rate (an earlier delivery of its task id may still land a COMPLETED); a first delivery
    does not wait. The wait holds nothing: the branch's lease is free meanwhile, and
    another process takes and gives it back. Both publish once."""
    monkeypatch.setattr(group_commit, "FENCE_FRESH_SECONDS", 0.5)
    monkeypatch.setattr(group_commit, "REPORT_WINDOW_SECONDS", 1.0)
    store = HookedStore()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    first, again = ident("p0", "parts/p=0/"), replace(ident("p1", "parts/p=1/"), poll_count=2)
    leases = CountingLeases()
    publisher = Publisher(
        store, _FlippingLedger([snap(first), snap(again)], ""), worker_id="w", leases=leases
    )
    fenced: dict[str, float] = {}
    other: list[float] = []

    def at_lease(boundary: Boundary, attempt: steps.Attempt) -> None:
        if boundary is Boundary.AFTER_LEASE:
            fenced[attempt.task_id] = time.monotonic()
        if boundary is Boundary.AFTER_PUBLISH and attempt.task_id == first.task_id:
            threading.Thread(target=take_meanwhile).start()

    def take_meanwhile() -> None:  # as soon as the first delivery's share is released
        held = leases.acquire("r", "main", "another process", wait=timedelta(seconds=10))
        other.append(time.monotonic())
        held.release()

    remove = steps.observe(at_lease)
    started = time.monotonic()
    try:
        with capture_logs() as logs:
            results = _publish_all(publisher, [first, again], base, tmp_path)
    finally:
        remove()
    assert all(isinstance(r, str) for r in results.values()), results
    (waited,) = [e["seconds"] for e in logs if e["event"] == "report_windows_waited_out"]
    assert waited >= 2.0  # (0.5 + 1.0) s x the default skew rate 1.5, from its start
    [taken] = other  # another process held the lease before the re-delivery took it
    assert fenced[first.task_id] < taken < fenced[again.task_id]
    assert fenced[again.task_id] - started >= 2.0
    history = store.log("r", "main", amount=5)
    assert sum(c.metadata.get("perago.kind") == "publication" for c in history) == 2


def _redelivery_of_p1(monkeypatch: pytest.MonkeyPatch) -> tuple[HookedStore, str, AttemptIdentity]:
    """A repository, its base, and poll count 2 of partition 1's task id, with report windows
    short enough for a test: the whole wait is (1 + 1) s x the skew rate 1.5."""
    monkeypatch.setattr(group_commit, "FENCE_FRESH_SECONDS", 1.0)
    monkeypatch.setattr(group_commit, "REPORT_WINDOW_SECONDS", 1.0)
    store = HookedStore()
    store.create_repository("r")
    return store, store.branch_head("r", "main"), replace(ident("p1", "parts/p=1/"), poll_count=2)


@pytest.mark.parametrize(
    ("earlier", "waits"),
    [("ended here", False), ("running here", True), ("not seen here", True)],
)
def test_a_redelivery_stops_waiting_once_every_earlier_delivery_ended_in_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, earlier: str, waits: bool
) -> None:
    """The wait covers windows on any clock, counted from the re-delivery's start here;
    when poll count 1 ran in this very process and has ended, no window of it is open or
    can open, and the re-delivery goes on at once. One still running here, or run
    elsewhere, is waited out in full."""
    store, base, again = _redelivery_of_p1(monkeypatch)
    local = LocalDeliveries()
    if earlier != "not seen here":
        local.started(again.task_id, 1)
    if earlier == "ended here":
        local.ended(again.task_id, 1)
    local.started(again.task_id, 2)
    publisher = Publisher(
        store,
        _FlippingLedger([snap(again)], ""),
        worker_id="w",
        leases=CountingLeases(),
        deliveries=local,
    )
    with capture_logs() as logs:
        results = _publish_all(publisher, [again], base, tmp_path)
    assert all(isinstance(r, str) for r in results.values()), results
    (waited,) = [e["seconds"] for e in logs if e["event"] == "report_windows_waited_out"]
    # The whole wait ((1 + 1) s x the skew rate 1.5) from the delivery's start, or none.
    assert waited >= 2.5 if waits else waited < 1.5


@pytest.mark.parametrize("recorded", [True, False])
def test_a_redelivery_stops_waiting_once_another_processs_delivery_recorded_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: bool
) -> None:
    """Poll count 1 ran in another process: once it has ended and recorded so in the
    repository's coordination store (``EndedRecords``), the re-delivery goes on
    (``ended_by`` "recorded"); without the record it waits in full."""
    store, base, again = _redelivery_of_p1(monkeypatch)
    leases = CountingLeases()
    elsewhere = EndedRecords(lambda repo: leases.manager(repo).store, worker_id="other")
    local = LocalDeliveries(
        records=EndedRecords(lambda repo: leases.manager(repo).store, worker_id="w")
    )
    local.started(again.task_id, 2)
    publisher = Publisher(
        store, _FlippingLedger([snap(again)], ""), worker_id="w", leases=leases, deliveries=local
    )
    if recorded:
        threading.Timer(0.4, elsewhere.write, ("r", again.task_id, 1)).start()
    with capture_logs() as logs:
        results = _publish_all(publisher, [again], base, tmp_path)
    assert all(isinstance(r, str) for r in results.values()), results
    (waited,) = [e for e in logs if e["event"] == "report_windows_waited_out"]
    if recorded:
        assert waited["ended_by"] == "recorded" and waited["seconds"] >= 0.4
    else:  # (1 + 1) s x the skew rate 1.5
        assert waited["ended_by"] == "deadline" and waited["seconds"] >= 2.5


def test_a_superseded_delivery_records_its_end_only_after_it_has_ended() -> None:
    """Only a delivery that Conductor showed superseded, whose target is known, records its
    end, and only once it is marked ended here (the record proves what a local end proves)."""
    seen: list[tuple[str, bool]] = []
    local: LocalDeliveries

    class Spy(CoordMemory):
        def set_if(self, key: str, value: bytes, expected: str | None) -> str:
            task = key.split("/")[1]
            seen.append((key, local.earlier_ended_here(task, 2)))
            return super().set_if(key, value, expected)

    spy = Spy()
    local = LocalDeliveries(records=EndedRecords(lambda _repo: spy, worker_id="w"))
    for task in ("plain", "superseded", "no-target"):
        local.started(task, 1)
        if task != "no-target":
            local.publishes_to(task, 1, "r")
        if task != "plain":
            local.superseded(task, 1)
    assert seen == []  # nothing is recorded before an end
    for task in ("plain", "superseded", "no-target"):
        local.ended(task, 1)
    assert seen == [("deliveries/superseded/p1", True)]
    reader = LocalDeliveries(records=EndedRecords(lambda _repo: spy, worker_id="w2"))
    reader.started("superseded", 2)
    assert reader.earlier_recorded("r", "superseded", 2)
    reader.started("plain", 2)
    assert not reader.earlier_recorded("r", "plain", 2)
    reader.started("plain", 1)  # poll 1 now runs here: nothing is read for it
    assert not reader.earlier_recorded("r", "plain", 2)
    assert not reader.earlier_recorded("r", "superseded", 3)  # poll 2 runs here


def test_a_record_that_cannot_be_written_or_read_costs_only_the_full_wait() -> None:
    """The worker records an end as it frees the delivery's place: a store that fails (any
    error) is logged, the end still counts here, and a reader counts it as not recorded."""

    class Broken(CoordMemory):
        def set_if(self, key: str, value: bytes, expected: str | None) -> str:
            raise OSError("disk gone")

        def get(self, key: str) -> None:
            raise RuntimeError("store bug")

    broken = Broken()
    local = LocalDeliveries(records=EndedRecords(lambda _repo: broken, worker_id="w"))
    local.started("t", 1)
    local.publishes_to("t", 1, "r")
    local.superseded("t", 1)
    with capture_logs() as logs:
        local.ended("t", 1)  # does not raise
        reader = LocalDeliveries(records=EndedRecords(lambda _repo: broken, worker_id="w2"))
        reader.started("t", 2)
        assert not reader.earlier_recorded("r", "t", 2)
    assert local.earlier_ended_here("t", 2)
    events = {e["event"]: e for e in logs}
    assert "disk gone" in events["delivery_end_record_failed"]["error"]
    assert "store bug" in events["delivery_end_records_unread"]["error"]


def test_a_report_window_opens_only_while_the_attempt_fence_is_fresh(
    tmp_path: Path,
) -> None:
    """The publisher keeps when fence #2's read was sent on the lease share; a window opens
    only within ``FENCE_FRESH_SECONDS`` of it (so a re-delivery's wait from its poll covers
    every window an earlier delivery can open); a stale or missing fence opens a closed
    window, and the second window's fence follows (``Worker._report_again``)."""
    store = HookedStore()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    me = ident("p0", "parts/p=0/")
    publisher = Publisher(
        store, _FlippingLedger([snap(me)], ""), worker_id="w", leases=CountingLeases()
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "part.txt").write_text("x")
    before = time.monotonic()
    publication = publisher.publish(
        me, WorkspaceTarget("r", "main", base), "parts/p=0/", ws, Diff(added=("part.txt",))
    )
    member = publication.lease
    assert member is not None and member.fenced_at is not None
    assert before <= member.fenced_at <= time.monotonic()
    assert member.open_report_window() - time.monotonic() > group_commit.REPORT_SEND_SECONDS - 1
    member.fenced_at = time.monotonic() - group_commit.FENCE_FRESH_SECONDS - 0.1
    with capture_logs() as logs:
        assert member.open_report_window() <= time.monotonic()
    assert [e["event"] for e in logs] == ["report_window_fence_stale"]
    member.fenced_at = None
    assert member.open_report_window() <= time.monotonic()
    publication.release(wait=True)


def test_local_deliveries_forget_the_oldest_task_ids_first() -> None:
    local = LocalDeliveries(max_tasks=2)
    for task in ("a", "b"):
        local.started(task, 1)
        local.ended(task, 1)
    assert local.earlier_ended_here("a", 2) and local.earlier_ended_here("b", 3) is False
    local.started("c", 1)  # "a" is forgotten: its re-delivery would wait in full
    assert not local.earlier_ended_here("a", 2)
    assert local.earlier_ended_here("b", 2) and not local.earlier_ended_here("c", 2)
    assert local.earlier_ended_here("d", 1)  # a first delivery has no earlier one


def test_a_report_window_is_as_long_under_a_short_ttl_and_closed_once_the_grant_is_lost() -> None:
    """A window opens only under the grant, and then lasts ``REPORT_SEND_SECONDS`` whatever
    the lease's ttl (a 4 s ttl once gave 1.2-3.2 s windows that a busy Conductor missed);
    a grant taken over meanwhile gives a window closed already."""
    clock, coord = [0.0], CoordMemory()
    manager = LeaseManager(coord, ttl=timedelta(seconds=4), clock=lambda: clock[0])
    leases = BranchLeases(lambda _repository: manager, wait=timedelta(seconds=1))
    groups = LeaseGroups(leases)
    member = groups.acquire("r", "main", "w", LEFT)
    clock[0] = 3.5  # past half the ttl: the window renews the grant first
    before = member.fenced_at = time.monotonic()
    deadline = member.open_report_window()
    assert deadline - before >= group_commit.REPORT_SEND_SECONDS
    assert manager.time_left(member.group.lease.grant) > 3.5
    member.release()

    lost = groups.acquire("r", "main", "w", RIGHT)
    other_clock = [0.0]  # another process, which takes the grant over once it ran out

    def sleep(seconds: float) -> None:
        other_clock[0] += seconds

    other = LeaseManager(coord, ttl=timedelta(seconds=4), clock=lambda: other_clock[0], sleep=sleep)
    other.acquire(lease_name("r", "main"), "another process", wait=timedelta(seconds=60))
    clock[0] += 4  # this process's clock too saw the grant run out meanwhile
    lost.fenced_at = time.monotonic()  # a fresh fence: the grant alone closes it
    assert lost.open_report_window() <= time.monotonic()
