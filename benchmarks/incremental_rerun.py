"""(o) Incremental re-runs: the example's 30-day fan-out re-run after one day's raw orders
were corrected, against a full recompute of the same data in the same run.

One worker (``workers.orders.tasks``, ``--concurrency 2``, Spark ``local[2]``) runs the
``orders_fanout`` workflow on 100,000 generated orders: first from scratch, then, for each
repetition, after late orders of one more day arrive: once as is (the day summaries are
incremental: only the corrected day's runs) and once with ``"recompute": true`` (every
day's runs: the baseline, what a re-run cost before). Printed per run: wall time (the
workflow's create to end), task seconds (the sum of its tasks' start-to-end: the worker's
materialise, Spark and publish time) and how many day summaries ran; then the medians and
the ratio incremental / full recompute.

    python -m benchmarks.incremental_rerun              # 3 repetitions
    python -m benchmarks.incremental_rerun --repeat 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, BenchmarkError, resolve_stack, start_workers, stop_workers
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import discover, load_workflows, register
from perago.config import load
from perago.workspace import upload_all

WORKFLOW = "orders_fanout"
MODULE = "workers.orders.tasks"
FIRST_DAY = date(2026, 10, 1)  # the generated orders' first day (workers.orders.data)


@dataclass(frozen=True)
class Run:
    label: str
    wall: float
    task_seconds: float
    days_ran: int
    days: int


def _run(conductor: ConductorClient, repo: str, label: str, **extra: Any) -> Run:
    wid = conductor.start_workflow(
        WORKFLOW, {"workspace": {"repository": repo, "branch": "main"}, **extra}
    )
    deadline = time.monotonic() + 900
    while True:
        wf = conductor.get_workflow(wid)
        if wf.get("status") in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED"):
            break
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{label}: workflow {wid} did not end in 15 minutes")
        time.sleep(0.5)
    if wf["status"] != "COMPLETED":
        raise BenchmarkError(
            f"{label}: workflow {wid} {wf['status']}: {wf.get('reasonForIncompletion')}"
        )
    run = conductor.workflow_run(wid)
    tasks = [wf]
    seconds = 0.0
    while tasks:  # the SIMPLE tasks of the workflow and of its sub-workflows
        for t in tasks.pop().get("tasks") or []:
            if t.get("taskType") == "SUB_WORKFLOW" and t.get("subWorkflowId"):
                tasks.append(conductor.get_workflow(str(t["subWorkflowId"])))
            elif t.get("workerId"):
                seconds += (int(t.get("endTime") or 0) - int(t.get("startTime") or 0)) / 1000
    day = [r for r in (*run.ran, *run.reused) if r.startswith("day_")]
    ran = [r for r in run.ran if r.startswith("day_")]
    wall = (int(wf["endTime"]) - int(wf["createTime"])) / 1000
    return Run(label, wall, seconds, len(ran), len(day))


def _late_orders(store: LakeFSStore, repo: str, n: int) -> str:
    """Late orders of day ``n`` arrive (a new raw file); returns the day."""
    from workers.orders.data import late_orders

    day = (FIRST_DAY + timedelta(days=n)).isoformat()
    data = late_orders(day, tag=f"late{n:02d}")
    store.upload_bytes(repo, "main", f"orders/raw/late-{day}.csv", data)
    store.commit(repo, "main", message=f"late orders of {day}", metadata={"source": "bench"})
    return day


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    stack = resolve_stack()
    env = {**os.environ, **stack.env, "PERAGO_SPARK_MASTER": "local[2]"}
    settings = load(env=env)
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    repo = f"bench-incremental-{uuid.uuid4().hex[:8]}"
    store.create_repository(repo)
    from workers.orders.data import generate_customers, generate_orders

    with tempfile.TemporaryDirectory() as tmp:
        generate_orders(Path(tmp) / "orders")
        generate_customers(Path(tmp) / "dims" / "customers")
        files = [p.relative_to(tmp).as_posix() for p in sorted(Path(tmp).rglob("*.csv"))]
        upload_all(store, repo, "main", "", Path(tmp), files, parallelism=4)
        store.commit(repo, "main", message="load", metadata={"source": "bench"})
    register(conductor, discover([MODULE]), load_workflows(ROOT / "workflows"))
    logs = [Path(settings.work_dir) / f"{repo}-worker.log"]
    workers = start_workers(MODULE, logs, concurrency=2, env=env)
    runs: list[Run] = []
    try:
        first = _run(conductor, repo, "from scratch")
        print(_line(first))
        for n in range(args.repeat):
            day = _late_orders(store, repo, 3 + n)
            for label, extra in (
                (f"incremental, late orders of {day}", {}),
                ("full recompute (recompute: true)", {"recompute": True}),
            ):
                run = _run(conductor, repo, label, **extra)
                print(_line(run))
                runs.append(run)
    finally:
        stop_workers(workers)
        store.delete_repository(repo)
    incremental = [r for r in runs if r.label.startswith("incremental")]
    full = [r for r in runs if r.label.startswith("full")]
    if any(r.days_ran != 1 for r in incremental) or any(r.days_ran != r.days for r in full):
        raise BenchmarkError("an incremental re-run ran other days than the corrected one")
    wall = statistics.median(r.wall for r in incremental), statistics.median(r.wall for r in full)
    work = (
        statistics.median(r.task_seconds for r in incremental),
        statistics.median(r.task_seconds for r in full),
    )
    print(
        f"(o) medians of {args.repeat}: incremental re-run {wall[0]:.1f} s wall, "
        f"{work[0]:.1f} task-s; full recompute {wall[1]:.1f} s wall, {work[1]:.1f} task-s; "
        f"ratio incremental / full: wall {wall[0] / wall[1]:.2f}, task seconds "
        f"{work[0] / work[1]:.2f}"
    )
    return 0


def _line(run: Run) -> str:
    return (
        f"  {run.label:<44} {run.wall:6.1f} s wall  {run.task_seconds:6.1f} task-s  "
        f"day summaries run: {run.days_ran} of {run.days}"
    )


if __name__ == "__main__":
    sys.exit(main())
