"""Named inputs on the real servers: a fan-out reading its partitions and one shared
dimension, an input pinned to a tag of another repository, serializable and snapshot
isolation beside a sibling that publishes what a task reads, and an input that is missing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perago._api.inputs import ResolvedInput
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from .harness import (
    attempts,
    dynamic_fork,
    perago_cli,
    publications,
    put_workflow,
    text,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration
MODULE = "tests.integration.taskmods.input_tasks"
WS = "${workflow.input.workspace}"
#: The shared dimension: big enough that a second download would show in the figures.
DIM = b"gold\n" + b"x" * 200_000


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(MODULE, PERAGO_TEST_RETRIES="1")


def seed(store: LakeFSStore, repo: str, parts: list[str], tmp_path: Path) -> str:
    """Partitions ``parts/p=<part>/rows.csv`` (3 rows each) and the dimension ``dims/d/``."""
    for part in parts:
        rows = "".join(f"{part},{i}\n" for i in range(3)).encode()
        store.upload_bytes(repo, "main", f"parts/p={part}/rows.csv", rows)
    store.upload_bytes(repo, "main", "dims/d/dim.csv", DIM)
    return store.commit(repo, "main", message="seed", metadata={}).id


def step(
    name: str, ref: str, params: dict[str, Any], inputs: Any = None, workspace: Any = WS
) -> dict[str, Any]:
    body: dict[str, Any] = {"workspace": workspace, "params": params}
    if inputs is not None:
        body["inputs"] = inputs
    return {"name": name, "taskReferenceName": ref, "type": "SIMPLE", "inputParameters": body}


def dimension(out: dict[str, Any]) -> str:
    return str(out["result"]["dimension"])


def test_a_fan_out_reads_its_partitions_and_one_shared_dimension(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    parts = ["a", "b", "c", "d", "e", "f"]
    base = seed(store, repo, parts, tmp_path)
    name = f"in_wf_fan_{unique}"
    put_workflow(
        conductor,
        name,
        dynamic_fork("${workflow.input.dynamicTasks}", "${workflow.input.dynamicTasksInput}"),
    )
    workspace = {"repository": repo, "branch": "main", "ref": base}
    tasks = [
        {"name": f"in_summary_{unique}", "taskReferenceName": f"p_{p}", "type": "SIMPLE"}
        for p in parts
    ]
    inputs = {f"p_{p}": {"workspace": workspace, "params": {"part": p}} for p in parts}
    wid = conductor.start_workflow(
        name, {"workspace": workspace, "dynamicTasks": tasks, "dynamicTasksInput": inputs}
    )
    with worker(env, tmp_path / "w.log", module=MODULE, concurrency=2) as w:
        wf = wait_workflow(conductor, wid, timeout=180)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    for p in parts:
        out = attempts(wf, f"p_{p}")[-1]["outputData"]
        assert out["result"] == {"part": p, "rows": 3, "dimension": "gold\n" + "x" * 200_000}
        assert out["inputs"] == {
            "dim": {"repository": repo, "ref": base, "commit": base, "prefix": "dims/d/"},
            "part": {"repository": repo, "ref": base, "commit": base, "prefix": f"parts/p={p}/"},
        }
    published = publications(store, repo)
    assert sorted(ResolvedInput.from_metadata(c.metadata)["part"] for c in published) == [
        f"{repo}@{base}/parts/p={p}/" for p in parts
    ]
    # The dimension was fetched once by this worker; every other day copied it from the
    # content cache (attempts starting together wait for the one that fetches it).
    dims = [e for e in w.events() if e.get("event") == "input_materialized" and e["input"] == "dim"]
    assert len(dims) == len(parts)
    assert sum(e["downloaded_bytes"] for e in dims) == len(DIM), dims
    # `perago log` shows where each publication read its inputs.
    shown = perago_cli(["log", f"{repo}/main", "--json"], env)
    assert shown.returncode == 0, shown.stderr
    records = json.loads(shown.stdout)
    assert {r["inputs"]["dim"] for r in records} == {f"{repo}@{base}/dims/d/"}
    table = perago_cli(["log", f"{repo}/main"], env)
    assert f"dim  = dims/d/ @{base[:12]}" in table.stdout, table.stdout


def test_an_input_pinned_to_a_tag_of_another_repository(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    seed(store, repo, ["a"], tmp_path)
    other = f"{repo}-ref"
    store.create_repository(other)
    try:
        store.upload_bytes(other, "main", "dims/d/dim.csv", b"v2024")
        tagged = store.commit(other, "main", message="v2024", metadata={}).id
        store.create_tag(other, "v2024", tagged)
        store.upload_bytes(other, "main", "dims/d/dim.csv", b"v2025")
        store.commit(other, "main", message="v2025", metadata={})
        name = f"in_wf_tag_{unique}"
        put_workflow(
            conductor,
            name,
            [
                step(
                    f"in_summary_{unique}",
                    "pinned",
                    {"part": "a"},
                    inputs={"dim": {"repository": other, "ref": "v2024"}},
                ),
                step(
                    f"in_summary_{unique}",
                    "latest",
                    {"part": "a"},
                    inputs={"dim": {"repository": other}},
                    workspace="${pinned.output.workspace}",
                ),
            ],
        )
        wid = conductor.start_workflow(name, {"workspace": {"repository": repo, "branch": "main"}})
        with worker(env, tmp_path / "w.log", module=MODULE):
            wf = wait_workflow(conductor, wid)
        assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
        pinned = attempts(wf, "pinned")[-1]["outputData"]
        latest = attempts(wf, "latest")[-1]["outputData"]
        assert dimension(pinned) == "v2024" and dimension(latest) == "v2025"
        assert pinned["inputs"]["dim"] == {
            "repository": other,
            "ref": "v2024",
            "commit": tagged,
            "prefix": "dims/d/",
        }
        assert latest["inputs"]["dim"]["ref"] == "main"
        commit = store.get_commit(repo, pinned["workspace"]["ref"])
        assert ResolvedInput.from_metadata(commit.metadata)["dim"] == f"{other}@{tagged}/dims/d/"
    finally:
        store.delete_repository(other)


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_a_sibling_publishes_what_a_task_reads_while_its_body_runs(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    isolation: str,
) -> None:
    """One workflow summarises partition ``a`` while another rewrites ``a`` (5 rows) on the
    same branch. Snapshot: the summary publishes at once, from the 3 rows it read.
    Serializable: refused (naming the input and the sibling), retried from the new head,
    publishes 5. (Two workflows rather than a FORK_JOIN: Conductor's JOIN may fail a
    workflow on a forked task's FAILED attempt before its retry is scheduled, issue 26.)"""
    seed(store, repo, ["a"], tmp_path)
    task = f"in_summary_{unique}" if isolation == "snapshot" else f"in_summary_ser_{unique}"
    reading = f"in_wf_{isolation}_{unique}"
    writing = f"in_wf_sibling_{isolation}_{unique}"
    put_workflow(
        conductor, reading, [step(task, "reader", {"part": "a", "wait_for_a_sibling": 60})]
    )
    put_workflow(
        conductor,
        writing,
        [step(f"in_part_{unique}", "sibling", {"part": "a", "rows": 5, "sleep": 2})],
    )
    # Unpinned: each attempt starts from the branch head (a retry reads the new data).
    workspace = {"workspace": {"repository": repo, "branch": "main"}}
    with worker(env, tmp_path / "w.log", module=MODULE, concurrency=2):
        wid = conductor.start_workflow(reading, workspace)
        sibling_wid = conductor.start_workflow(writing, workspace)
        wf = wait_workflow(conductor, wid, timeout=180)
        sibling = wait_workflow(conductor, sibling_wid, timeout=180)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    assert sibling["status"] == "COMPLETED", sibling.get("reasonForIncompletion")
    reader = attempts(wf, "reader")
    sibling_ref = attempts(sibling, "sibling")[-1]["outputData"]["workspace"]["ref"]
    out = reader[-1]["outputData"]
    if isolation == "snapshot":
        assert len(reader) == 1
        assert out["result"]["rows"] == 3
        assert out["inputs"]["part"]["commit"] != sibling_ref
        return
    assert [t["status"] for t in reader] == ["FAILED", "COMPLETED"]
    reason = reader[0]["reasonForIncompletion"]
    assert "serializable isolation: input 'part' (parts/p=a/) changed on main" in reason
    assert "published by step 'sibling'" in reason
    assert out["result"]["rows"] == 5
    assert out["inputs"]["part"]["commit"] == sibling_ref


def test_an_input_that_does_not_exist_is_terminal_and_publishes_nothing(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    base = seed(store, repo, ["a"], tmp_path)
    name = f"in_wf_missing_{unique}"
    put_workflow(conductor, name, [step(f"in_summary_{unique}", "s", {"part": "zz"})])
    wid = conductor.start_workflow(name, {"workspace": {"repository": repo, "branch": "main"}})
    with worker(env, tmp_path / "w.log", module=MODULE):
        wf = wait_workflow(conductor, wid)
    assert wf["status"] == "FAILED"
    (only,) = attempts(wf, "s")
    assert only["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert "input 'part': nothing under 'parts/p=zz/'" in only["reasonForIncompletion"]
    assert store.branch_head(repo, "main") == base


def test_an_incremental_fan_out_runs_only_the_partitions_whose_inputs_changed(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Issue 40, on the real servers: a fan-out of an incremental task re-run after each
    kind of change runs exactly the partitions the change touches and reuses the others
    (publishing nothing for them); `"recompute": true` and a new code version run all."""
    parts = ["a", "b", "c"]
    seed(store, repo, parts, tmp_path)
    name = f"in_wf_inc_{unique}"
    put_workflow(
        conductor,
        name,
        dynamic_fork("${workflow.input.dynamicTasks}", "${workflow.input.dynamicTasksInput}"),
    )

    def run(scale: dict[str, int] | None = None, **extra: Any) -> list[str]:
        """Run the fan-out from the head; the partitions whose body ran."""
        workspace = {"repository": repo, "branch": "main"}
        tasks = [
            {"name": f"in_summary_inc_{unique}", "taskReferenceName": f"p_{p}", "type": "SIMPLE"}
            for p in parts
        ]
        inputs = {
            f"p_{p}": {
                "workspace": workspace,
                "params": {"part": p, "scale": (scale or {}).get(p, 1)},
                **extra,
            }
            for p in parts
        }
        wf = wait_workflow(
            conductor,
            conductor.start_workflow(
                name, {"workspace": workspace, "dynamicTasks": tasks, "dynamicTasksInput": inputs}
            ),
            timeout=180,
        )
        assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
        outputs = {p: attempts(wf, f"p_{p}")[-1]["outputData"] for p in parts}
        for p, out in outputs.items():
            assert out["result"]["part"] == p
            if "reused" in out:  # what the earlier publication answered, at today's head
                earlier = store.get_commit(repo, out["reused"]["commit"])
                assert earlier.metadata["perago.scope"] == f"summaries/p={p}/"
                assert json.loads(earlier.metadata["perago.result"]) == out["result"]
        return sorted(p for p, out in outputs.items() if "reused" not in out)

    def edit(path: str, data: bytes) -> None:
        store.upload_bytes(repo, "main", path, data)
        store.commit(repo, "main", message=f"edit {path}", metadata={})

    with worker(env, tmp_path / "w.log", module=MODULE, concurrency=3):
        assert run() == parts
        head = store.branch_head(repo, "main")
        assert run() == []  # nothing changed: nothing ran, nothing published
        assert store.branch_head(repo, "main") == head
        edit("parts/p=b/rows.csv", b"b,0\nb,1\nb,2\nb,3\n")  # one partition's facts
        assert run() == ["b"]
        edit("dims/d/dim.csv", b"silver\n")  # the shared dimension
        assert run() == parts
        assert run(scale={"c": 2}) == ["c"]  # one partition's params
        edit("summaries/p=a/summary.txt", b"edited by hand\n")  # a foreign edit of an output
        assert run(scale={"c": 2}) == ["a"]
        assert text(store, repo, "summaries/p=a/summary.txt") == "3 rows, dimension silver, v1\n"
        assert run(scale={"c": 2}, recompute=True) == parts
        # `perago run --wait` names what was reused; --recompute goes into the workflow input
        workspace = {"repository": repo, "branch": "main"}
        dynamic = {
            "workspace": workspace,
            "dynamicTasks": [
                {
                    "name": f"in_summary_inc_{unique}",
                    "taskReferenceName": f"p_{p}",
                    "type": "SIMPLE",
                }
                for p in parts
            ],
            "dynamicTasksInput": {
                f"p_{p}": {
                    "workspace": workspace,
                    "params": {"part": p, "scale": 2 if p == "c" else 1},
                }
                for p in parts
            },
        }
        shown = perago_cli(
            ["run", name, "--wait", "--recompute", "--input", json.dumps(dynamic)], env
        )
        assert shown.returncode == 0, shown.stderr
        assert "0 step(s) ran; 3 reused an earlier publication" in shown.stderr, shown.stderr
        assert "p_a, p_b, p_c" in shown.stderr
        wid = shown.stderr.split("(", 1)[1].split(")", 1)[0]
        assert conductor.get_workflow(wid)["input"]["recompute"] is True
    with worker({**env, "PERAGO_TEST_CODE_VERSION": "v2"}, tmp_path / "w2.log", module=MODULE):
        assert run(scale={"c": 2}) == parts  # a new code version
        assert run(scale={"c": 2}) == []
