"""The final report: serialized with extensions, read back, re-sent until it shows."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from perago.core.orchestrator import TaskSnapshot
from perago.errors import OrchestratorError, ReportWindowClosedError
from perago.worker.report import Landing, TaskUpdates, landing, within_window

DELIVERY = TaskSnapshot(
    task_id="t0",
    task_type="x",
    reference_name="step",
    workflow_id="wf",
    status="IN_PROGRESS",
    retry_count=0,
    poll_count=1,
    worker_id="w",
    response_timeout_seconds=6,
    input={},
)


@pytest.mark.parametrize(
    ("now", "verdict"),
    [
        (replace(DELIVERY, status="COMPLETED"), Landing.LANDED),
        (replace(DELIVERY, status="IN_PROGRESS"), Landing.RESEND),
        (replace(DELIVERY, status="TIMED_OUT", terminal=True), Landing.SUPERSEDED),
        (replace(DELIVERY, status="IN_PROGRESS", poll_count=2), Landing.SUPERSEDED),
        (None, Landing.GONE),
    ],
)
def test_landing_of_a_completed_report(now: TaskSnapshot | None, verdict: Landing) -> None:
    assert landing("COMPLETED", now, DELIVERY) is verdict


class RacyTask:
    """Conductor's unlocked read-modify-write, with the extension's write held until released:
    a COMPLETED sent meanwhile is overwritten by the extension's stale IN_PROGRESS."""

    def __init__(self) -> None:
        self.status = "IN_PROGRESS"
        self.extension_read = threading.Event()
        self.release_extension = threading.Event()
        self.sends: list[str] = []
        self.hold = True

    def extend(self) -> None:
        seen = self.status
        if self.hold:
            self.extension_read.set()
            assert self.release_extension.wait(5)
        if seen == "IN_PROGRESS":
            self.status = seen  # the stale write-back

    def send(self) -> None:
        self.sends.append("COMPLETED")
        self.status = "COMPLETED"

    def read(self) -> TaskSnapshot:
        return replace(DELIVERY, status=self.status)


def test_the_report_waits_for_an_extension_in_flight_and_lands() -> None:
    task = RacyTask()
    updates = TaskUpdates(DELIVERY, extend=task.extend, read=task.read)
    ext = threading.Thread(target=updates.extend)
    ext.start()
    assert task.extension_read.wait(5)
    verdict: list[Landing] = []
    reporter = threading.Thread(
        target=lambda: verdict.append(updates.report("COMPLETED", task.send))
    )
    reporter.start()
    reporter.join(0.2)
    assert task.sends == []  # not while the extension is in flight
    task.release_extension.set()
    ext.join(5)
    reporter.join(5)
    assert verdict == [Landing.LANDED]
    assert task.status == "COMPLETED"
    assert updates.extend() is False  # no extension after the final report started
    assert task.status == "COMPLETED"


def test_an_overwritten_report_is_sent_again_until_it_shows() -> None:
    task = RacyTask()
    task.hold = False
    reads = iter(["IN_PROGRESS", "IN_PROGRESS", "COMPLETED"])
    updates = TaskUpdates(
        DELIVERY, extend=task.extend, read=lambda: replace(DELIVERY, status=next(reads))
    )
    assert updates.report("COMPLETED", task.send) is Landing.LANDED
    assert task.sends == ["COMPLETED"] * 3


def test_resending_is_bounded() -> None:
    task = RacyTask()
    updates = TaskUpdates(
        DELIVERY, extend=task.extend, read=lambda: replace(DELIVERY, status="IN_PROGRESS"), sends=3
    )
    assert updates.report("COMPLETED", task.send) is Landing.RESEND
    assert len(task.sends) == 3


def test_a_later_delivery_owning_the_task_stops_the_resends() -> None:
    task = RacyTask()
    updates = TaskUpdates(
        DELIVERY, extend=task.extend, read=lambda: replace(DELIVERY, poll_count=2)
    )
    assert updates.report("COMPLETED", task.send) is Landing.SUPERSEDED
    assert task.sends == ["COMPLETED"]


def test_a_report_in_its_window_rides_out_transient_errors_and_nothing_else() -> None:
    """Issue 42 (one retry policy), report windows (issue 41): unreachable/5xx/429 are tried
    again while the window is open, each try's timeout ending at its end; a 4xx ends it at
    once; a window that closes first raises ReportWindowClosedError, and a closed window
    sends nothing."""
    now = [0.0]
    answers: list[OrchestratorError | None] = [
        OrchestratorError("no answer"),
        OrchestratorError("busy", status=503),
        None,
    ]
    sent: list[float] = []

    def send(timeout: float) -> None:
        sent.append(timeout)
        now[0] += 1.0
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    within_window(8.0, send, clock=lambda: now[0])()
    assert len(sent) == 3 and sent[0] == 8.0 and all(t <= 8.0 - i for i, t in enumerate(sent))

    with pytest.raises(OrchestratorError, match="bad request"):
        within_window(time.monotonic() + 60, _failing(400))()

    tries: list[float] = []
    with pytest.raises(ReportWindowClosedError, match="report window closed"):
        within_window(time.monotonic() + 0.5, _failing(503, tries))()
    assert len(tries) >= 1  # tried while it was open, then refused

    closed: list[float] = []
    with pytest.raises(ReportWindowClosedError):
        within_window(time.monotonic() - 1, _failing(503, closed))()
    assert closed == []


def _failing(status: int, tries: list[float] | None = None):  # type: ignore[no-untyped-def]
    def send(timeout: float) -> None:
        if tries is not None:
            tries.append(timeout)
        raise OrchestratorError("bad request", status=status)

    return send
