"""Every attempt ends in a report, or in a logged and counted reason (issue 14.4)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import BaseModel

from perago import WorkspaceSpec, config, metrics, task
from perago.errors import OrchestratorError, WorkerShutdown
from perago.orchestrator import Outcome
from perago.testing import MemoryStore, StubOrchestrator
from perago.worker import Worker


class _P(BaseModel):
    pass


@task("unit_report_task", workspace=WorkspaceSpec(prefix="data/"))
def _body(workspace: Path, params: _P) -> _P:
    return params


class Runner:
    def __init__(self, action: BaseException | Outcome) -> None:
        self.action = action

    def run(self, *args: Any) -> Outcome:
        if isinstance(self.action, BaseException):
            raise self.action
        return self.action


def _attempt(conductor: StubOrchestrator, runner: Runner, tmp_path: Path) -> None:
    settings = config.load(env={"PERAGO_WORK_DIR": str(tmp_path)})
    w = Worker([_body], settings=settings, store=MemoryStore(), orchestrator=conductor)
    w._runner = runner  # type: ignore[assignment]
    conductor.submit("unit_report_task", {}, workflow_id="wf", reference_name="step")
    (delivery,) = conductor.poll("unit_report_task", worker_id=settings.worker_id, count=1)
    w._start(delivery)
    for t in threading.enumerate():
        if t.name == f"perago-attempt-{delivery.task_id}":
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
