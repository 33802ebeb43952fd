"""What `perago run --wait` blames when a workflow fails (issue 39, item 4): the task that
failed by itself, followed into failed sub-workflows, with its real status and reason."""

from __future__ import annotations

from typing import Any

from perago.adapters.conductor import WorkflowRun


def _task(ref: str, kind: str, status: str, reason: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "taskId": f"id-{ref}",
        "referenceTaskName": ref,
        "taskType": kind,
        "status": status,
        "reasonForIncompletion": reason,
        "retryCount": 0,
        **extra,
    }


CHILD = {
    "workflowId": "child-3",
    "workflowName": "month_wf",
    "status": "FAILED",
    "reasonForIncompletion": "Task month failed with status: FAILED",
    "tasks": [
        _task(
            "month",
            "flights_month",
            "FAILED_WITH_TERMINAL_ERROR",
            "task body: AnalysisException: no column `dep_dely` (at /app/flights.py:42)",
        )
    ],
}
PARENT = {
    "workflowId": "parent",
    "status": "FAILED",
    "reasonForIncompletion": "Task months_join failed",
    "tasks": [
        _task("split", "FORK_JOIN_DYNAMIC", "COMPLETED"),
        _task("m_2", "SUB_WORKFLOW", "COMPLETED", subWorkflowId="child-2"),
        _task("m_3", "SUB_WORKFLOW", "FAILED", "child failed", subWorkflowId="child-3"),
        _task("months_join", "JOIN", "CANCELED"),
    ],
}


DONE = {
    "workflowId": "child-2",
    "status": "COMPLETED",
    "tasks": [
        _task(
            "month",
            "flights_month",
            "COMPLETED",
            outputData={"workspace": {"ref": "c2"}, "result": {}, "reused": {"commit": "c1"}},
        )
    ],
}


def test_a_failed_sub_workflow_is_followed_to_the_task_that_failed() -> None:
    run = WorkflowRun.from_json(PARENT, child={"child-3": CHILD, "child-2": DONE}.__getitem__)
    assert run.failure.startswith("task month (flights_month) FAILED_WITH_TERMINAL_ERROR")
    assert "no column `dep_dely` (at /app/flights.py:42)" in run.failure
    assert "in sub-workflow month_wf child-3, task m_3" in run.failure
    assert run.failed_task_id == "id-month"  # its task log holds the traceback


def test_without_following_the_sub_workflow_the_forked_task_is_blamed_not_the_join() -> None:
    run = WorkflowRun.from_json(PARENT)
    assert run.failure.startswith("task m_3 (SUB_WORKFLOW) FAILED")
    assert "child failed" in run.failure and run.failed_task_id == "id-m_3"


def test_the_workflows_own_reason_when_the_task_gives_none() -> None:
    wf = {
        "workflowId": "w",
        "status": "FAILED",
        "reasonForIncompletion": "the JOIN's forked task failed",
        "tasks": [_task("j", "JOIN", "CANCELED")],
    }
    run = WorkflowRun.from_json(wf)
    assert "no reason given" not in run.failure
    assert run.failure.endswith("the JOIN's forked task failed")
    assert WorkflowRun.from_json({**wf, "tasks": []}).failure == "the JOIN's forked task failed"


def test_reused_and_run_steps_are_counted_inside_completed_sub_workflows() -> None:
    """Issue 40: `perago run --wait` says which incremental steps reused a publication."""
    ran = _task("clean", "orders_clean", "COMPLETED", outputData={"workspace": {}, "result": {}})
    wf = {**PARENT, "status": "COMPLETED", "tasks": [ran, *PARENT["tasks"][:2]]}
    run = WorkflowRun.from_json(wf, child={"child-2": DONE}.__getitem__)
    assert run.reused == ("m_2/month",) and run.ran == ("clean",)
