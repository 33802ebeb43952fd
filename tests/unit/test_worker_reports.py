"""Every attempt ends in a report, or in a logged and counted reason (issue 14.4)."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import BaseModel

from perago import WorkspaceSpec, config, metrics, task
from perago.adapters.conductor import TaskSnapshot
from perago.errors import OrchestratorError, WorkerShutdown
from perago.runtime import Outcome
from perago.testing import MemoryStore
from perago.worker import Worker


class _P(BaseModel):
    pass


@task("unit_report_task", workspace=WorkspaceSpec(prefix="data/"))
def _body(workspace: Path, params: _P) -> _P:
    return params


DELIVERY = TaskSnapshot(
    task_id="t0",
    task_type="unit_report_task",
    reference_name="step",
    workflow_id="wf",
    status="IN_PROGRESS",
    retry_count=0,
    poll_count=1,
    worker_id="w",
    response_timeout_seconds=0,
    input={},
)


class FakeConductor:
    """Records updates; the task reads back with the status last reported."""

    def __init__(self, *, fail_update: BaseException | None = None) -> None:
        self.updates: list[dict[str, Any]] = []
        self.fail_update = fail_update
        self.status = "IN_PROGRESS"

    def update_task(self, body: dict[str, Any]) -> None:
        if self.fail_update is not None:
            raise self.fail_update
        self.updates.append(body)
        self.status = body["status"]

    def get_task(self, task_id: str) -> TaskSnapshot:
        return replace(DELIVERY, status=self.status)

    def extend_lease(self, *args: Any) -> None:
        pass


class Runner:
    def __init__(self, action: BaseException | Outcome) -> None:
        self.action = action

    def run(self, *args: Any) -> Outcome:
        if isinstance(self.action, BaseException):
            raise self.action
        return self.action


def _attempt(conductor: FakeConductor, runner: Runner, tmp_path: Path) -> None:
    settings = config.load(env={"PERAGO_WORK_DIR": str(tmp_path)})
    w = Worker([_body], settings=settings, store=MemoryStore(), conductor=conductor)  # type: ignore[arg-type]
    w._runner = runner  # type: ignore[assignment]
    w._start(DELIVERY)
    for t in threading.enumerate():
        if t.name == f"perago-attempt-{DELIVERY.task_id}":
            t.join(10)
    assert w.in_flight() == 0


def _count(reason: str) -> float:
    return metrics.REPORT_PROBLEMS.labels(reason)._value.get()


def test_an_exception_escaping_the_runner_is_reported_failed(tmp_path: Path) -> None:
    conductor = FakeConductor()
    before = _count("runner_crashed")
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, Runner(KeyError("boom")), tmp_path)
    assert [u["status"] for u in conductor.updates] == ["FAILED"]
    assert "internal error in the worker: KeyError" in conductor.updates[0]["reasonForIncompletion"]
    assert _count("runner_crashed") == before + 1
    assert any(e["event"] == "attempt_crashed" for e in logs)


def test_an_interrupt_during_the_report_is_logged_and_counted(tmp_path: Path) -> None:
    conductor = FakeConductor(fail_update=WorkerShutdown())
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
    conductor = FakeConductor(fail_update=error)
    before = _count(reason)
    with structlog.testing.capture_logs() as logs:
        _attempt(conductor, Runner(Outcome("COMPLETED")), tmp_path)
    assert _count(reason) == before + 1
    assert any(e["event"] == "report_failed" for e in logs)
