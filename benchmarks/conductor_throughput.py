"""(n) Conductor throughput, SQLite against PostgreSQL: the embedded profile against the
production one, on this machine, in one run.

On each profile in turn (``perago dev down``, then ``up --profile <name>``), two worker
processes with ``--concurrency 8`` run no-op read-only tasks (``bench_scale_read``: a
workspace materialised, nothing published): WORKFLOWS one-step workflows are started from 8
threads at once. Printed per profile: tasks completed per second (first start to last
completion), and from Conductor's own task records the poll-to-report latency (``endTime -
startTime``) and the queue wait (``startTime - scheduledTime``), p50 and p99. The baseline is
the embedded profile (SQLite); the ratio is PostgreSQL's throughput over it.

    python -m benchmarks.conductor_throughput          # 400 workflows per profile
    python -m benchmarks.conductor_throughput 1000

Leaves the embedded stack running, as ``make test`` expects it.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, percentile, start_workers, stop_workers
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import discover, register
from perago.config import load

TASK = "bench_scale_read"
WORKERS, CONCURRENCY, STARTERS = 2, 8, 8
RESULTS = Path(__file__).with_name("results-conductor.json")


def _workflow(name: str) -> dict[str, Any]:
    step = {
        "name": TASK,
        "taskReferenceName": "read",
        "type": "SIMPLE",
        "inputParameters": {"workspace": "${workflow.input.workspace}", "params": {"part": "0"}},
    }
    return {
        "name": name,
        "version": 1,
        "schemaVersion": 2,
        "ownerEmail": "bench@perago.dev",
        "tasks": [step],
        "outputParameters": {},
    }


def _measure(profile: str, workflows: int) -> dict[str, Any]:
    from perago_dev import stack

    stack.down()
    info = stack.up(progress=True, profile=profile)
    env = {**os.environ, **info.env()}
    settings = load(env=env)
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    suffix = uuid.uuid4().hex[:8]
    flow = f"bench_tput_{suffix}"
    register(conductor, discover(["benchmarks.fanout_scale_tasks"]))
    conductor.put_workflow_defs([_workflow(flow)])
    repo = f"bench-tput-{suffix}"
    store.create_repository(repo)
    ws = {"repository": repo, "branch": "main", "ref": store.branch_head(repo, "main")}
    logs = [Path(settings.work_dir) / f"bench-tput-{suffix}-w{n}.log" for n in range(WORKERS)]
    workers = start_workers("benchmarks.fanout_scale_tasks", logs, concurrency=CONCURRENCY, env=env)
    try:
        # one warm-up workflow: the workers are polling and the JIT has seen the paths
        _wait_all(conductor, [conductor.start_workflow(flow, {"workspace": ws})], 120)
        started = time.monotonic()
        with ThreadPoolExecutor(STARTERS) as pool:
            ids = list(
                pool.map(
                    lambda _: conductor.start_workflow(flow, {"workspace": ws}), range(workflows)
                )
            )
        records = _wait_all(conductor, ids, 60 + workflows)
        wall = time.monotonic() - started
    finally:
        stop_workers(workers)
    tasks = [wf["tasks"][0] for wf in records]
    poll_to_report = sorted((int(t["endTime"]) - int(t["startTime"])) / 1000 for t in tasks)
    queue_wait = sorted((int(t["startTime"]) - int(t["scheduledTime"])) / 1000 for t in tasks)
    first = min(int(wf["startTime"]) for wf in records)
    last = max(int(wf["endTime"]) for wf in records)
    store.delete_repository(repo)
    return {
        "profile": profile,
        "workflows": workflows,
        "wall_seconds": wall,
        "tasks_per_second": workflows / ((last - first) / 1000),
        "poll_to_report_p50": percentile(poll_to_report, 50),
        "poll_to_report_p99": percentile(poll_to_report, 99),
        "queue_wait_p50": percentile(queue_wait, 50),
        "queue_wait_p99": percentile(queue_wait, 99),
    }


def _wait_all(conductor: ConductorClient, ids: list[str], timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    done: dict[str, dict[str, Any]] = {}
    while len(done) < len(ids):
        for wid in ids:
            if wid in done:
                continue
            wf = conductor.get_workflow(wid)
            status = wf.get("status")
            if status == "COMPLETED":
                done[wid] = wf
            elif status in ("FAILED", "TIMED_OUT", "TERMINATED"):
                raise SystemExit(f"workflow {wid} {status}: {wf.get('reasonForIncompletion')}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(ids) - len(done)} workflows unfinished after {timeout:.0f} s")
        time.sleep(0.5)
    return [done[wid] for wid in ids]


def main(argv: list[str]) -> int:
    workflows = int(argv[0]) if argv else 400
    rows = []
    try:
        for profile in ("production", "embedded"):  # ends on the embedded stack
            rows.append(_measure(profile, workflows))
    finally:
        from perago_dev import stack

        if stack.info().profile != "embedded":
            stack.down()
            stack.up(profile="embedded")
    by = {r["profile"]: r for r in rows}
    base, pg = by["embedded"], by["production"]
    print(
        f"(n) Conductor throughput: {workflows} one-step workflows of a no-op read-only task, "
        f"{WORKERS} workers x --concurrency {CONCURRENCY}, started from {STARTERS} threads"
    )
    print("  Conductor on | tasks/s | poll-to-report p50 / p99 | queue wait p50 / p99")
    for name, r in (("SQLite", base), ("PostgreSQL", pg)):
        print(
            f"  {name:<12} | {r['tasks_per_second']:7.1f} | "
            f"{r['poll_to_report_p50']:6.3f} / {r['poll_to_report_p99']:6.3f} s     | "
            f"{r['queue_wait_p50']:6.3f} / {r['queue_wait_p99']:6.3f} s"
        )
    ratio = pg["tasks_per_second"] / base["tasks_per_second"]
    print(f"  PostgreSQL / SQLite throughput: {ratio:.2f}x")
    RESULTS.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "load_average": os.getloadavg(),
                "rows": rows,
                "ratio_postgres_over_sqlite": ratio,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"  results: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
