"""Errors of the code end a task at once; transient ones are retried (issue 39, item 3)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from perago import CODE_ERRORS, TaskDefinitionError, WorkspaceSpec, task
from perago._api.task import is_terminal
from perago.testing import MemoryStore, StubOrchestrator, running_worker


class P(BaseModel):
    kind: str = "name"


class R(BaseModel):
    ok: bool = True


class FlakyNetwork(Exception):
    pass


def _body(workspace: Path, params: P) -> R:
    if params.kind == "name":
        return undefined_helper(workspace)  # type: ignore[name-defined]  # noqa: F821
    if params.kind == "type":
        return R(ok=len(3))  # type: ignore[arg-type]
    raise FlakyNetwork("connection reset by peer")


NOW = timedelta(0)  # no wait between a body's tries
strict = task("te_strict", workspace=WorkspaceSpec(prefix="out/"), retry_count=2, retry_delay=NOW)(
    _body
)
lenient = task(
    "te_lenient",
    workspace=WorkspaceSpec(prefix="out/"),
    retry_count=2,
    retry_delay=NOW,
    terminal_errors=(),
)(_body)
own = task(
    "te_own",
    workspace=WorkspaceSpec(prefix="out/"),
    retry_count=2,
    retry_delay=NOW,
    terminal_errors=(*CODE_ERRORS, FlakyNetwork),
)(_body)


def _run(tmp_path: Path, name: str, kind: str) -> list[tuple[str, str]]:
    store = MemoryStore()
    store.create_repository("repo")
    stub = StubOrchestrator()
    with running_worker(
        [strict, lenient, own], store=store, orchestrator=stub, work_dir=tmp_path / "w"
    ):
        stub.submit(
            name,
            {"workspace": {"repository": "repo", "branch": "main"}, "params": {"kind": kind}},
            workflow_id="wf",
            retries=2,  # the tasks' retry_count, as Conductor has it from their definition
        )
        stub.wait_for(lambda s: s.settled("wf"))
    out = []
    for attempt in stub.attempts("wf"):
        outcome = stub.outcome(attempt.task_id)
        assert outcome is not None
        out.append((outcome.status, outcome.reason))
    return out


@pytest.mark.parametrize("kind", ["name", "type"])
def test_a_code_error_fails_the_task_after_one_attempt(tmp_path: Path, kind: str) -> None:
    [(status, reason)] = _run(tmp_path, "te_strict", kind)
    assert status == "FAILED_WITH_TERMINAL_ERROR"
    assert ("NameError" if kind == "name" else "TypeError") in reason
    assert "not retried: an error of the code" in reason and "terminal_errors=()" in reason
    assert "test_terminal_errors.py" in reason  # the line of the author's code


def test_other_errors_are_retried_inside_the_attempt(tmp_path: Path) -> None:
    [(status, reason)] = _run(tmp_path, "te_strict", "flaky")  # one Conductor attempt
    assert status == "FAILED_WITH_TERMINAL_ERROR"
    assert "FlakyNetwork: connection reset by peer" in reason
    assert "the body failed all 3 tries of this attempt" in reason


def test_a_task_can_retry_code_errors_or_name_its_own_terminal_ones(tmp_path: Path) -> None:
    [(status, reason)] = _run(tmp_path / "a", "te_lenient", "name")
    assert status == "FAILED_WITH_TERMINAL_ERROR" and "all 3 tries" in reason
    [(status, reason)] = _run(tmp_path / "b", "te_own", "flaky")
    assert status == "FAILED_WITH_TERMINAL_ERROR" and "not retried: an error of the code" in reason


def test_dotted_names_match_a_class_of_that_name_in_that_package() -> None:
    analysis = type("AnalysisException", (Exception,), {"__module__": "pyspark.errors.base"})
    other = type("AnalysisException", (Exception,), {"__module__": "mylib.errors"})
    assert is_terminal(analysis("no column x"), CODE_ERRORS)
    assert not is_terminal(other("x"), CODE_ERRORS)
    assert is_terminal(type("Sub", (analysis,), {})("x"), CODE_ERRORS)  # a subclass
    with pytest.raises(TaskDefinitionError, match="terminal_errors takes"):
        task("te_bad", workspace=WorkspaceSpec(prefix="x/"), terminal_errors=("NameError",))
