"""Every attempt ends in a report, or in a logged and counted reason (issue 14.4)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import BaseModel

from perago import WorkspaceSpec, config, task
from perago.core.orchestrator import Outcome
from perago.errors import OrchestratorError, WorkerShutdown
from perago.publish import AttemptIdentity, group_commit
from perago.publish.group_commit import GroupMember, LeaseGroups
from perago.telemetry import metrics
from perago.testing import MemoryStore, StubOrchestrator
from perago.worker import Worker
from perago.worker.runtime import Finished


class _P(BaseModel):
    pass


@task("unit_report_task", workspace=WorkspaceSpec(prefix="data/"))
def _body(workspace: Path, params: _P) -> _P:
    return params


class Runner:
    def __init__(self, action: BaseException | Outcome, lease: GroupMember | None = None) -> None:
        self.action = action
        self.lease = lease

    def run(self, *args: Any, **kwargs: Any) -> Finished:
        if isinstance(self.action, BaseException):
            raise self.action
        return Finished(self.action, self.lease)


def _attempt(
    conductor: StubOrchestrator, runner: Runner, tmp_path: Path, *, delivered_again: bool = False
) -> Worker:
    """One delivery run to its report; ``delivered_again``: Conductor delivered its task id
    again (to a delivery that lives on, not run here) before it reports."""
    settings = config.load(env={"PERAGO_WORK_DIR": str(tmp_path)})
    w = Worker([_body], settings=settings, store=MemoryStore(), orchestrator=conductor)
    w._runner = runner  # type: ignore[assignment]
    conductor.submit("unit_report_task", {}, workflow_id="wf", reference_name="step")
    (delivery,) = conductor.poll("unit_report_task", worker_id=settings.worker_id, count=1)
    if delivered_again:
        conductor.redeliver(delivery.task_id)
        (live,) = conductor.poll("unit_report_task", worker_id="another", count=1)
        assert live.poll_count == delivery.poll_count + 1
    w._start(delivery)
    for t in threading.enumerate():
        if t.name.startswith(f"perago-attempt-{delivery.task_id}"):
            t.join(10)
    assert w.in_flight() == 0
    return w


def _count(reason: str) -> float:
    return metrics.REPORT_PROBLEMS.labels(reason)._value.get()


def test_an_exception_escaping_the_runner_is_reported_failed(tmp_path: Path) -> None:
    conductor = StubOrchestrator()
    before = _count("runner_crashed")
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, Runner(KeyError("boom")), tmp_path)
    outcomes = [u.outcome for u in conductor.reports()]
    assert [o.status for o in outcomes if o] == ["FAILED"]
    assert outcomes[0] and "internal error in the worker: KeyError" in outcomes[0].reason
    assert _count("runner_crashed") == before + 1
    assert any(e["event"] == "attempt_crashed" for e in logs)


def test_an_interrupt_during_the_report_is_logged_and_counted(tmp_path: Path) -> None:
    conductor = StubOrchestrator()
    conductor.fail("report", error=WorkerShutdown())
    before = _count("interrupted")
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, Runner(Outcome("COMPLETED")), tmp_path)
    assert _count("interrupted") == before + 1
    [event] = [e for e in logs if e["event"] == "attempt_interrupted"]
    assert event["step"] == "report" and event["reported"] is False


@pytest.mark.parametrize(
    ("error", "reason"),
    [(OrchestratorError("down"), "report_failed"), (ValueError("bug"), "report_crashed")],
)
def test_a_report_that_fails_is_logged_and_counted(
    error: BaseException, reason: str, tmp_path: Path
) -> None:
    conductor = StubOrchestrator()
    conductor.fail("report", error=error)
    before = _count(reason)
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, Runner(Outcome("COMPLETED")), tmp_path)
    assert _count(reason) == before + 1
    assert any(e["event"] == "report_failed" for e in logs)


# -- the report window (model-check finding F3, issue 41) -------------------------------------


def _branch_leases() -> tuple[Any, list[float]]:
    from datetime import timedelta

    from perago.coord.branch_leases import BranchLeases
    from perago.coord.lease import LeaseManager
    from perago.coord.memory import MemoryStore as CoordMemory

    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    manager = LeaseManager(
        CoordMemory(), ttl=timedelta(seconds=4), clock=lambda: clock[0], sleep=sleep
    )
    return BranchLeases.shared(manager, wait=timedelta(seconds=30)), clock


def _member(leases: Any, task_id: str = "t0") -> GroupMember:
    """A publication's share of the branch lease, as the publisher hands it on (its attempt
    fence #2 just passed)."""
    me = AttemptIdentity("wf", "step", task_id, 0, 1, "tt", scope="data/")
    member = LeaseGroups(leases).acquire("r", "main", f"{task_id}-p1", me)
    member.fenced_at = time.monotonic()
    return member


