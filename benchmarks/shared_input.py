"""(k) A 12-way fan-out whose tasks all read one 50 MiB dimension (issue 25).

Each of 12 DYNAMIC_FORK tasks (``bench_shared_input``) reads its own 64 KiB partition and the
one shared dimension (5 x 10 MiB under ``bench/dim/``) through named inputs, and writes a
one-line summary of its own. Two worker processes (``--concurrency 2`` each) run it twice in
one run: with the content cache (the default) and, as the baseline, with it off
(``PERAGO_CACHE_BYTES=0``: every attempt fetches every input byte). Printed per run: the
workflow's wall time, and per worker the input bytes fetched from lakeFS (not from the
cache, from the workers' ``input_materialized`` events), and the ratio cached / baseline.

    python -m benchmarks.shared_input       # PERAGO_BENCH_DIM_MIB to change the dimension
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

from benchmarks.common import ROOT, fanout_workflow, resolve_stack
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import discover, register
from perago.config import load

PARTS = 12
WORKERS = 2
TASK = "bench_shared_input"
MIB = 1024 * 1024
WORKER = [sys.executable, "-m", "perago", "worker", "benchmarks.shared_input_tasks"]
DIM_MIB = int(os.environ.get("PERAGO_BENCH_DIM_MIB", "50"))


def _seed(store: LakeFSStore, repo: str) -> str:
    chunks = 5
    for i in range(chunks):
        store.upload_bytes(repo, "main", f"bench/dim/d{i}.bin", os.urandom(DIM_MIB * MIB // chunks))
    for p in range(PARTS):
        store.upload_bytes(repo, "main", f"bench/in/p={p}/rows.bin", os.urandom(64 * 1024))
    return store.commit(repo, "main", message="seed", metadata={}).id


def _run(
    conductor: ConductorClient,
    env: dict[str, str],
    name: str,
    repo: str,
    base: str,
    logs: list[Path],
    extra_env: dict[str, str],
) -> float:
    workers = []
    for log in logs:
        out = log.open("w")
        workers.append(
            (
                subprocess.Popen(
                    [*WORKER, "--concurrency", "2"],
                    cwd=ROOT,
                    env={**env, "PERAGO_POLL_INTERVAL": "0.1", **extra_env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                ),
                out,
            )
        )
    try:
        time.sleep(3)  # both workers polling before the fork is scheduled
        # Each run publishes on a branch of its own, from the same seed commit.
        ws = {"repository": repo, "branch": name.replace("_", "-"), "ref": base}
        tasks = [
            {"name": TASK, "taskReferenceName": f"p{i}", "type": "SIMPLE"} for i in range(PARTS)
        ]
        inputs = {f"p{i}": {"workspace": ws, "params": {"part": str(i)}} for i in range(PARTS)}
        wid = conductor.start_workflow(name, {"workspace": ws, "tasks": tasks, "inputs": inputs})
        while True:
            wf = conductor.get_workflow(wid)
            if wf.get("status") in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED"):
                break
            time.sleep(0.2)
        if wf["status"] != "COMPLETED":
            raise SystemExit(f"workflow {wid} {wf['status']}: {wf.get('reasonForIncompletion')}")
        return (int(wf["endTime"]) - int(wf["startTime"])) / 1000
    finally:
        for proc, out in workers:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            out.close()


def _fetched(log: Path) -> dict[str, int]:
    """Input bytes this worker fetched from lakeFS, per input name; and attempts run."""
    out: dict[str, int] = defaultdict(int)
    for line in log.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            e = json.loads(line)
            if e.get("event") == "input_materialized":
                out[e["input"]] += int(e["downloaded_bytes"])
                out["attempts"] += e["input"] == "dim"
    return dict(out)


def main() -> int:
    stack = resolve_stack()
    env = {**os.environ, **stack.env}
    settings = load(env=env)
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    suffix = uuid.uuid4().hex[:8]
    repo = f"bench-shared-{suffix}"
    store.create_repository(repo)
    base = _seed(store, repo)
    register(conductor, discover(["benchmarks.shared_input_tasks"]))
    logdir = Path(settings.work_dir) / f"bench-shared-{suffix}"
    logdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, tuple[float, list[dict[str, int]]]] = {}
    for label, extra in (("baseline (cache off)", {"PERAGO_CACHE_BYTES": "0"}), ("cached", {})):
        name = f"bench_shared_{label.split()[0]}_{suffix}"
        conductor.put_workflow_defs([fanout_workflow(name)])
        logs = [logdir / f"{name}-w{i}.log" for i in range(WORKERS)]
        store.create_branch(repo, name.replace("_", "-"), base)
        wall = _run(conductor, env, name, repo, base, logs, extra)
        results[label] = (wall, [_fetched(log) for log in logs])
    print(
        f"(k) shared input: {PARTS}-way DYNAMIC_FORK, each task reads a 64 KiB partition and "
        f"one {DIM_MIB} MiB dimension; {WORKERS} workers x --concurrency 2"
    )
    totals = {}
    for label, (wall, per_worker) in results.items():
        dims = [w.get("dim", 0) for w in per_worker]
        totals[label] = sum(dims)
        shown = ", ".join(
            f"worker {i}: {w.get('attempts', 0)} tasks, dimension fetched {d / MIB:.0f} MiB"
            for i, (w, d) in enumerate(zip(per_worker, dims, strict=True))
        )
        print(f"  {label}: wall {wall:.1f} s; {shown}")
    base_total, cached_total = totals["baseline (cache off)"], totals["cached"]
    print(
        f"  dimension bytes fetched, cached / baseline: {cached_total / MIB:.0f} / "
        f"{base_total / MIB:.0f} MiB = {cached_total / max(base_total, 1):.2f}"
    )
    print(f"  worker logs: {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
