"""A delivery that fails after Conductor delivered its task id again does not report FAILED
over the live delivery: that one publishes and completes, and no retry is spent.

Conductor 3.32.3's sweeper does deliver a task id twice (it re-queues a task it read as
SCHEDULED while a poll had just taken it); ``StubOrchestrator.redeliver`` stands in for it,
as the real server cannot be made to race on demand.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from perago import WorkspaceSpec, task
from perago.telemetry import steps
from perago.telemetry.steps import Boundary
from perago.testing import MemoryStore, StubOrchestrator, running_worker


class P(BaseModel):
    n: int = 0


class R(BaseModel):
    n: int = 0


@task("rd_writer", workspace=WorkspaceSpec(prefix="parts/"), retry_count=1)
def writer(workspace: Path, params: P) -> R:
    (workspace / "rows.csv").write_text(f"{params.n}\n")
    return R(n=params.n)


class Deliveries:
    """Holds each of the first two deliveries at fence #1's boundary until it is released
    (told apart by the attempt the observer is given: one task id, two poll counts)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int]] = []
        self.held = [threading.Event(), threading.Event()]
        self.release = [threading.Event(), threading.Event()]

    def __call__(self, boundary: Boundary, attempt: steps.Attempt) -> None:
        if boundary is not Boundary.AFTER_FENCE1:
            return
        delivery = (attempt.task_id, attempt.poll_count)
        with self.lock:
            if delivery not in self.seen:
                self.seen.append(delivery)
            n = self.seen.index(delivery)
        if n < 2:
            self.held[n].set()
            self.release[n].wait(20)


@pytest.fixture
def deliveries() -> Iterator[Deliveries]:
    hold = Deliveries()
    remove = steps.observe(hold)
    try:
        yield hold
    finally:
        for release in hold.release:
            release.set()
        remove()


def test_a_delivery_superseded_by_a_live_one_does_not_fail_the_task(
    tmp_path: Path, deliveries: Deliveries
) -> None:
    """The first delivery fails its fence #2 while the second still runs the task: it sends
    no report, the second publishes and completes, no retry is scheduled."""
    store = MemoryStore()
    store.create_repository("repo")
    stub = StubOrchestrator(gate_timeout=20)
    ws = {"repository": "repo", "branch": "main"}
    with running_worker(
        [writer], store=store, orchestrator=stub, work_dir=tmp_path / "w", concurrency=2
    ) as worker:
        task_id = stub.submit("rd_writer", {"workspace": ws, "params": {"n": 1}}, workflow_id="f")
        assert deliveries.held[0].wait(20)
        stub.redeliver(task_id)
        assert deliveries.held[1].wait(20)  # both deliveries of the task id are running
        assert worker.in_flight() == 2  # two deliveries, two attempts in flight
        deliveries.release[0].set()  # the first fails fence #2: delivered again
        stub.wait_for(lambda s: worker.in_flight() == 1)  # the first attempt ended
        assert stub.task(task_id).status == "IN_PROGRESS"  # not failed under the second
        # The second still runs: drain would wait for it, no third attempt takes its place.
        assert worker.in_flight() == 1
        deliveries.release[1].set()
        stub.wait_for(lambda s: s.settled("f"))
    final = stub.final("f")
    assert (final.task_id, final.retry_count, final.status) == (task_id, 0, "COMPLETED")
    reports = [u for u in stub.reports(task_id) if u.kind == "report"]
    assert [u.outcome.status for u in reports if u.outcome] == ["COMPLETED"]
    assert len(stub.attempts("f")) == 1  # no retry was scheduled
    head = store.get_commit("repo", "main")
    assert head.metadata["perago.poll_count"] == "2"


def test_a_redelivery_in_another_worker_goes_on_once_the_superseded_one_recorded_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers (two processes' worth of state: each its own deliveries), one lease store.
    The first delivery is held after fence #1 and its task id handed to the second worker,
    which waits out report windows before the branch lease (here 30 s). The first goes on,
    its fence #2 finds the task delivered again, it sends no report and records its end; the
    second reads the record, goes on at once and completes the task."""
    from datetime import timedelta

    import structlog

    from perago.coord import MemoryStore as CoordMemory
    from perago.coord.branch_leases import BranchLeases
    from perago.coord.lease import LeaseManager
    from perago.publish import group_commit

    monkeypatch.setattr(group_commit, "FENCE_FRESH_SECONDS", 5.0)
    monkeypatch.setattr(group_commit, "REPORT_WINDOW_SECONDS", 15.0)
    store = MemoryStore()
    store.create_repository("repo")
    stub = StubOrchestrator(gate_timeout=20)
    leases = BranchLeases.shared(
        LeaseManager(CoordMemory(), ttl=timedelta(seconds=30)), wait=timedelta(seconds=60)
    )
    held, release = threading.Event(), threading.Event()

    def hold_first(boundary: Boundary, attempt: steps.Attempt) -> None:
        if boundary is Boundary.AFTER_FENCE1 and attempt.poll_count == 1:
            held.set()
            release.wait(20)

    ws = {"repository": "repo", "branch": "main"}
    remove = steps.observe(hold_first)
    try:
        with (
            structlog.testing.capture_logs() as logs,
            running_worker(
                [writer],
                store=store,
                orchestrator=stub,
                work_dir=tmp_path / "w1",
                leases=leases,
                concurrency=1,
                publications_in_flight=0,  # its one place stays busy: it polls no more
            ),
        ):
            task_id = stub.submit(
                "rd_writer", {"workspace": ws, "params": {"n": 1}}, workflow_id="f"
            )
            assert held.wait(20)
            stub.redeliver(task_id)
            with running_worker(
                [writer],
                store=store,
                orchestrator=stub,
                work_dir=tmp_path / "w2",
                leases=leases,
                worker_id="w2",
            ):
                stub.wait_for(lambda s: any(e["event"] == "report_windows_waiting" for e in logs))
                release.set()
                stub.wait_for(lambda s: s.settled("f"))
    finally:
        release.set()
        remove()
    events = [e["event"] for e in logs]
    assert "report_skipped_delivered_again" in events
    assert events.index("delivery_end_recorded") < events.index("report_windows_waited_out")
    [waited] = [e for e in logs if e["event"] == "report_windows_waited_out"]
    assert waited["ended_by"] == "recorded"
    final = stub.final("f")
    assert (final.task_id, final.retry_count, final.status) == (task_id, 0, "COMPLETED")
    assert len(stub.attempts("f")) == 1  # no retry was scheduled
    assert store.get_commit("repo", "main").metadata["perago.poll_count"] == "2"
