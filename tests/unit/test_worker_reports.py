"""Every attempt ends in a report, or in a logged and counted reason (issue 14.4)."""

from __future__ import annotations

import threading
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
) -> None:
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
    """A publication's share of the branch lease, as the publisher hands it on."""
    me = AttemptIdentity("wf", "step", task_id, 0, 1, "tt", scope="data/")
    return LeaseGroups(leases).acquire("r", "main", f"{task_id}-p1", me)


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


def test_a_delivery_whose_window_never_opened_reports_failed_not_completed(
    tmp_path: Path,
) -> None:
    """F3: its grant ran out and another delivery of the task id took the branch over; this
    one's COMPLETED could contradict what the branch will say, so it reports FAILED."""
    leases, clock = _branch_leases()
    held = _taken_over(leases, clock)
    before = _count("report_window_closed")
    conductor = StubOrchestrator()
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, Runner(Outcome("COMPLETED"), held), tmp_path)
    [report] = [u.outcome for u in conductor.reports() if u.outcome]
    assert report.status == "FAILED" and "report window closed" in report.reason
    assert _count("report_window_closed") == before + 1
    assert any(e["event"] == "guarded_report_refused" for e in logs)
    holder = leases.manager("r").holder("branches/r/main")
    assert holder and holder.owner == "t0-p2"  # p2's lease is untouched


def test_a_completed_that_conductor_does_not_take_in_its_window_becomes_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conductor answers 503 for longer than the window: COMPLETED is not sent after it (a
    re-delivery may be publishing by then); FAILED once Conductor answers again."""

    monkeypatch.setattr(group_commit, "REPORT_SEND_SECONDS", 0.5)
    leases, _ = _branch_leases()
    conductor = StubOrchestrator()
    conductor.fail("report", error=OrchestratorError("busy", status=503), times=2)
    _attempt(conductor, Runner(Outcome("COMPLETED"), _member(leases)), tmp_path)
    *lost, report = [u.outcome for u in conductor.reports() if u.outcome]
    assert [o.status for o in lost] == ["COMPLETED", "COMPLETED"]  # both answered 503
    assert report.status == "FAILED" and "report window closed" in report.reason


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
