"""Workflow-level write-audit-publish (`perago.wap`) on the real servers: the steps publish on
the workflow's isolated branch, an audit step checks it, and the target gets everything as one
publication, or nothing."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perago.core.lakefs_names import wap_branch_name

from .harness import (
    attempts,
    perago_cli,
    publications,
    put_workflow,
    register_tasks,
    simple_task,
    start,
    wait_workflow,
    worker,
)

WAP = "perago.wap"


def wap_workflow(conductor: Any, name: str, unique: str, *, audit: dict[str, str]) -> None:
    begin = simple_task("perago_wap_begin", "begin", "${workflow.input.workspace}", {})
    a = simple_task(
        f"pt_write_{unique}",
        "a",
        "${begin.output.workspace}",
        {"files": {"a.txt": "1"}, "sleep": "${workflow.input.sleep}"},
    )
    b = simple_task(f"pt_write_{unique}", "b", "${a.output.workspace}", {"files": {"b.txt": "2"}})
    check = simple_task(f"pt_read_{unique}", "audit", "${b.output.workspace}", {"require": audit})
    publish = simple_task(
        "perago_wap_publish",
        "publish",
        "${audit.output.workspace}",
        {
            "target_branch": "${begin.output.result.target_branch}",
            "base": "${begin.output.result.base}",
        },
    )
    put_workflow(conductor, name, [begin, a, b, check, publish])


def _env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    env = make_env()
    register_tasks(env, WAP)
    return env


def _branches(store: Any, repo: str) -> list[str]:
    return [name for name, _ in store.list_branches(repo, prefix="perago-wap-")]


def test_everything_lands_as_one_publication_and_the_isolated_branch_goes(
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = _env(make_env)
    wap_workflow(conductor, f"wap_ok_{unique}", unique, audit={"a.txt": "1", "b.txt": "2"})
    base = store.branch_head(repo, "main")
    with worker(env, tmp_path / "w.log", extra_args=[WAP]):
        wf = wait_workflow(conductor, start(conductor, f"wap_ok_{unique}", repo, sleep=0))
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.parents[0] == base  # one publication on top of the base
    assert head.metadata["perago.task_ref"] == "publish" and head.metadata["perago.scope"] == ""
    assert [c.id for c in publications(store, repo)] == [head.id]
    tree = {o.path for o in store.list_objects(repo, "main", "data/")}
    assert tree == {"data/a.txt", "data/b.txt"}
    assert wf["output"]["workspace"]["ref"] == head.id
    assert _branches(store, repo) == []


def test_a_failing_audit_leaves_the_target_untouched_and_the_janitor_clears_up(
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = _env(make_env)
    wap_workflow(conductor, f"wap_bad_{unique}", unique, audit={"a.txt": "not what was written"})
    base = store.branch_head(repo, "main")
    with worker(env, tmp_path / "w.log", extra_args=[WAP]):
        wf = wait_workflow(conductor, start(conductor, f"wap_bad_{unique}", repo, sleep=0))
    assert wf["status"] == "FAILED"
    assert "audit failed" in attempts(wf, "audit")[-1]["reasonForIncompletion"]
    assert store.branch_head(repo, "main") == base
    (isolated,) = _branches(store, repo)
    assert {o.path for o in store.list_objects(repo, isolated, "data/")} == {
        "data/a.txt",
        "data/b.txt",
    }
    done = perago_cli(["janitor", "--repository", repo], env)
    assert done.returncode == 0, done.stderr
    assert f"removed {repo}/{isolated}: workflow FAILED" in done.stdout
    assert _branches(store, repo) == []


def test_a_running_worker_removes_the_isolated_branch_of_a_failed_workflow(
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """No manual janitor: the worker's periodic sweep (PERAGO_WAP_SWEEP_INTERVAL) removes the
    isolated branch once its workflow failed its audit."""
    env = {**_env(make_env), "PERAGO_WAP_SWEEP_INTERVAL": "1"}
    wap_workflow(conductor, f"wap_sweep_{unique}", unique, audit={"a.txt": "wrong"})
    base = store.branch_head(repo, "main")
    with worker(env, tmp_path / "w.log", extra_args=[WAP]) as w:
        wid = start(conductor, f"wap_sweep_{unique}", repo, sleep=0)
        wf = wait_workflow(conductor, wid)
        assert wf["status"] == "FAILED"
        removed = w.wait_for("janitor_removed", wap_branch=wap_branch_name(wid), timeout=30)
    assert removed["reason"] == "workflow FAILED"
    assert _branches(store, repo) == []
    assert store.branch_head(repo, "main") == base


def test_a_target_that_moved_meanwhile_fails_closed_and_a_lost_answer_publishes_once(
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = _env(make_env)
    wap_workflow(conductor, f"wap_race_{unique}", unique, audit={})
    with worker(env, tmp_path / "w.log", extra_args=[WAP]) as w:
        wid = start(conductor, f"wap_race_{unique}", repo, sleep=3)
        w.wait_for("wap_branch_created")
        store.upload_bytes(repo, "main", "other/x.txt", b"foreign")
        foreign = store.commit(repo, "main", message="someone else", metadata={}).id
        wf = wait_workflow(conductor, wid)
    assert wf["status"] == "FAILED"
    (publish,) = attempts(wf, "publish")  # terminal: a retry from the same base cannot pass
    assert publish["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert "moved since the workflow began" in publish["reasonForIncompletion"]
    assert store.branch_head(repo, "main") == foreign

    # The publish step dies right after its merge landed; its retry finds it and replaces it.
    base = store.branch_head(repo, "main")
    wid = start(conductor, f"wap_race_{unique}", repo, sleep=0)
    with worker(env, tmp_path / "t.log"):  # the test tasks
        with worker(
            {**env, "PERAGO_FAILPOINTS": "after_publish=kill"}, tmp_path / "k.log", module=WAP
        ) as k:
            assert k.wait_killed(conductor, wid) == -signal.SIGKILL
        with worker(env, tmp_path / "p.log", module=WAP):
            wf = wait_workflow(conductor, wid, timeout=120, nudge=True)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.parents[0] == base  # exactly one publication of the workflow in effect
    assert [t["status"] for t in attempts(wf, "publish")] == ["FAILED", "COMPLETED"]
    assert wap_branch_name(wid) not in _branches(store, repo)  # removed after publishing