class HolderWatchingStub(StubOrchestrator):
    """Records who holds the branch lease, and the timeout, of each report sent."""

    def __init__(self, leases: Any) -> None:
        super().__init__()
        self.leases = leases
        self.holders: list[str | None] = []
        self.timeouts: list[float | None] = []

    def report(self, task: Any, outcome: Outcome, *, worker_id: str, **kw: Any) -> None:
        holder = self.leases.manager("r").holder("branches/r/main")
        self.holders.append(holder.owner if holder else None)
        self.timeouts.append(kw.get("timeout"))
        super().report(task, outcome, worker_id=worker_id, **kw)


def test_completed_leaves_the_branch_lease_first_and_is_sent_inside_its_window(
    tmp_path: Path,
) -> None:
    """The grant ends at the publication, not at Conductor's answer: the lease is free when
    COMPLETED is sent, with a timeout that ends with the window (8 s, whatever the lease's
    ttl: 4 s here)."""
    leases, _ = _branch_leases()
    conductor = HolderWatchingStub(leases)
    _attempt(conductor, Runner(Outcome("COMPLETED"), _member(leases)), tmp_path)
    assert [u.outcome.status for u in conductor.reports() if u.outcome] == ["COMPLETED"]
    assert conductor.holders == [None]
    [timeout] = conductor.timeouts
    assert timeout is not None and 7 < timeout <= group_commit.REPORT_SEND_SECONDS


def _taken_over(leases: Any, clock: list[float]) -> GroupMember:
    """p1's share of a grant that ran out while p1 paused, and p2 took the lease over."""
    held = _member(leases)
    leases.manager("r").is_expired(leases.manager("r").records()[0])  # the taker watches...
    clock[0] += 10  # ...past the takeover time (ttl 4 s x 1.5): p1 paused, p2 takes over
    leases.acquire("r", "main", "t0-p2")
    return held


def test_a_delivery_whose_window_never_opened_reports_in_a_window_under_a_new_grant(
    tmp_path: Path,
) -> None:
    """Its grant ran out while it paused and another process's publication took the lease:
    no window opened, so no COMPLETED under that grant (a re-delivery of the task id might
    have been publishing). The task is still this delivery's: once the other holder has
    left, it takes the lease again, re-runs the attempt fence and reports COMPLETED."""
    leases, clock = _branch_leases()
    runner = SnapshotRunner(leases)
    conductor = StubOrchestrator()
    taken: list[Any] = []

    def paused_past_the_grant(snapshot: Any) -> Finished:
        finished = SnapshotRunner.run(runner, None, snapshot)
        leases.manager("r").is_expired(leases.manager("r").records()[0])  # the taker watches
        clock[0] += 10  # ...past the takeover time (ttl 4 s x 1.5): this one paused
        taken.append(leases.acquire("r", "main", "another step"))
        taken[0].release()  # published and left
        return finished

    runner.run = lambda defn, snapshot, **kw: paused_past_the_grant(snapshot)  # type: ignore[method-assign]
    reopened = _count("report_window_reopened")
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, runner, tmp_path)
    assert [u.outcome.status for u in conductor.reports() if u.outcome] == ["COMPLETED"]
    assert _count("report_window_reopened") == reopened + 1
    [closed] = [e for e in logs if e["event"] == "report_window_closed"]
    assert "no try left" in closed["error"]  # the first window was closed at once
    assert leases.manager("r").holder("branches/r/main") is None


class SnapshotRunner(Runner):
    """A publication of the delivery it runs: its lease share names that very delivery."""

    def __init__(self, leases: Any) -> None:
        super().__init__(Outcome("COMPLETED"))
        self.leases = leases

    def run(self, defn: Any, snapshot: Any, **kwargs: Any) -> Finished:
        me = AttemptIdentity(
            snapshot.workflow_id,
            snapshot.reference_name,
            snapshot.task_id,
            snapshot.retry_count,
            snapshot.poll_count,
            snapshot.task_type,
            scope="data/",
        )
        owner = f"{snapshot.task_id}-p{snapshot.poll_count}"
        return Finished(
            Outcome("COMPLETED"), LeaseGroups(self.leases).acquire("r", "main", owner, me)
        )


