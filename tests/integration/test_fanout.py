"""Parallel workflows on the real servers: fan-out writers of disjoint scopes all publish.

After each workflow: exactly one publication per completed writing step, nothing lost from
the head, no staging branch after the janitor, no branch lease held.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perago import config
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.publish.expected_head_hook import install
from perago.worker.failpoints import POINTS
from perago_dev.s3_stack import lakefs_beside

from .harness import (
    attempt_spans,
    attempts,
    dynamic_fork,
    foreign_commit,
    fork,
    held_leases,
    perago_cli,
    publications,
    put_workflow,
    simple_task,
    staging_branches,
    start,
    text,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration
PINNED = "${workflow.input.workspace}"


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(PERAGO_TEST_RETRIES="1")


def part_task(unique: str, ref: str, part: str, **params: Any) -> dict[str, Any]:
    return simple_task(f"pt_part_{unique}", ref, PINNED, {"part": part, **params})


def join_step(unique: str, after: list[str]) -> dict[str, Any]:
    workspace = {
        "repository": "${workflow.input.workspace.repository}",
        "branch": "${workflow.input.workspace.branch}",
        "after": [f"${{{ref}.output.workspace.ref}}" for ref in after],
    }
    return {
        "name": f"pt_join_{unique}",
        "taskReferenceName": "joined",
        "type": "SIMPLE",
        "inputParameters": {"workspace": workspace, "params": {}},
    }


def assert_clean(store: LakeFSStore, repo: str, env: dict[str, str], steps: set[str]) -> None:
    """One publication per completed writing step, no lease held, no staging after janitor."""
    pubs = publications(store, repo)
    refs = sorted(c.metadata["perago.task_ref"] for c in pubs)
    assert refs == sorted(steps), refs
    assert held_leases(store, repo) == []
    done = perago_cli(["janitor", "--repository", repo], env)
    assert done.returncode == 0, done.stderr
    assert staging_branches(store, repo) == []


def test_fork_join_of_disjoint_writers_both_publish_and_the_join_reads_both(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = f"pt_wf_fork_{unique}"
    branches = [
        [part_task(unique, "left", "a", sleep=1)],
        [part_task(unique, "right", "b", sleep=1)],
    ]
    put_workflow(conductor, name, [*fork("split", branches), join_step(unique, ["left", "right"])])
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    with worker(env, tmp_path / "w.log", concurrency=2) as w:
        wf = wait_workflow(conductor, wid)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    left, right = (attempts(wf, r)[-1]["outputData"]["workspace"]["ref"] for r in ("left", "right"))
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.id in (left, right) and {left, right} - {head.id} == {head.parents[0]}
    assert text(store, repo, "parts/p=a/rows.csv").startswith("a,0")
    assert text(store, repo, "parts/p=b/rows.csv").startswith("b,0")
    joined = attempts(wf, "joined")[-1]["outputData"]
    assert joined["result"] == {"parts": ["a", "b"], "rows": 6}
    assert joined["workspace"]["ref"] == head.id
    decisions = {e.get("decision") for e in w.events() if e.get("event") == "publish_fence_passed"}
    assert "disjoint_publication" in decisions
    assert_clean(store, repo, env, {"left", "right"})


def test_fork_join_of_overlapping_writers_one_lands_the_other_fails_closed(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = make_env(PERAGO_TEST_RETRIES="0")
    name = f"pt_wf_overlap_{unique}"
    wide = simple_task(f"pt_parts_all_{unique}", "wide", PINNED, {"part": "all", "sleep": 1})
    put_workflow(
        conductor, name, fork("split", [[part_task(unique, "narrow", "a", sleep=1)], [wide]])
    )
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    with worker(env, tmp_path / "w.log", concurrency=2):
        wf = wait_workflow(conductor, wid)
    assert wf["status"] == "FAILED"
    done = {r: attempts(wf, r)[-1] for r in ("narrow", "wide")}
    statuses = sorted(t["status"] for t in done.values())
    # The fork pinned its input ref: a retry could never pass, so the loser is terminal.
    assert statuses == ["COMPLETED", "FAILED_WITH_TERMINAL_ERROR"], statuses
    winner = next(r for r, t in done.items() if t["status"] == "COMPLETED")
    loser = next(t for t in done.values() if t["status"] == "FAILED_WITH_TERMINAL_ERROR")
    reason = loser["reasonForIncompletion"]
    assert "pinned its input ref" in reason
    assert "overlapping this step's scope" in reason or "lakeFS rejected the merge" in reason
    assert f"step {winner!r}" in reason or "lakeFS rejected the merge" in reason
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.parents[0] == input_ref
    assert head.id == done[winner]["outputData"]["workspace"]["ref"]
    assert_clean(store, repo, env, {winner})


def test_a_foreign_commit_after_a_group_member_handed_the_head_on_is_refused(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Two partitions share one grant (one worker) on a repository with the expected-head
    hook, so the second fences on the head the first one's merge made, without reading it.
    A foreign commit lands while the second holds its turn: lakeFS's hook refuses its merge
    (412) and the step fails closed; the first publication and the foreign commit stay."""
    assert install(store, repo, "main") is not None
    env = make_env(PERAGO_TEST_RETRIES="0")
    name = f"pt_wf_handoff_{unique}"
    put_workflow(
        conductor,
        name,
        fork("split", [[part_task(unique, "left", "a")], [part_task(unique, "right", "b")]]),
    )
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    release = tmp_path / "release"
    pausing = {  # the second member's turn pauses after its fence until released
        **env,
        "PERAGO_FAILPOINTS": "after_publish_fence=pause:120@2",
        "PERAGO_FAILPOINTS_RELEASE": str(release),
    }
    with worker(pausing, tmp_path / "w.log", concurrency=2) as w:
        second = w.wait_for("publish_fence_passed", handed_over=True)
        w.wait_for("failpoint_hit", failpoint="after_publish_fence")
        foreign = foreign_commit(store, repo)
        release.touch()
        wf = wait_workflow(conductor, wid)
        joined = [e for e in w.events() if e.get("event") == "branch_lease_joined"]
    assert joined, "the partitions did not share a grant: nothing was tested"
    assert wf["status"] == "FAILED"
    done = {r: attempts(wf, r)[-1] for r in ("left", "right")}
    loser = next(r for r, t in done.items() if t["status"] != "COMPLETED")
    winner = ({"left", "right"} - {loser}).pop()
    assert loser == second["task_ref"]
    reason = done[loser]["reasonForIncompletion"]
    assert "lakeFS rejected the merge" in reason and "412" in reason, reason
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.id == foreign.id  # never replaced, nothing published on top of it
    assert head.parents[0] == done[winner]["outputData"]["workspace"]["ref"]
    assert_clean(store, repo, env, {winner})


