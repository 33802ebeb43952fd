"""perago.testing.run_task / TaskEnvironment: a task function run directly, info() set."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

import perago
from perago import ResultValidationError, WorkspaceSpec, task
from perago.testing import TaskEnvironment, run_task


class Params(BaseModel):
    n: int = 1


class Result(BaseModel):
    retry: int
    where: str
    n: int


@task("env_task", workspace=WorkspaceSpec(prefix="data/"))
def env_task(workspace: Path, params: Params) -> Result:
    me = perago.info()
    (workspace / "out.txt").write_text(me.task_id)
    return Result(retry=me.retry_count, where=f"{me.repository}/{me.branch}", n=params.n)


@task("bad_result", workspace=WorkspaceSpec(prefix="data/"))
def bad_result(workspace: Path, params: Params) -> Result:
    return {"retry": "no"}  # type: ignore[return-value]


def test_run_task_sets_info_and_validates_params(tmp_path: Path) -> None:
    result = run_task(env_task, tmp_path, {"n": 3}, retry_count=2, repository="lake")
    assert result == Result(retry=2, where="lake/main", n=3)
    assert (tmp_path / "out.txt").read_text() == "test-task"
    with pytest.raises(LookupError):
        perago.info()  # only inside the task


def test_task_environment_keeps_its_info_and_checks_the_result(tmp_path: Path) -> None:
    env = TaskEnvironment(task_id="t-1")
    assert env.run(env_task, tmp_path, Params(n=5)).n == 5
    assert (tmp_path / "out.txt").read_text() == "t-1" == env.info.task_id
    with pytest.raises(ResultValidationError, match="does not validate"):
        env.run(bad_result, tmp_path)
