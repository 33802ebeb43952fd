"""(j) Spark beyond one machine: the orders pipeline at 1 M and 10 M rows in three modes.

- ``local[2]`` projection (``workers.orders.tasks``): the worker downloads ``orders/`` into
  its attempt directory, Spark runs in a driver JVM under the worker, the output is uploaded;
- in place on the standalone cluster (``workers.orders.remote``, ``spark://``): the driver
  JVM runs under the worker, the executors on the cluster's workers, data goes through the
  lakeFS S3 gateway;
- in place over Spark Connect (``sc://``): no JVM under the worker at all.

The raw orders are generated once per size by ``orders_generate_remote`` on the Connect
server, and every mode starts from that same commit (its own branch). Printed per step:
wall time (Conductor's start to end) and rows/s; per mode: the worker process's peak RSS
(``VmHWM``) and the peak RSS of JVMs under it (the local driver), sampled every 0.2 s.
The in-place modes must not grow the worker with the rows (ratio 10 M / 1 M near 1.0).
The cluster comes from ``perago dev up --spark`` (started here if it is not running).

    python -m benchmarks.spark_modes                   # 1 M and 10 M rows, every mode
    python -m benchmarks.spark_modes --rows 200000 --mode connect
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, BenchmarkError, resolve_stack
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import discover, register
from perago.config import load
from perago_dev import spark_cluster

MODES = ("local", "standalone", "connect")
STEPS = ("clean", "revenue", "report")
GENERATE = "bench_orders_generate"


@dataclass
class Peak:
    """Peak RSS of a process (its own high-water mark) and of the JVMs among its children."""

    pid: int
    worker_kib: int = 0
    jvm_kib: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Peak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.worker_kib = max(self.worker_kib, _status(self.pid, "VmHWM"))
            jvm = sum(_status(c, "VmRSS") for c in _descendants(self.pid) if _is_jvm(c))
            self.jvm_kib = max(self.jvm_kib, jvm)


def _status(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def _is_jvm(pid: int) -> bool:
    try:
        return b"java" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False


def _wait(conductor: ConductorClient, wid: str, timeout: float = 3600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        wf = conductor.get_workflow(wid)
        if wf["status"] not in ("RUNNING", "PAUSED"):
            if wf["status"] != "COMPLETED":
                raise BenchmarkError(
                    f"workflow {wid} {wf['status']}: {wf.get('reasonForIncompletion')}"
                )
            return wf
        time.sleep(1)
    raise BenchmarkError(f"workflow {wid} still running after {timeout} s")


def _worker(module: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "perago", "worker", module],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _seconds(task: dict[str, Any]) -> float:
    return (int(task["endTime"]) - int(task["startTime"])) / 1000


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spark_modes")
    p.add_argument("--rows", type=int, action="append", help="sizes (default 1 M and 10 M)")
    p.add_argument("--mode", action="append", choices=MODES, help="modes (default all)")
    args = p.parse_args(argv)
    sizes = args.rows or [1_000_000, 10_000_000]
    modes = args.mode or list(MODES)
    stack = resolve_stack()
    env = {**os.environ, **stack.env}
    cluster = spark_cluster.up(env=env)
    settings = load(env=env)
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    suffix = uuid.uuid4().hex[:8]
    repo = f"bench-spark-{suffix}"
    store.create_repository(repo)
    register(conductor, discover(["workers.orders.tasks", "workers.orders.remote"]))
    flows = [
        json.loads((ROOT / "workflows" / f"{n}.json").read_text())
        for n in ("orders_pipeline", "orders_pipeline_remote")
    ]
    generate = {
        "name": GENERATE,
        "version": 1,
        "schemaVersion": 2,
        "ownerEmail": "perago@example.com",
        "inputParameters": ["workspace", "params"],
        "tasks": [
            {
                "name": "orders_generate_remote",
                "taskReferenceName": "generate",
                "type": "SIMPLE",
                "inputParameters": {
                    "workspace": "${workflow.input.workspace}",
                    "params": "${workflow.input.params}",
                },
            }
        ],
        "outputParameters": {"workspace": "${generate.output.workspace}"},
    }
    conductor.put_workflow_defs([*flows, generate])
    logs = Path(settings.work_dir) / f"bench-spark-{suffix}"
    logs.mkdir(parents=True, exist_ok=True)
    base = {**env, "PERAGO_POLL_INTERVAL": "0.2", "PYSPARK_PYTHON": sys.executable}
    masters = {
        "local": "local[2]",
        "standalone": cluster.master_url,
        "connect": cluster.connect_url,
    }
    print(f"(j) orders pipeline by Spark mode, repository {repo}, load {os.getloadavg()[0]:.1f}")
    seeds: dict[int, str] = {}
    gen = _worker(
        "workers.orders.remote",
        {**base, "PERAGO_SPARK_MASTER": cluster.connect_url},
        logs / "generate.log",
    )
    try:
        for rows in sizes:
            branch = f"n{rows}"
            store.create_branch(repo, branch, "main")
            wid = conductor.start_workflow(
                GENERATE,
                {
                    "workspace": {"repository": repo, "branch": branch},
                    "params": {"rows": rows, "files": 8},
                },
            )
            seeds[rows] = _wait(conductor, wid)["output"]["workspace"]["ref"]
    finally:
        _stop(gen)
    results: dict[tuple[int, str], tuple[dict[str, float], Peak]] = {}
    for mode in modes:
        module = "workers.orders.tasks" if mode == "local" else "workers.orders.remote"
        flow = "orders_pipeline" if mode == "local" else "orders_pipeline_remote"
        for rows in sizes:
            branch = f"n{rows}-{mode}"
            store.create_branch(repo, branch, seeds[rows])
            proc = _worker(
                module, {**base, "PERAGO_SPARK_MASTER": masters[mode]}, logs / f"{branch}.log"
            )
            try:
                with Peak(proc.pid) as peak:
                    wid = conductor.start_workflow(
                        flow, {"workspace": {"repository": repo, "branch": branch}}
                    )
                    wf = _wait(conductor, wid)
            finally:
                _stop(proc)
            out = wf["output"]
            if out["clean"]["rows_in"] != rows or not out["report"]["passed"]:
                raise BenchmarkError(
                    f"{mode} at {rows:,} rows: clean read {out['clean']['rows_in']:,} rows, "
                    f"report passed={out['report']['passed']}: the pipeline's results are wrong"
                )
            times = {
                t["referenceTaskName"]: _seconds(t)
                for t in wf["tasks"]
                if t["status"] == "COMPLETED"
            }
            results[(rows, mode)] = (times, peak)
            total = sum(times.values())
            print(
                f"  {mode:<10} {rows:>11,} rows: "
                + ", ".join(
                    f"{s} {times[s]:.1f} s ({rows / times[s] / 1e3:,.0f} k rows/s)" for s in STEPS
                )
                + f"; total {total:.1f} s; worker peak RSS {peak.worker_kib / 1024:.0f} MiB, "
                f"JVM under it {peak.jvm_kib / 1024:.0f} MiB",
                flush=True,
            )
    if len(sizes) > 1:
        small, large = min(sizes), max(sizes)
        print(f"  growth {large:,} / {small:,} rows (worker peak RSS; total time):")
        for mode in modes:
            (t1, p1), (t2, p2) = results[(small, mode)], results[(large, mode)]
            print(
                f"    {mode:<10} RSS x{p2.worker_kib / max(p1.worker_kib, 1):.2f} "
                f"({p1.worker_kib / 1024:.0f} -> {p2.worker_kib / 1024:.0f} MiB), "
                f"time x{sum(t2.values()) / max(sum(t1.values()), 1e-9):.1f}"
            )
    local_total = {
        rows: sum(results[(rows, "local")][0].values())
        for rows in sizes
        if (rows, "local") in results
    }
    for mode in modes:
        if mode == "local" or not local_total:
            continue
        ratios = ", ".join(
            f"{rows:,}: {sum(results[(rows, mode)][0].values()) / local_total[rows]:.2f}"
            for rows in sizes
        )
        print(f"  {mode} / local[2] projection, total time: {ratios}")
    print(f"  worker logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
