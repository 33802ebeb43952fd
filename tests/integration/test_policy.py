"""Least privilege on the real servers: a worker refuses targets, sources and protected
branches its settings do not allow, before it reads anything; write-audit-publish is the
one way onto a protected branch; hostile task input is refused cleanly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .harness import (
    attempts,
    publications,
    put_workflow,
    register_tasks,
    simple_task,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration
WS = "${workflow.input.workspace}"


def write_step(unique: str, ref: str = "w", workspace: str = WS) -> dict[str, Any]:
    return simple_task(f"pt_write_{unique}", ref, workspace, {"files": {"p.txt": ref}})


def test_targets_and_protected_branches(
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = make_env(PERAGO_TEST_RETRIES="2")
    register_tasks(env, "perago.wap")
    other = f"{repo}-x"
    store.create_repository(other)
    try:
        policy = {
            **env,
            "PERAGO_ALLOWED_TARGETS": f"{repo}/*",
            "PERAGO_PROTECTED_BRANCHES": "main",
        }
        put_workflow(conductor, f"pol_direct_{unique}", [write_step(unique)])
        begin = simple_task("perago_wap_begin", "begin", WS, {})
        publish = simple_task(
            "perago_wap_publish",
            "publish",
            "${w.output.workspace}",
            {
                "target_branch": "${begin.output.result.target_branch}",
                "base": "${begin.output.result.base}",
            },
        )
        put_workflow(
            conductor,
            f"pol_wap_{unique}",
            [begin, write_step(unique, workspace="${begin.output.workspace}"), publish],
        )
        base, other_base = store.branch_head(repo, "main"), store.branch_head(other, "main")
        with worker(policy, tmp_path / "w.log", extra_args=["perago.wap"]) as w:
            elsewhere = wait_workflow(conductor, start(conductor, f"pol_direct_{unique}", other))
            direct = wait_workflow(conductor, start(conductor, f"pol_direct_{unique}", repo))
            hostile = wait_workflow(
                conductor, start(conductor, f"pol_direct_{unique}", repo, ref="main..dev")
            )
            audited = wait_workflow(conductor, start(conductor, f"pol_wap_{unique}", repo))
        refusals = [e for e in w.events() if e.get("event") == "pre_guardrails_failed"]
        assert store.branch_head(other, "main") == other_base  # nothing written there
        assert staging_branches(store, other) == []
    finally:
        store.delete_repository(other)
    # another repository: refused at once, no retry spent, nothing read or written there
    (only,) = attempts(elsewhere, "w")
    assert only["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert (
        f"may not publish to {other}/main: PERAGO_ALLOWED_TARGETS allows only {repo}/*"
        in (only["reasonForIncompletion"])
    )
    # the protected branch: refused, pointing at write-audit-publish
    (only,) = attempts(direct, "w")
    assert only["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert (
        "the branch is protected (PERAGO_PROTECTED_BRANCHES=main)"
        in (only["reasonForIncompletion"])
    )
    (only,) = attempts(hostile, "w")
    assert only["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert "not a lakeFS ref" in only["reasonForIncompletion"]
    assert len(refusals) == 3
    # ... and the same step through write-audit-publish lands there
    assert audited["status"] == "COMPLETED", audited.get("reasonForIncompletion")
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.parents[0] == base and head.metadata["perago.task_ref"] == "publish"
    assert [c.id for c in publications(store, repo)] == [head.id]
    assert staging_branches(store, repo) == []


def test_an_input_from_a_source_that_is_not_allowed(
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    module = "tests.integration.taskmods.input_tasks"
    env = make_env(module)
    store.upload_bytes(repo, "main", "parts/p=a/rows.csv", b"a,0\n")
    store.upload_bytes(repo, "main", "dims/d/dim.csv", b"ours")
    base = store.commit(repo, "main", message="seed", metadata={}).id
    step = simple_task(f"in_summary_{unique}", "s", WS, {"part": "a"})
    step["inputParameters"]["inputs"] = {"dim": {"repository": f"{repo}-secret"}}
    put_workflow(conductor, f"pol_input_{unique}", [step])
    policy = {**env, "PERAGO_ALLOWED_SOURCES": f"{repo}/*"}
    with worker(policy, tmp_path / "w.log", module=module):
        wf = wait_workflow(conductor, start(conductor, f"pol_input_{unique}", repo))
    (only,) = attempts(wf, "s")
    assert only["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert (
        f"input 'dim' of in_summary_{unique} may not be read from repository {repo}-secret"
        in (only["reasonForIncompletion"])
    )
    assert store.branch_head(repo, "main") == base
