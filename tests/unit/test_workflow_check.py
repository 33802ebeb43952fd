"""`perago register` checks nested workflow tasks against the Perago tasks they use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from perago._api.task import WorkspaceSpec, task
from perago.adapters.conductor import workflow_steps
from perago.conductor.workflow_check import workflow_problems as _problems


def workflow_problems(wf: dict[str, Any], tasks: dict[str, Any]) -> list[str]:
    return _problems(workflow_steps(wf), tasks)


class Day(BaseModel):
    day: str
    rows: int = 1


class Out(BaseModel):
    n: int = 0


@task("wc_day", workspace=WorkspaceSpec(prefix="events/day={day}/"))
def day_task(workspace: Path, params: Day) -> Out:
    return Out()


TASKS = {"wc_day": day_task}
WS = "${workflow.input.workspace}"


def use(ref: str, params: Any, **extra: Any) -> dict[str, Any]:
    inputs = {"workspace": WS, "params": params, **extra}
    return {"name": "wc_day", "taskReferenceName": ref, "type": "SIMPLE", "inputParameters": inputs}


def test_a_good_workflow_has_no_problems() -> None:
    wf = {
        "name": "ok",
        "tasks": [use("a", {"day": "${workflow.input.day}"}), use("b", {"day": "d1"})],
    }
    assert workflow_problems(wf, TASKS) == []


def test_problems_are_found_in_every_nested_construct_and_name_workflow_and_ref() -> None:
    fork = {"type": "FORK_JOIN", "forkTasks": [[use("in_fork", {"day": "a/b"})]]}
    loop = {"type": "DO_WHILE", "loopOver": [use("in_loop", {"day": "d", "rows": "many"})]}
    switch = {
        "type": "SWITCH",
        "decisionCases": {"x": [use("in_case", {})]},
        "defaultCase": [
            {
                "name": "wc_day",
                "taskReferenceName": "in_default",
                "type": "SIMPLE",
                "inputParameters": {"params": {"day": "d"}},
            }
        ],
    }
    sub = {
        "type": "SUB_WORKFLOW",
        "subWorkflowParam": {
            "workflowDefinition": {"name": "child", "tasks": [use("in_sub", {"rows": 2})]}
        },
    }
    dyn = {"type": "FORK_JOIN_DYNAMIC", "taskReferenceName": "dyn"}
    problems = workflow_problems({"name": "wf", "tasks": [fork, loop, switch, sub, dyn]}, TASKS)
    text = "\n".join(problems)
    assert "workflow 'wf', task 'in_fork' (wc_day): params field 'day' = 'a/b'" in text
    assert "workflow 'wf', task 'in_loop' (wc_day): params 'rows'" in text
    assert "task 'in_case' (wc_day): params field 'day' is required" in text
    assert "task 'in_case' (wc_day): params lack 'day', which fills the workspace prefix" in text
    assert "task 'in_default' (wc_day): inputParameters lack \"workspace\"" in text
    assert "workflow 'wf > child', task 'in_sub'" in text
    assert "task 'dyn': FORK_JOIN_DYNAMIC needs 'dynamicForkTasksParam'" in text


class Month(BaseModel):
    month: str


@task(
    "wc_report",
    workspace=WorkspaceSpec(
        prefix="reports/month={month}/",
        inputs={"facts": "clean/month={month}/", "customers": "dims/customers/"},
    ),
)
def report_task(workspace: Path, params: Month, inputs: Any) -> Out:
    return Out()


def report(ref: str, params: Any, **extra: Any) -> dict[str, Any]:
    return {**use(ref, params, **extra), "name": "wc_report"}


def test_input_sources_are_checked_where_constant() -> None:
    tasks = {"wc_report": report_task, **TASKS}
    good = [
        report("a", {"month": "01"}),
        report("b", {"month": "01"}, inputs=None),
        report("c", {"month": "01"}, inputs="${workflow.input.inputs}"),
        report("d", {"month": "01"}, inputs={"customers": {"repository": "ref-data", "ref": "v1"}}),
        report("e", {"month": "01"}, inputs={"customers": {"ref": "${workflow.input.tag}"}}),
    ]
    assert workflow_problems({"name": "ok", "tasks": good}, tasks) == []
    bad = [
        report("unknown", {"month": "01"}, inputs={"dims": {"ref": "v1"}}),
        report("shape", {"month": "01"}, inputs={"customers": "v1"}),
        report("field", {"month": "01"}, inputs={"customers": {"branch": "main"}}),
        report("repo", {"month": "01"}, inputs={"customers": {"repository": "Bad_Repo"}}),
        report("undeclared", {"day": "d"}, inputs={"x": None}) | {"name": "wc_day"},
        report("fill", {}),
    ]
    text = "\n".join(workflow_problems({"name": "wf", "tasks": bad}, tasks))
    assert "task 'unknown' (wc_report): \"inputs\" names ['dims'], which the task does not" in text
    assert "task 'shape' (wc_report): \"inputs\" 'customers' must be" in text
    assert "task 'field' (wc_report): \"inputs\" 'customers' branch: Extra inputs" in text
    assert "task 'repo' (wc_report): \"inputs\" 'customers' repository: String should" in text
    assert "task 'undeclared' (wc_day): \"inputs\" names ['x'], which the task does not" in text
    assert "(its inputs are none)" in text
    assert "task 'fill' (wc_report): params lack 'month', which fills input 'facts'" in text


def test_register_and_the_worker_refuse_the_same_misspelled_params_key(tmp_path: Path) -> None:
    """One rule both ways: a typo in constant params is a problem for `perago register`
    exactly when the worker would refuse it (PERAGO_PARAMS_EXTRA)."""
    from perago._api.task_io import check_param_keys
    from perago.errors import GuardrailError

    wf = {"name": "typo", "tasks": [use("a", {"day": "d1", "rwos": 3})]}
    (problem,) = workflow_problems(wf, TASKS)
    assert "params ['rwos'] are not fields of Day (its params are ['day', 'rows'])" in problem
    try:
        check_param_keys(day_task, {"day": "d1", "rwos": 3})
    except GuardrailError as e:
        assert "unknown params ['rwos']" in e.message
    else:
        raise AssertionError("the worker accepted a key register refused")
    dynamic = {"name": "dyn", "tasks": [use("a", {"day": "${workflow.input.day}", "rwos": "${x}"})]}
    assert "'rwos'" in workflow_problems(dynamic, TASKS)[0]  # the key is known, not its value
    ignored = _problems(workflow_steps(wf), TASKS, params_extra="ignore")
    assert ignored == []


plain_day = task(
    "wc_plain_day", workspace=WorkspaceSpec(prefix="events/day={day}/"), body_retries=0
)(day_task.fn)


def test_register_warns_of_a_fork_of_tasks_that_leave_their_retries_to_conductor() -> None:
    from perago.conductor.workflow_check import fork_retry_warnings

    tasks = {"wc_day": day_task, "wc_plain_day": plain_day}
    plain = {**use("plain", {"day": "d1"}), "name": "wc_plain_day"}
    static = {
        "name": "static",
        "tasks": [
            {"type": "FORK_JOIN", "forkTasks": [[use("tried_inside", {"day": "d2"})], [plain]]},
            {**plain, "taskReferenceName": "after_the_join"},  # not in a fork: no JOIN race
        ],
    }
    dynamic = {
        "name": "dynamic",
        "tasks": [
            {
                "type": "FORK_JOIN_DYNAMIC",
                "taskReferenceName": "days",
                "forkTaskName": "wc_plain_day",
                "forkTaskInputs": "${workflow.input.days}",
            }
        ],
    }
    sub = {
        "name": "wrapped",
        "tasks": [
            {
                "type": "FORK_JOIN",
                "forkTasks": [
                    [
                        {
                            "type": "SUB_WORKFLOW",
                            "taskReferenceName": "child",
                            "subWorkflowParam": {
                                "workflowDefinition": {"name": "one", "tasks": [plain]}
                            },
                        }
                    ]
                ],
            }
        ],
    }
    static_warnings = fork_retry_warnings(workflow_steps(static), tasks)
    assert len(static_warnings) == 1
    assert "task 'plain' (wc_plain_day) runs in a fork" in static_warnings[0]
    assert "body_retries=0" in static_warnings[0] and "SUB_WORKFLOW" in static_warnings[0]
    (dynamic_warning,) = fork_retry_warnings(workflow_steps(dynamic), tasks)
    assert "task 'days[*]' (wc_plain_day)" in dynamic_warning
    assert workflow_problems(dynamic, tasks) == []  # its inputs come from a list at run time
    assert fork_retry_warnings(workflow_steps(sub), tasks) == []  # the child has no JOIN
