"""(m) A worker that stays small: 2,000 attempts of mixed task types through one worker.

One ``perago worker benchmarks.worker_soak_tasks --concurrency 8`` runs one-step workflows
of four task types, started so that about 16 are open at a time: light writers (each its
own partition; one in ten fails its first attempt and is retried), read-only readers (of a
fixed folder of 200 files), and
one Spark task in twenty (capped at one attempt at a time). Every 2 s the worker process's
RSS, threads and open file descriptors are sampled, and the RSS of the Spark driver JVM
under it. At the end, cancellable slow tasks are started and the worker is drained with
them in flight (SIGTERM): they stop and are reported drained. Printed: the figures after
warm-up (the first 200 attempts) and at the end, and their growth per 1,000 attempts.

    python -m benchmarks.worker_soak            # 2,000 attempts
    python -m benchmarks.worker_soak 500
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, resolve_stack
from benchmarks.spark_modes import _descendants, _is_jvm, _status
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import discover, register
from perago.config import load

KINDS = {"soak_write": 0.75, "soak_read": 0.20, "soak_spark": 0.05}
OPEN, WARM_UP, SLOW, REF_FILES = 16, 200, 4, 200


def _sample(pid: int) -> dict[str, int]:
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = 0
    jvm = sum(_status(c, "VmRSS") for c in _descendants(pid) if _is_jvm(c))
    return {
        "rss_kib": _status(pid, "VmRSS"),
        "threads": _status(pid, "Threads"),
        "fds": fds,
        "jvm_kib": jvm,
    }


def _fd_kinds(pid: int) -> dict[str, int]:
    """Open descriptors by what they point at (socket, pipe, a file's directory, ...)."""
    kinds: dict[str, int] = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            kind = target.split(":")[0] if ":" in target else os.path.dirname(target)
            kinds[kind] = kinds.get(kind, 0) + 1
    except OSError:
        pass
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def _workflows(conductor: ConductorClient, suffix: str) -> dict[str, str]:
    names = {}
    defs = []
    for kind in [*KINDS, "soak_slow"]:
        name = f"{kind}_{suffix}"
        names[kind] = name
        defs.append(
            {
                "name": name,
                "version": 1,
                "schemaVersion": 2,
                "ownerEmail": "perago@example.com",
                "inputParameters": ["workspace", "params"],
                "tasks": [
                    {
                        "name": kind,
                        "taskReferenceName": "step",
                        "type": "SIMPLE",
                        "inputParameters": {
                            "workspace": "${workflow.input.workspace}",
                            "params": "${workflow.input.params}",
                        },
                    }
                ],
            }
        )
    conductor.put_workflow_defs(defs)
    return names


def main(argv: list[str]) -> int:
    total = int(argv[0]) if argv else 2000
    rng = random.Random(7)
    stack = resolve_stack()
    env = {**os.environ, **stack.env}
    settings = load(env=env)
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    suffix = uuid.uuid4().hex[:6]
    repo = f"bench-soak-{suffix}"
    store.create_repository(repo)
    # The readers read a fixed folder: the work per attempt stays the same all along the run
    # (reading every partition written so far would grow it, and the memory with it).
    for i in range(REF_FILES):
        store.upload_bytes(repo, "main", f"soak_ref/r{i}.bin", os.urandom(2048))
    store.commit(repo, "main", message="soak: the readers' folder", metadata={})
    register(conductor, discover(["benchmarks.worker_soak_tasks"]))
    names = _workflows(conductor, suffix)
    log = Path(settings.work_dir) / f"bench-soak-{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    samples: list[tuple[int, dict[str, int]]] = []
    with log.open("w") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "perago", "worker"),
                *("benchmarks.worker_soak_tasks", "--concurrency", "8"),
            ],
            cwd=ROOT,
            env={**env, "PERAGO_POLL_INTERVAL": "0.1", "PERAGO_SPARK_MASTER": "local[1]"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            open_: dict[str, str] = {}
            started = finished = 0
            attempts = 0
            last = 0.0
            failed: list[str] = []
            while finished < total:
                while started < total and len(open_) < OPEN:
                    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
                    params: dict[str, Any] = {"part": str(started)}
                    if kind == "soak_write" and started % 10 == 3:
                        params["fail_first"] = True
                    head = store.branch_head(repo, "main")
                    ws = {"repository": repo, "branch": "main", "ref": head}
                    wid = conductor.start_workflow(names[kind], {"workspace": ws, "params": params})
                    open_[wid] = kind
                    started += 1
                for wid in list(open_):
                    wf = conductor.get_workflow(wid)
                    if wf["status"] in ("RUNNING", "PAUSED"):
                        continue
                    attempts += len(wf.get("tasks", []))
                    if wf["status"] != "COMPLETED":
                        failed.append(f"{open_[wid]} {wid}: {wf.get('reasonForIncompletion')}")
                    del open_[wid]
                    finished += 1
                if time.monotonic() - last >= 2:
                    samples.append((attempts, _sample(worker.pid)))
                    last = time.monotonic()
                time.sleep(0.2)
            samples.append((attempts, _sample(worker.pid)))
            fd_kinds = _fd_kinds(worker.pid)
            # The drain: cancellable slow attempts in flight, then SIGTERM.
            ws = {"repository": repo, "branch": "main"}
            slow = [
                conductor.start_workflow(
                    names["soak_slow"], {"workspace": ws, "params": {"part": f"s{i}"}}
                )
                for i in range(SLOW)
            ]
            deadline = time.monotonic() + 60

            def running(wid: str) -> bool:
                tasks = conductor.get_workflow(wid).get("tasks") or []
                return bool(tasks) and tasks[-1]["status"] == "IN_PROGRESS"

            while time.monotonic() < deadline and not all(running(w) for w in slow):
                time.sleep(0.5)
            time.sleep(1)
            drain_started = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=120)
            drained = time.monotonic() - drain_started
        finally:
            if worker.poll() is None:
                worker.kill()
    reasons = [
        (conductor.get_workflow(w)["tasks"][-1].get("reasonForIncompletion") or "") for w in slow
    ]
    warm = next(s for a, s in samples if a >= WARM_UP)
    warm_at = next(a for a, _ in samples if a >= WARM_UP)
    end_at, end = samples[-1]
    per_k = 1000 / max(1, end_at - warm_at)
    print(
        f"(m) worker soak: {total} workflows, {end_at} attempts through one worker "
        f"(--concurrency 8; write {KINDS['soak_write']:.0%}, read {KINDS['soak_read']:.0%}, "
        f"Spark {KINDS['soak_spark']:.0%} capped at 1; one writer in ten fails once)"
    )
    print("  figure           | after warm-up | at the end | growth per 1,000 attempts")
    for key, unit, scale in (
        ("rss_kib", "MiB", 1024),
        ("threads", "", 1),
        ("fds", "", 1),
        ("jvm_kib", "MiB", 1024),
    ):
        a, b = warm[key] / scale, end[key] / scale
        print(
            f"  {key:<16} | {a:10.1f} {unit:<3}| {b:7.1f} {unit:<3}| {(b - a) * per_k:+.1f} {unit}"
        )
    curve = []
    for share in (0.25, 0.5, 0.75, 1.0):
        at, sample = next((a, x) for a, x in samples if a >= share * end_at)
        curve.append(f"{at}: {sample['rss_kib'] / 1024:.0f} MiB, {sample['fds']} fds")
    print(f"  along the run (attempts: worker RSS, descriptors): {'; '.join(curve)}")
    print(
        f"  workflows not COMPLETED: {len(failed)}" + (f" (first: {failed[0]})" if failed else "")
    )
    cancelled = sum("cancelled (the worker is draining" in r for r in reasons)
    print(
        f"  drain with {SLOW} cancellable attempts in flight: exit {code} after {drained:.1f} s, "
        f"{cancelled} of {SLOW} reported drained (cancelled)"
    )
    print(f"  open descriptors at the end, by kind: {fd_kinds}")
    print(f"  worker log: {log}")
    return 0 if not failed and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