def test_a_foreign_commit_before_a_group_merge_fails_closed_on_a_lakefs_that_runs_no_hooks(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    stack_env: dict[str, str],
    unique: str,
    tmp_path: Path,
) -> None:
    """Issue 38 on real servers: a second lakeFS with ``actions.enabled: false`` and a
    repository with the hook's file (it never runs there). Two partitions share a grant; a
    foreign commit lands after the first member's publish fence, before its merge. That
    merge lands on the foreign commit, hands nothing on (its first parent is not the head
    the fence saw) and fails its post-publish check; the second member reads the head, sees
    the foreign commit and fails closed. Nothing completes over the foreign commit. (With a
    merge commit handed on as the member built it, the second completed over it.)"""
    release = tmp_path / "release"
    with lakefs_beside(tmp_path / "lakefs", actions=False) as endpoint:
        other = LakeFSStore(
            config.load(
                env={
                    **stack_env,
                    "LAKECTL_SERVER_ENDPOINT_URL": endpoint,
                    "PERAGO_WORK_DIR": str(tmp_path / "client"),
                }
            )
        )
        try:
            repo = f"t-{unique}"
            other.create_repository(repo)
            assert install(other, repo, "main") is not None
            env = make_env(
                PERAGO_TEST_RETRIES="0",
                LAKECTL_SERVER_ENDPOINT_URL=endpoint,
                PERAGO_FAILPOINTS="after_publish_fence=pause:120@1",
                PERAGO_FAILPOINTS_RELEASE=str(release),
            )
            name = f"pt_wf_nohooks_{unique}"
            put_workflow(
                conductor,
                name,
                fork(
                    "split", [[part_task(unique, "left", "a")], [part_task(unique, "right", "b")]]
                ),
            )
            wid = start(conductor, name, repo, ref=other.branch_head(repo, "main"))
            with worker(env, tmp_path / "w.log", concurrency=2) as w:
                w.wait_for("failpoint_hit", failpoint="after_publish_fence")
                w.wait_for("branch_lease_joined")
                foreign = foreign_commit(other, repo)
                release.touch()
                wf = wait_workflow(conductor, wid)
                w.wait_for("attempt_finished", task_ref="left")  # both members have ended
                w.wait_for("attempt_finished", task_ref="right")
                events = w.events()
            assert wf["status"] == "FAILED"
            done = {r: attempts(wf, r)[-1] for r in ("left", "right")}
            assert all(t["status"] != "COMPLETED" for t in done.values()), done
            assert not any(e.get("handed_over") for e in events), "a head was handed on"
            failed = {e["task_ref"]: e["error"] for e in events if e["event"] == "attempt_failed"}
            assert set(failed) == {"left", "right"}, failed
            # One member's merge landed on the foreign commit and failed its check; the
            # other read the head (nothing was handed on) and failed at its publish fence.
            assert sum("post-publish check" in error for error in failed.values()) == 1, failed
            history = other.log(repo, "main", amount=20)
            ids = [c.id for c in history]
            assert foreign.id in ids  # never replaced
            over = history[: ids.index(foreign.id)]
            # Only the first member's merge landed on it (and failed its check).
            assert [c.metadata.get("perago.kind") for c in over] == ["publication"], over
        finally:
            other.close()


