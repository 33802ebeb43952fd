"""(g) Fan-out: a DYNAMIC_FORK of 8 partitions against the same 8 steps as a serial chain.

Each step is ``bench_fanout_part`` (2 s of work, 100 x 64 KiB of output on its own
partition prefix ``bench/p=<n>/``); one worker process with ``--concurrency 4`` runs both
workflows, the chain first, in one run against the same stack. Printed: each workflow's wall
time (start to COMPLETED, from Conductor), the ratio fan-out / chain (target <= 0.35), and
the publication latency of each step from the worker's log (``diffed`` to ``published``:
stage, branch lease, fences, merge) with 8 publishers contending for one branch vs the
uncontended chain.

    python -m benchmarks.fanout            # PERAGO_BENCH_BODY_SECONDS / _FILES to shrink
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, fanout_workflow, resolve_stack
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import discover, register
from perago.config import load

PARTS = 8
TASK = "bench_fanout_part"


def _step(ref: str, part: str, workspace: str) -> dict[str, Any]:
    return {
        "name": TASK,
        "taskReferenceName": ref,
        "type": "SIMPLE",
        "inputParameters": {"workspace": workspace, "params": {"part": part}},
    }


def _workflows(suffix: str) -> tuple[str, str, list[dict[str, Any]]]:
    chain, fan = f"bench_chain_{suffix}", f"bench_fanout_{suffix}"
    steps, ws = [], "${workflow.input.workspace}"
    for i in range(PARTS):
        steps.append(_step(f"s{i}", str(i), ws))
        ws = f"${{s{i}.output.workspace}}"
    defs = [
        {"name": chain, "tasks": steps, "timeoutSeconds": 900},
        fanout_workflow(fan),
    ]
    for d in defs:
        d.update(version=1, schemaVersion=2, ownerEmail="perago@example.com")
        d["inputParameters"] = ["workspace"]
    return chain, fan, defs


def _wait(conductor: ConductorClient, wid: str) -> dict[str, Any]:
    while True:
        wf = conductor.get_workflow(wid)
        if wf.get("status") in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED"):
            if wf["status"] != "COMPLETED":
                raise SystemExit(
                    f"workflow {wid} {wf['status']}: {wf.get('reasonForIncompletion')}"
                )
            return wf
        time.sleep(0.2)


def _latencies(log: Path, workflow_id: str) -> list[float]:
    started: dict[str, datetime] = {}
    out = []
    for line in log.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if e.get("workflow_id") != workflow_id:
            continue
        at = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
        if e.get("event") == "diffed":
            started[e["task_id"]] = at
        elif e.get("event") == "published" and e["task_id"] in started:
            out.append((at - started.pop(e["task_id"])).total_seconds())
    return out


def main() -> int:
    stack = resolve_stack()
    env = {**os.environ, **stack.env}
    settings = load(env=env)
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    suffix = uuid.uuid4().hex[:8]
    repo = f"bench-fanout-{suffix}"
    store.create_repository(repo)
    register(conductor, discover(["benchmarks.fanout_tasks"]))
    chain, fan, defs = _workflows(suffix)
    conductor.put_workflow_defs(defs)
    log = Path(settings.work_dir) / f"bench-fanout-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "perago",
                "worker",
                "benchmarks.fanout_tasks",
                "--concurrency",
                "4",
            ],
            cwd=ROOT,
            env={**env, "PERAGO_POLL_INTERVAL": "0.1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            walls: dict[str, float] = {}
            ids: dict[str, str] = {}
            for name in (chain, fan):
                ws = {"repository": repo, "branch": "main", "ref": store.branch_head(repo, "main")}
                tasks = [
                    {"name": TASK, "taskReferenceName": f"p{i}", "type": "SIMPLE"}
                    for i in range(PARTS)
                ]
                inputs = {
                    f"p{i}": {"workspace": ws, "params": {"part": f"f{i}"}} for i in range(PARTS)
                }
                wid = conductor.start_workflow(
                    name, {"workspace": ws, "tasks": tasks, "inputs": inputs}
                )
                wf = _wait(conductor, wid)
                walls[name] = (int(wf["endTime"]) - int(wf["startTime"])) / 1000
                ids[name] = wid
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    ratio = walls[fan] / walls[chain]
    body = os.environ.get("PERAGO_BENCH_BODY_SECONDS", "2")
    files = os.environ.get("PERAGO_BENCH_FILES", "100")
    print(
        f"(g) fan-out: {PARTS} partitions, body {body} s, {files} x 64 KiB each, "
        "worker --concurrency 4"
    )
    print(f"  serial chain of {PARTS}: {walls[chain]:.1f} s")
    print(f"  DYNAMIC_FORK of {PARTS}: {walls[fan]:.1f} s")
    print(f"  ratio fan-out / chain: {ratio:.2f} (target <= 0.35)")
    for name, label in (
        (chain, "chain (uncontended)"),
        (fan, f"fan-out ({PARTS} publishers, one branch)"),
    ):
        lat = sorted(_latencies(log, ids[name]))
        if lat:
            print(
                f"  publication latency, {label}: median {statistics.median(lat):.2f} s, "
                f"max {lat[-1]:.2f} s over {len(lat)}"
            )
    print(f"  worker log: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
