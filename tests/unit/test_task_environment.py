"""perago.testing.run_task / TaskEnvironment: a task function run directly, info() set."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

import perago
from perago import ResultValidationError, WorkspaceSpec, task
from perago.errors import GuardrailError, NoAttemptError
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


def test_info_outside_an_attempt_says_how_to_test_a_task() -> None:
    with pytest.raises(NoAttemptError, match=r"perago\.testing\.run_task"):
        perago.info()


class Strict(BaseModel):
    rank: int = 10
    alpha: float = Field(default=0.1, alias="regParam")


@task("strict_task", workspace=WorkspaceSpec(prefix="data/"))
def strict_task(workspace: Path, params: Strict) -> Result:
    return Result(retry=0, where="", n=params.rank)


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    rank: int = 10


@task("loose_task", workspace=WorkspaceSpec(prefix="data/"))
def loose_task(workspace: Path, params: Loose) -> Result:
    return Result(retry=0, where="", n=params.rank)


def test_unknown_params_keys_are_refused_unless_the_model_takes_extras(tmp_path: Path) -> None:
    with pytest.raises(GuardrailError, match=r"unknown params \['rnak'\].*PERAGO_PARAMS_EXTRA"):
        run_task(strict_task, tmp_path, {"rnak": 3})
    assert run_task(strict_task, tmp_path, {"rank": 3, "regParam": 0.5}).n == 3  # an alias
    assert run_task(loose_task, tmp_path, {"rnak": 3}).n == 10  # the model's own choice