class BusyConductor(StubOrchestrator):
    """Answers every COMPLETED report 503 in the first ``busy`` report windows (each
    shortened to 0.3 s), then takes it; counts the windows opened."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy, self.opened = busy, 0

    def report(self, task: Any, outcome: Outcome, *, worker_id: str, **kw: Any) -> None:
        if outcome.status == "COMPLETED" and self.opened <= self.busy:
            raise OrchestratorError("busy", status=503)
        super().report(task, outcome, worker_id=worker_id, **kw)


def _busy_windows(monkeypatch: pytest.MonkeyPatch, conductor: BusyConductor) -> None:
    monkeypatch.setattr(group_commit, "REPORT_SEND_SECONDS", 0.3)
    opened = GroupMember.open_report_window

    def counting(member: GroupMember) -> float:
        conductor.opened += 1
        return opened(member)

    monkeypatch.setattr(GroupMember, "open_report_window", counting)


def test_a_completed_that_misses_its_window_is_sent_in_another_under_the_lease_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conductor answers 503 for longer than a window: no COMPLETED after it (a re-delivery
    may be publishing by then); the delivery takes the branch lease again, re-runs the
    attempt fence under it, and its COMPLETED lands inside the second window: no FAILED, no
    retry spent. Nothing held afterwards."""
    leases, _ = _branch_leases()
    conductor = BusyConductor(busy=1)
    _busy_windows(monkeypatch, conductor)
    reopened = _count("report_window_reopened")
    with structlog.testing.capture_logs() as logs:
        w = _attempt(conductor, SnapshotRunner(leases), tmp_path)
    assert [u.outcome.status for u in conductor.reports() if u.outcome] == ["COMPLETED"]
    assert _count("report_window_reopened") == reopened + 1
    # Conductor shows its COMPLETED: a re-delivery on this worker need not wait for it.
    (task,) = conductor.reports()
    assert w._deliveries.earlier_ended_here(task.task_id, 2)
    events = [e["event"] for e in logs]
    assert events.count("report_window_closed") == 1 and "attempt_reported" in events
    assert leases.manager("r").holder("branches/r/main") is None
    assert sum(e["event"] == "lease_acquired" for e in logs) == 2  # the second window's grant


def test_a_completed_that_conductor_does_not_take_in_any_window_becomes_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conductor answers 503 through every window: FAILED once it answers again (the retry
    decides from the branch), after ``REPORT_WINDOWS`` windows."""
    from perago.worker import report as report_module

    leases, _ = _branch_leases()
    conductor = BusyConductor(busy=99)
    _busy_windows(monkeypatch, conductor)
    closed = _count("report_window_closed")
    w = _attempt(conductor, SnapshotRunner(leases), tmp_path)
    (report,) = [u.outcome for u in conductor.reports() if u.outcome]
    assert report.status == "FAILED" and "report window closed" in report.reason
    # Its COMPLETED was sent and never shown: a re-delivery here waits the windows out.
    (task,) = conductor.reports()
    assert not w._deliveries.earlier_ended_here(task.task_id, 2)
    assert conductor.opened == report_module.REPORT_WINDOWS
    assert _count("report_window_closed") == closed + 1
    assert leases.manager("r").holder("branches/r/main") is None


def test_a_second_window_is_refused_when_the_task_moved_on_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first window closes; by the time the lease is taken again Conductor delivered the
    task id again (to a live delivery): the fence under the lease refuses a second window,
    and this delivery sends no report at all (one rule for a superseded delivery)."""
    leases, _ = _branch_leases()
    conductor = BusyConductor(busy=99)
    _busy_windows(monkeypatch, conductor)
    moved = SnapshotRunner(leases)
    again = GroupMember.again

    def redelivered_first(member: GroupMember) -> GroupMember:
        conductor.redeliver(member.me.task_id)
        conductor.poll("unit_report_task", worker_id="another", count=1)
        return again(member)

    monkeypatch.setattr(GroupMember, "again", redelivered_first)
    skipped = _count("report_skipped_delivered_again")
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, moved, tmp_path)
    assert [u.outcome for u in conductor.reports() if u.outcome] == []
    assert _count("report_skipped_delivered_again") == skipped + 1
    [refused] = [e for e in logs if e["event"] == "guarded_report_refused"]
    assert "no longer this delivery's" in refused["error"]
    assert leases.manager("r").holder("branches/r/main") is None


def test_a_delivery_whose_window_closed_to_a_live_delivery_sends_no_report(
    tmp_path: Path,
) -> None:
    """One rule for a superseded report: when the task id is IN_PROGRESS under another
    delivery, this one sends no FAILED (it would end the task under the live delivery and
    spend a retry), after a closed window as after a failed attempt; counted apart from the
    window closed with nobody else on the task (``report_window_closed``)."""
    leases, clock = _branch_leases()
    held = _taken_over(leases, clock)
    skipped, closed = _count("report_skipped_delivered_again"), _count("report_window_closed")
    conductor = StubOrchestrator()
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, Runner(Outcome("COMPLETED"), held), tmp_path, delivered_again=True)
    assert [u.outcome for u in conductor.reports() if u.outcome] == []
    assert _count("report_skipped_delivered_again") == skipped + 1
    assert _count("report_window_closed") == closed
    assert any(e["event"] == "report_skipped_delivered_again" for e in logs)


def test_a_failed_delivery_superseded_by_a_live_one_sends_no_report(tmp_path: Path) -> None:
    """The same rule for a FAILED outcome (tests/unit/test_redelivery_report.py runs it
    through a whole worker)."""
    skipped = _count("report_skipped_delivered_again")
    conductor = StubOrchestrator()
    _attempt(conductor, Runner(Outcome("FAILED", reason="x")), tmp_path, delivered_again=True)
    assert [u.outcome for u in conductor.reports() if u.outcome] == []
    assert _count("report_skipped_delivered_again") == skipped + 1