def test_dynamic_fork_over_8_partitions_with_2_workers(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = f"pt_wf_dyn_{unique}"
    put_workflow(
        conductor,
        name,
        dynamic_fork("${workflow.input.dynamicTasks}", "${workflow.input.dynamicTasksInput}"),
    )
    input_ref = store.branch_head(repo, "main")
    workspace = {"repository": repo, "branch": "main", "ref": input_ref}
    days = [f"d{i}" for i in range(8)]
    # No failing partition here: Conductor 3.32's JOIN may fail the workflow on a forked
    # task's FAILED attempt before its retry is scheduled (a race, Netflix/conductor#1851,
    # the fix PR #3640 was closed), so retries inside a fan-out are covered in unit tests.
    tasks = [
        {"name": f"pt_part_{unique}", "taskReferenceName": f"day_{d}", "type": "SIMPLE"}
        for d in days
    ]
    inputs = {f"day_{d}": {"workspace": workspace, "params": {"part": d}} for d in days}
    wid = conductor.start_workflow(
        name, {"workspace": workspace, "dynamicTasks": tasks, "dynamicTasksInput": inputs}
    )
    with (
        worker(env, tmp_path / "a.log", concurrency=2),
        worker(env, tmp_path / "b.log", concurrency=2),
    ):
        wf = wait_workflow(conductor, wid, timeout=180)
    assert wf["status"] == "COMPLETED", [
        (t["referenceTaskName"], t["status"], t.get("retryCount"), t.get("reasonForIncompletion"))
        for t in wf["tasks"]
    ]
    for d in days:
        assert text(store, repo, f"parts/p={d}/rows.csv").startswith(f"{d},0")
    assert_clean(store, repo, env, {f"day_{d}" for d in days})


def _start_sub_workflow_fan_out(
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    params: dict[str, dict[str, Any]],
    writer: str = "pt_part",
) -> str:
    """A DYNAMIC_FORK of one SUB_WORKFLOW per entry of ``params`` (its reference name ->
    the `pt_part` params), each child one ``writer`` step from the same pinned input ref;
    Conductor's retries happen inside the children (docs/tasks.md, "Retries")."""
    name, workflow_input = _sub_workflow_fan_out(conductor, store, repo, unique, params, writer)
    return conductor.start_workflow(name, workflow_input)


def _sub_workflow_fan_out(
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    params: dict[str, dict[str, Any]],
    writer: str = "pt_part",
) -> tuple[str, dict[str, Any]]:
    """The workflows of ``_start_sub_workflow_fan_out``, defined: the parent's name and
    input."""
    child = f"pt_one_part_{writer}_{unique}"
    one = simple_task(f"{writer}_{unique}", "part", PINNED, {})
    one["inputParameters"]["params"] = "${workflow.input.params}"
    conductor.put_workflow_defs(
        [
            {
                "name": child,
                "version": 1,
                "schemaVersion": 2,
                "ownerEmail": "perago@example.com",
                "inputParameters": ["workspace", "params"],
                "tasks": [one],
                "outputParameters": {
                    "workspace": "${part.output.workspace}",
                    "result": "${part.output.result}",
                },
            }
        ]
    )
    name = f"pt_wf_subs_{unique}"
    put_workflow(
        conductor,
        name,
        dynamic_fork("${workflow.input.dynamicTasks}", "${workflow.input.dynamicTasksInput}"),
    )
    workspace = {"repository": repo, "branch": "main", "ref": store.branch_head(repo, "main")}
    tasks = [
        {
            "name": child,
            "taskReferenceName": ref,
            "type": "SUB_WORKFLOW",
            "subWorkflowParam": {"name": child, "version": 1},
        }
        for ref in params
    ]
    inputs = {ref: {"workspace": workspace, "params": p} for ref, p in params.items()}
    return name, {"workspace": workspace, "dynamicTasks": tasks, "dynamicTasksInput": inputs}


def test_run_wait_names_the_failed_task_inside_a_sub_workflow_fan_out(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Issue 39: one partition's child fails on a NameError (terminal, one attempt); `perago
    run --wait` names that task inside its sub-workflow, its real status, the reason with
    file:line, and its task log, never the cancelled JOIN's empty reason."""
    from tests.integration.taskmods import tasks as taskmod

    source = Path(taskmod.__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "parms.part" in text)
    params = {f"day_d{i}": {"part": f"d{i}", "typo": i == 1} for i in range(3)}
    name, workflow_input = _sub_workflow_fan_out(conductor, store, repo, unique, params)
    with worker(env, tmp_path / "w.log", concurrency=3):
        done = perago_cli(
            ["run", name, "--wait", "--timeout", "240", "--input", json.dumps(workflow_input)],
            env,
            timeout=300,
        )
    assert done.returncode == 3, done.stderr
    assert "task part (" in done.stderr and "FAILED_WITH_TERMINAL_ERROR after 1 attempt" in (
        done.stderr
    ), done.stderr
    assert f"NameError: name 'parms' is not defined (at {taskmod.__file__}:{line})" in (
        done.stderr
    ), done.stderr
    assert "in sub-workflow pt_one_part_" in done.stderr and "task day_d1" in done.stderr
    assert "no reason given" not in done.stderr
    assert "/log" in done.stderr  # where the traceback is


def test_partitions_failing_at_once_keep_their_conductor_retries_inside_sub_workflows(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Conductor 3.32's JOIN may read a forked task's FAILED attempt before its retry exists
    and fail the workflow (the retries end CANCELED; docs/tasks.md, "Retries"). A writer
    that leaves a failed body to Conductor (`body_retries=0`), wrapped in a SUB_WORKFLOW per
    partition, retries inside its child, which has no JOIN: 4 of 8 partitions failing their
    first attempt at once, and it completes."""
    days = [f"d{i}" for i in range(8)]
    params = {f"day_{d}": {"part": d, "fail_first": i % 2 == 0} for i, d in enumerate(days)}
    wid = _start_sub_workflow_fan_out(conductor, store, repo, unique, params, "pt_part_plain")
    with worker(env, tmp_path / "w.log", concurrency=4):
        wf = wait_workflow(conductor, wid, timeout=240)
    assert wf["status"] == "COMPLETED", [
        (t["referenceTaskName"], t["status"], t.get("reasonForIncompletion")) for t in wf["tasks"]
    ]
    for i, d in enumerate(days):
        assert text(store, repo, f"parts/p={d}/rows.csv").startswith(f"{d},0")
        (sub,) = attempts(wf, f"day_{d}")
        inner = conductor.get_workflow(sub["subWorkflowId"])
        statuses = [t["status"] for t in attempts(inner, "part")]
        assert statuses == (["FAILED", "COMPLETED"] if i % 2 == 0 else ["COMPLETED"]), statuses
    assert held_leases(store, repo) == []


def test_a_plain_fork_keeps_its_retries_when_half_its_partitions_fail_at_once(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Issue 39: a plain FORK_JOIN_DYNAMIC of SIMPLE writers, 4 of 8 failing their first
    try at once, five rounds. Each failing body is tried again inside its own attempt,
    which no JOIN can cancel: every round completes, one Conductor attempt per partition,
    each partition published exactly once per round."""
    name = f"pt_wf_plain_retries_{unique}"
    put_workflow(
        conductor,
        name,
        dynamic_fork("${workflow.input.dynamicTasks}", "${workflow.input.dynamicTasksInput}"),
    )
    rounds, days = 5, [f"d{i}" for i in range(8)]
    tasks = [{"name": f"pt_part_{unique}", "taskReferenceName": f"day_{d}"} for d in days]
    with worker(env, tmp_path / "w.log", concurrency=8):
        for n in range(rounds):
            workspace = {"repository": repo, "branch": "main"}
            inputs = {
                f"day_{d}": {
                    "workspace": workspace,
                    "params": {"part": d, "rows": n + 1, "fail_first": i % 2 == 0},
                }
                for i, d in enumerate(days)
            }
            wid = conductor.start_workflow(
                name,
                {"workspace": workspace, "dynamicTasks": tasks, "dynamicTasksInput": inputs},
            )
            wf = wait_workflow(conductor, wid, timeout=240)
            assert wf["status"] == "COMPLETED", (n, wf.get("reasonForIncompletion"))
            for i, d in enumerate(days):
                (one,) = attempts(wf, f"day_{d}")  # no Conductor retry at all
                assert one["status"] == "COMPLETED"
                assert len(text(store, repo, f"parts/p={d}/rows.csv").splitlines()) == n + 1
                tried_again = any(
                    "try 1 of 2 failed" in line for line in conductor.task_logs(one["taskId"])
                )
                assert tried_again == (i % 2 == 0), (n, d)
            mine = [
                c for c in publications(store, repo) if c.metadata.get("perago.workflow_id") == wid
            ]
            assert sorted(c.metadata["perago.scope"] for c in mine) == sorted(
                f"parts/p={d}/" for d in days
            ), (n, [c.metadata.get("perago.scope") for c in mine])
    assert held_leases(store, repo) == []


def test_a_task_type_capped_at_one_runs_alone_while_light_ones_keep_flowing(
    env: dict[str, str],
    conductor: ConductorClient,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """`@task(concurrency=1)` on one worker with --concurrency 4: three heavy attempts never
    overlap, and the light ones run beside the heavy one (their slots are not taken)."""
    heavy = [
        simple_task(f"pt_heavy_{unique}", f"h{i}", PINNED, {"part": f"h{i}", "sleep": 1.5})
        for i in range(3)
    ]
    light = [
        simple_task(f"pt_light_{unique}", f"l{i}", PINNED, {"part": f"l{i}", "sleep": 0.3})
        for i in range(6)
    ]
    name = f"pt_wf_caps_{unique}"
    put_workflow(conductor, name, fork("split", [[t] for t in heavy + light]))
    with worker(env, tmp_path / "w.log", concurrency=4) as w:
        wf = wait_workflow(conductor, start(conductor, name, repo), timeout=120)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    spans = attempt_spans(w.events())
    heavy_spans = sorted(spans[f"h{i}"] for i in range(3))
    for (_, end), (start_next, _) in itertools.pairwise(heavy_spans):
        assert start_next >= end, f"two heavy attempts overlapped: {heavy_spans}"
    first_heavy_end = heavy_spans[0][1]
    light_ends = [spans[f"l{i}"][1] for i in range(6)]
    assert sum(end < first_heavy_end for end in light_ends) >= 3, (heavy_spans, light_ends)
    assert w.wait_for("worker_started")["task_concurrency"] == {f"pt_heavy_{unique}": 1}


def test_thirty_async_bodies_run_at_once_on_few_threads(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """A fan-out of 30 `async def` writers on one worker with --concurrency 30: all 30
    bodies await at once while the worker process has far fewer threads than attempts (each
    plain attempt holds two), then each publishes its partition."""
    name = f"pt_wf_async_{unique}"
    put_workflow(
        conductor,
        name,
        dynamic_fork("${workflow.input.dynamicTasks}", "${workflow.input.dynamicTasksInput}"),
    )
    workspace = {"repository": repo, "branch": "main", "ref": store.branch_head(repo, "main")}
    go = tmp_path / "go"
    parts = [f"a{i}" for i in range(30)]
    tasks = [
        {"name": f"pt_async_part_{unique}", "taskReferenceName": p, "type": "SIMPLE"} for p in parts
    ]
    inputs = {p: {"workspace": workspace, "params": {"part": p, "go": str(go)}} for p in parts}
    wid = conductor.start_workflow(
        name, {"workspace": workspace, "dynamicTasks": tasks, "dynamicTasksInput": inputs}
    )
    with worker(env, tmp_path / "w.log", concurrency=30) as w:
        deadline = time.monotonic() + 120
        while sum(e.get("event") == "attempt_progress" for e in w.events()) < 30:
            assert time.monotonic() < deadline, "30 async bodies never waited at once"
            time.sleep(0.2)
        status = Path(f"/proc/{w.proc.pid}/status").read_text()
        threads = int(status.split("Threads:")[1].split()[0])
        go.write_text("go")
        wf = wait_workflow(conductor, wid, timeout=180)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    print(f"worker threads with 30 async bodies waiting: {threads}")
    assert threads < 30, f"{threads} threads for 30 waiting async bodies"
    for p in parts:
        assert text(store, repo, f"parts/p={p}/rows.csv") == f"{p},0\n"
    assert_clean(store, repo, env, set(parts))


def test_do_while_and_switch_still_publish_serially(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """DO_WHILE of a writer (unpinned: each iteration starts from the head), then a SWITCH."""
    name = f"pt_wf_loop_{unique}"
    unpinned = {
        "repository": "${workflow.input.workspace.repository}",
        "branch": "${workflow.input.workspace.branch}",
    }
    body = simple_task(f"pt_part_{unique}", "iter", "", {"part": "loop", "rows": 2})
    body["inputParameters"]["workspace"] = unpinned
    loop = {
        "name": "loop",
        "taskReferenceName": "loop",
        "type": "DO_WHILE",
        "loopCondition": "if ($.loop['iteration'] < 2) { true; } else { false; }",
        "loopOver": [body],
    }
    case = simple_task(f"pt_part_{unique}", "chosen", "", {"part": "switch"})
    case["inputParameters"]["workspace"] = unpinned
    other = simple_task(f"pt_part_{unique}", "never", "", {"part": "never"})
    other["inputParameters"]["workspace"] = unpinned
    switch = {
        "name": "pick",
        "taskReferenceName": "pick",
        "type": "SWITCH",
        "evaluatorType": "value-param",
        "expression": "which",
        "inputParameters": {"which": "${workflow.input.which}"},
        "decisionCases": {"a": [case], "b": [other]},
    }
    put_workflow(conductor, name, [loop, switch])
    wid = start(conductor, name, repo, which="a")
    with worker(env, tmp_path / "w.log"):
        wf = wait_workflow(conductor, wid)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    iterations = [t for t in wf["tasks"] if t["referenceTaskName"].startswith("iter")]
    assert [t["status"] for t in iterations] == ["COMPLETED", "COMPLETED"]
    assert text(store, repo, "parts/p=switch/rows.csv").startswith("switch,0")
    # each iteration rewrote the same partition with the same rows: the second is a no-op
    assert_clean(store, repo, env, {"iter__1", "chosen"})


def test_a_writer_killed_after_publishing_inside_a_fork_is_replaced_in_its_scope(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """The first writer dies right after its merge; the sibling publishes on top; the first
    writer's retry reverts its earlier publication and merges again (scoped replacement)."""
    name = f"pt_wf_forkkill_{unique}"
    branches = [[part_task(unique, "left", "a")], [part_task(unique, "right", "b")]]
    put_workflow(conductor, name, fork("split", branches))
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    # One attempt at a time here too: only the first writer has published when it dies
    # (with a publication in flight beside it, its sibling could merge in the same group
    # before the kill, leaving nothing for a scoped replacement to go over).
    dying = {
        **env,
        "PERAGO_FAILPOINTS": "after_publish=kill",
        "PERAGO_PUBLICATIONS_IN_FLIGHT": "0",
    }
    with worker(dying, tmp_path / "k.log") as w:
        w.wait_killed(conductor, wid)
    assert len(publications(store, repo)) == 1  # the first writer's, and only it
    first = publications(store, repo)[0]
    killed = first.metadata["perago.task_ref"]
    # One attempt at a time, report included: the sibling (polled first) publishes before
    # the retry decides, so the retry finds it on top. With room for publications in flight
    # the two would share a grant in either order, and a retry first would replace by reset.
    with worker({**env, "PERAGO_PUBLICATIONS_IN_FLIGHT": "0"}, tmp_path / "w.log") as w:
        wf = wait_workflow(conductor, wid, timeout=120, nudge=True)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    # the restarted worker failed the killed attempt (recovery), or Conductor timed it out
    # when its response timeout was already close
    lost, retry = attempts(wf, killed)
    assert lost["status"] in ("FAILED", "TIMED_OUT") and retry["status"] == "COMPLETED"
    assert w.wait_for("publish_fence_passed", decision="scoped_replacement")
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.metadata["perago.replaces"] == first.id
    assert head.id == attempts(wf, killed)[-1]["outputData"]["workspace"]["ref"]
    assert text(store, repo, "parts/p=a/rows.csv").startswith("a,0")
    assert text(store, repo, "parts/p=b/rows.csv").startswith("b,0")
    # the killed attempt's publication stays reachable; in effect: one per step
    history = [c.id for c in store.log(repo, "main", amount=20)]
    assert first.id in history
    pubs = publications(store, repo)
    replaced = {c.metadata.get("perago.replaces") for c in pubs} - {None}
    assert sorted(c.metadata["perago.task_ref"] for c in pubs if c.id not in replaced) == [
        "left",
        "right",
    ]
    assert held_leases(store, repo) == []
    done = perago_cli(["janitor", "--repository", repo], env)
    assert done.returncode == 0, done.stderr
    assert staging_branches(store, repo) == []


#: Every failpoint but ``before_reset``, which is left to the serial crash suite: in a fork
#: a retry hard-resets only while no sibling is on top, which the test cannot force.
KILL_POINTS = tuple(p for p in POINTS if p != "before_reset")


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_worker_killed_at_a_failpoint_while_a_fork_is_in_flight(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    point: str,
) -> None:
    """One worker runs both writers of a fork and dies (SIGKILL) when the first of them
    reaches ``point``, the other held in its body until the kill (a worker that takes both at
    once could otherwise finish both, and a kill after the last report leaves the lease to a
    takeover that no later publication makes); a fresh worker finishes the fork. Both
    steps complete, exactly one publication of each is in effect, nothing is lost or
    unreachable, no lease is held and the janitor leaves no staging branch."""
    name = f"pt_wf_forkcrash_{unique}"
    hold = tmp_path / "release-right"
    left, right = part_task(unique, "left", "a"), part_task(unique, "right", "b", hold=str(hold))
    put_workflow(conductor, name, fork("split", [[left], [right]]))
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    killing = {**env, "PERAGO_FAILPOINTS": f"{point}=kill"}
    with worker(killing, tmp_path / "k.log", concurrency=2) as w:  # the held one keeps a place
        assert w.wait_killed(conductor, wid) == -signal.SIGKILL
    hold.write_text("the first writer's worker is dead")
    with worker(env, tmp_path / "w.log"):
        wf = wait_workflow(conductor, wid, timeout=180, nudge=True)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    for ref in ("left", "right"):
        *lost, last = attempts(wf, ref)
        assert last["status"] == "COMPLETED"
        for t in lost:
            recovered = t["status"] == "FAILED" and "restarted" in t["reasonForIncompletion"]
            assert recovered or t["status"] == "TIMED_OUT", t
    pubs = publications(store, repo)
    replaced = {r for c in pubs for r in (c.metadata.get("perago.replaces") or "").split(",") if r}
    in_effect = sorted(c.metadata["perago.task_ref"] for c in pubs if c.id not in replaced)
    assert in_effect == ["left", "right"], [(c.id, c.metadata) for c in pubs]
    assert replaced <= {c.id for c in pubs}  # a replaced publication stays in the history
    assert pubs[-1].parents[0] == input_ref
    for ref in ("left", "right"):
        out = attempts(wf, ref)[-1]["outputData"]["workspace"]["ref"]
        assert out in {c.id for c in pubs}
    assert text(store, repo, "parts/p=a/rows.csv").startswith("a,0")
    assert text(store, repo, "parts/p=b/rows.csv").startswith("b,0")
    assert held_leases(store, repo) == []
    done = perago_cli(["janitor", "--repository", repo], env)
    assert done.returncode == 0, done.stderr
    assert staging_branches(store, repo) == []


#: Group commit under kills: the fan-out's width and the failpoints. `make soak` widens
#: both (64 partitions, every failpoint); `make test` kills at two.
GROUP_KILL_WIDTH = int(os.environ.get("PERAGO_GROUP_KILL_WIDTH", "8"))
GROUP_KILL_POINTS = (
    KILL_POINTS
    if os.environ.get("PERAGO_GROUP_KILL_POINTS") == "all"
    else ("after_publish_fence", "after_publish")
)


@pytest.mark.parametrize("point", GROUP_KILL_POINTS)
def test_a_worker_killed_while_a_publication_group_is_in_flight(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    point: str,
) -> None:
    """One worker runs every partition of a wide fan-out at once, so its publications share
    lease grants (group commit), and dies (SIGKILL) when the middle one of them reaches
    ``point``: the group's grant holder and its members die together, some published, some
    reporting, some waiting for their turn. A fresh worker finishes: every partition
    completes, exactly one publication of each is in effect, nothing is lost, no lease is
    held and the janitor leaves no staging branch."""
    n = GROUP_KILL_WIDTH
    params = {f"p{i}": {"part": f"g{i}"} for i in range(n)}
    wid = _start_sub_workflow_fan_out(conductor, store, repo, unique, params)
    killing = {**env, "PERAGO_FAILPOINTS": f"{point}=kill@{n // 2}"}
    with worker(killing, tmp_path / "k.log", concurrency=n) as w:
        assert w.wait_killed(conductor, wid) == -signal.SIGKILL
        joined = [e for e in w.events() if e.get("event") == "branch_lease_joined"]
    assert joined, "no publication joined a group before the kill: nothing was tested"
    with worker(env, tmp_path / "w.log", concurrency=n):
        wf = wait_workflow(conductor, wid, timeout=300, nudge=True)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    pubs = publications(store, repo)
    replaced = {r for c in pubs for r in (c.metadata.get("perago.replaces") or "").split(",") if r}
    in_effect = sorted(c.metadata["perago.scope"] for c in pubs if c.id not in replaced)
    assert in_effect == sorted(f"parts/p=g{i}/" for i in range(n)), in_effect
    assert replaced <= {c.id for c in pubs}  # a replaced publication stays in the history
    for ref in params:
        (sub,) = attempts(wf, ref)
        child = conductor.get_workflow(sub["subWorkflowId"])
        out = attempts(child, "part")[-1]["outputData"]["workspace"]["ref"]
        assert out in {c.id for c in pubs}
    for i in range(n):
        assert text(store, repo, f"parts/p=g{i}/rows.csv").startswith(f"g{i},0")
    assert held_leases(store, repo) == []
    done = perago_cli(["janitor", "--repository", repo], env)
    assert done.returncode == 0, done.stderr
    assert staging_branches(store, repo) == []


def test_a_retried_sub_workflow_replaces_its_earlier_childs_publication(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """The child publishes, then fails; the SUB_WORKFLOW is retried as a new child workflow,
    whose step is recognised as the same logical step (parent workflow + parent task)."""
    child = f"pt_wf_child_{unique}"
    sentinel = str(tmp_path / "gate-failed-once")
    put_workflow(
        conductor,
        child,
        [
            part_task(unique, "write", "a"),
            simple_task(f"pt_gate_{unique}", "gate", PINNED, {"sentinel": sentinel}),
        ],
    )
    sub_def = f"pt_sub_{unique}"
    conductor.register_task_defs(
        [
            {
                "name": sub_def,
                "retryCount": 1,
                "retryLogic": "FIXED",
                "retryDelaySeconds": 0,
                "timeoutSeconds": 600,
                "responseTimeoutSeconds": 600,
                "timeoutPolicy": "TIME_OUT_WF",
            }
        ]
    )
    parent = f"pt_wf_parent_{unique}"
    sub = {
        "name": sub_def,
        "taskReferenceName": "sub",
        "type": "SUB_WORKFLOW",
        "subWorkflowParam": {"name": child, "version": 1},
        "inputParameters": {"workspace": PINNED},
    }
    put_workflow(conductor, parent, [sub])
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, parent, repo, ref=input_ref)
    with worker(env, tmp_path / "w.log") as w:
        wf = wait_workflow(conductor, wid, timeout=120)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    subs = attempts(wf, "sub")
    assert [t["status"] for t in subs] == ["FAILED", "COMPLETED"]
    assert len({t["subWorkflowId"] for t in subs}) == 2  # a new child workflow
    assert w.wait_for("publish_fence_passed", decision="replacement_publication")
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.parents == (input_ref,)  # exactly one publication of the step
    assert head.metadata["perago.step"] == f"{wid}/sub/write"
    assert head.metadata["perago.lineage_retries"] == "1"
    assert text(store, repo, "parts/p=a/rows.csv").startswith("a,0")
    assert_clean(store, repo, env, {"write"})
