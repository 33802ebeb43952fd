from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from perago import RemoteWorkspace, TaskDefinitionError, WorkspaceSpec, task
from perago.adapters.conductor import task_def


class P(BaseModel):
    n: int = 1


class R(BaseModel):
    ok: bool


def test_decorated_function_keeps_its_types_and_options() -> None:
    @task(
        "good_task",
        workspace=WorkspaceSpec(prefix="a/b"),
        retry_count=5,
        response_timeout=timedelta(seconds=30),
    )
    def good(workspace: Path, params: P) -> R:
        return R(ok=params.n == 1)

    assert good.params_type is P and good.result_type is R
    assert good.workspace.prefix == "a/b/"
    assert good(Path("."), P()) == R(ok=True)
    d = task_def(good)
    assert d["name"] == "good_task"
    assert d["retryCount"] == 5 and d["responseTimeoutSeconds"] == 30
    assert d["timeoutSeconds"] >= d["responseTimeoutSeconds"]
    # Small by default (Conductor copies it into every task it schedules): no schemas.
    assert not {"inputSchema", "outputSchema", "enforceSchema"} & set(d)
    assert d["inputKeys"] == ["workspace", "params"]
    # Asked for: the models as JSON schemas (stored, not enforced by Conductor OSS).
    d = task_def(good, schemas=True)
    assert d["inputSchema"]["name"] == "good_task_input" and d["inputSchema"]["type"] == "JSON"
    assert d["inputSchema"]["data"]["properties"]["params"] == P.model_json_schema()
    assert d["inputSchema"]["data"]["properties"]["workspace"]["required"] == [
        "repository",
        "branch",
    ]
    assert d["outputSchema"]["data"]["properties"]["result"] == R.model_json_schema()
    assert d["outputSchema"]["data"]["required"] == ["workspace", "result"]
    assert d["enforceSchema"] is False


def test_a_definitions_description_is_its_docstrings_first_paragraph() -> None:
    @task("described_task", workspace=WorkspaceSpec(prefix="a/"))
    def described(workspace: Path, params: P) -> R:
        """Clean the orders
        of one day.

        Everything below the first paragraph stays out of Conductor's copy of it."""
        return R(ok=True)

    @task("long_task", workspace=WorkspaceSpec(prefix="a/"))
    def long(workspace: Path, params: P) -> R:
        return R(ok=True)

    long.fn.__doc__ = "word " * 100
    assert task_def(described)["description"] == "Clean the orders of one day."
    assert len(task_def(long)["description"]) == 200
    assert task_def(long)["description"].endswith("…")


@pytest.mark.parametrize(
    "prefix", ["", "/", "/abs/", "a/../b", "./a", "a//b", "a\\b", "_perago/x", "_lakefs_actions/"]
)
def test_unsafe_or_reserved_prefixes_are_rejected(prefix: str) -> None:
    with pytest.raises(TaskDefinitionError):
        WorkspaceSpec(prefix=prefix)


def test_wrong_signatures_are_rejected_at_decoration() -> None:
    deco = task("t", workspace=WorkspaceSpec(prefix="x/"))
    with pytest.raises(TaskDefinitionError, match="must be annotated Path"):
        deco(lambda workspace, params: None)

    def untyped_params(workspace: Path, params: dict) -> R:  # type: ignore[type-arg]
        return R(ok=True)

    with pytest.raises(TaskDefinitionError, match="params parameter"):
        deco(untyped_params)

    def wrong_return(workspace: Path, params: P) -> dict:  # type: ignore[type-arg]
        return {}

    with pytest.raises(TaskDefinitionError, match="return type"):
        deco(wrong_return)

    def third(workspace: Path, params: P, other: int) -> R:
        return R(ok=True)

    with pytest.raises(TaskDefinitionError, match="spark"):
        deco(third)


def test_in_place_tasks_must_take_a_remote_workspace() -> None:
    spec = WorkspaceSpec(prefix="big/", in_place=True)

    def local(workspace: Path, params: P) -> R:
        return R(ok=True)

    with pytest.raises(TaskDefinitionError, match="RemoteWorkspace"):
        task("t", workspace=spec)(local)

    def remote(workspace: RemoteWorkspace, params: P) -> R:
        return R(ok=True)

    assert task("t", workspace=spec)(remote).workspace.in_place
    with pytest.raises(TaskDefinitionError, match="Path"):
        task("t", workspace=WorkspaceSpec(prefix="x/"))(remote)


@pytest.mark.parametrize("name", ["", "1abc", "has space", "x" * 200])
def test_bad_task_names(name: str) -> None:
    with pytest.raises(TaskDefinitionError):
        task(name, workspace=WorkspaceSpec(prefix="x/"))


def test_response_timeout_cannot_exceed_timeout() -> None:
    with pytest.raises(TaskDefinitionError, match="must not exceed"):
        task(
            "t",
            workspace=WorkspaceSpec(prefix="x/"),
            timeout=timedelta(seconds=10),
            response_timeout=timedelta(seconds=20),
        )
