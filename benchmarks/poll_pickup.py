"""(p) How soon a worker picks up a task, by the number of task types it serves (issue 41).

One worker (``--concurrency 2``, default settings) serving 1, 13 or 50 read-only no-op
task types runs a serial chain of 20 steps of the *last* type, twice; the baseline is the
worker serving one type, in the same run. Printed per size: the pick-up wait per step
(Conductor's ``startTime - scheduledTime``: from the step being scheduled to a worker taking
it), median and 90th percentile, the chain's wall time (create to end), and the ratio of
the median wait to the one-type worker's.

    python -m benchmarks.poll_pickup              # 1, 13 and 50 task types
    python -m benchmarks.poll_pickup 1 100
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import percentile, resolve_stack, start_workers, stop_workers
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import discover, register
from perago.config import load

STEPS, ROUNDS = 20, 2
MODULE = "benchmarks.poll_pickup_tasks"


def _chain(conductor: ConductorClient, name: str, task_type: str, repo: str) -> dict[str, Any]:
    steps = [
        {
            "name": task_type,
            "taskReferenceName": f"s{i}",
            "type": "SIMPLE",
            "inputParameters": {"workspace": "${workflow.input.workspace}", "params": {}},
        }
        for i in range(STEPS)
    ]
    conductor.put_workflow_defs(
        [
            {
                "name": name,
                "version": 1,
                "schemaVersion": 2,
                "ownerEmail": "perago@example.com",
                "inputParameters": ["workspace"],
                "timeoutSeconds": 600,
                "tasks": steps,
            }
        ]
    )
    wid = conductor.start_workflow(name, {"workspace": {"repository": repo, "branch": "main"}})
    while True:
        wf = conductor.get_workflow(wid)
        if wf.get("status") in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED"):
            if wf["status"] != "COMPLETED":
                raise SystemExit(f"{name}: {wf['status']}: {wf.get('reasonForIncompletion')}")
            return wf
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    sizes = [int(a) for a in (argv if argv is not None else sys.argv[1:])] or [1, 13, 50]
    stack = resolve_stack()
    settings = load(env={**os.environ, **stack.env})
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    suffix = uuid.uuid4().hex[:8]
    repo = f"bench-pickup-{suffix}"
    store.create_repository(repo)
    store.upload_bytes(repo, "main", "x/a.txt", b"a")
    store.commit(repo, "main", message="seed", metadata={})
    results: dict[int, tuple[list[float], list[float]]] = {}
    try:
        for size in sizes:
            prefix = f"bench_pickup_{suffix}_{size}"
            env = {
                **os.environ,
                **stack.env,
                "BENCH_PICKUP_TYPES": str(size),
                "BENCH_PICKUP_PREFIX": prefix,
            }
            os.environ.update({"BENCH_PICKUP_TYPES": str(size), "BENCH_PICKUP_PREFIX": prefix})
            sys.modules.pop(MODULE, None)
            register(conductor, discover([MODULE]))
            logs = [Path(settings.work_dir) / f"{prefix}.log"]
            workers = start_workers(MODULE, logs, concurrency=2, env=env)
            waits: list[float] = []
            walls: list[float] = []
            try:
                time.sleep(3)  # the worker is up and polling
                for r in range(ROUNDS):
                    wf = _chain(conductor, f"{prefix}_chain{r}", f"{prefix}_{size - 1:02d}", repo)
                    walls.append((int(wf["endTime"]) - int(wf["createTime"])) / 1000)
                    waits += [
                        (int(t["startTime"]) - int(t["scheduledTime"])) / 1000 for t in wf["tasks"]
                    ]
            finally:
                stop_workers(workers)
            results[size] = (waits, walls)
    finally:
        store.delete_repository(repo)
    base = statistics.median(results[sizes[0]][0])
    print(
        f"(p) pick-up wait by task types served: one worker, --concurrency 2, a serial chain "
        f"of {STEPS} steps of the last type, {ROUNDS} rounds; baseline: {sizes[0]} type(s)"
    )
    for size, (waits, walls) in results.items():
        median = statistics.median(waits)
        p90, wall = percentile(waits, 90), statistics.median(walls)
        print(
            f"  {size:>3} task types: wait median {median * 1000:6.0f} ms, p90 "
            f"{p90 * 1000:6.0f} ms; chain wall {wall:5.1f} s; "
            f"ratio to baseline {median / base if base else float('nan'):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
