"""(l) Fan-out at scale: a DYNAMIC_FORK of 64, 256 (and 1,000) writers of one branch, against
a plain Conductor worker writing to lakeFS without the protocol.

Each partition is ``bench_scale_part``: no work, 5 x 1 KiB on its own prefix
``parts/p=<n>/``. Two ``perago worker`` processes with ``--concurrency 8`` and default
settings run every fan-out, one fresh repository per size, created through lakeFS's API as
a user who never ran ``perago repo init`` would (no expected-head hook; ``--hook`` installs
it). The baseline, measured in the same run on the same stack, is the peer a user would
pick instead: :mod:`benchmarks.plain_worker`, two conductor-python worker processes with 8
threads each running the same DYNAMIC_FORK (branch at the input ref, upload, commit, merge
with retries, delete the branch). Also measured: lakeFS alone (the same publications 16 at
a time from one client, no Conductor) and the read-only floor (the same fan-out through
Perago publishing nothing). Printed per size: wall times (Conductor start to COMPLETED),
Perago's ratio to the plain worker, publications per second, lease grants and joins (group
commit), and CPU seconds per process and phase.

    python -m benchmarks.fanout_scale                 # 64 and 256
    python -m benchmarks.fanout_scale 64 256 1000
    python -m benchmarks.fanout_scale --hook 256      # with the expected-head hook
    python -m benchmarks.fanout_scale --perago-only 5000   # Perago and its floor only
    python -m benchmarks.fanout_scale --nested 10 1000     # 10 sub-workflows of 100 each

``--nested G`` runs every phase (Perago, the plain worker, the read-only floor) as Conductor's
own answer to a wide fork: an outer DYNAMIC_FORK of G SUB_WORKFLOW tasks, each a DYNAMIC_FORK
of its share of the partitions (Conductor's decider re-evaluates a workflow's tasks on every
update, so G forks of N/G cost less than one of N).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.common import (
    Stack,
    cpu_seconds,
    fanout_workflow,
    percentile,
    resolve_stack,
    start_workers,
    stop_workers,
)
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import discover, register
from perago.config import load
from perago.errors import StoreError
from perago.publish.expected_head_hook import install

T = TypeVar("T")
TASK, READ_TASK, PLAIN_TASK = "bench_scale_part", "bench_scale_read", "bench_plain_part"
WORKERS, CONCURRENCY, BASELINE_THREADS = 2, 8, 16
WARM_UP = 64  # partitions of the read-only fan-out run (and not measured) before the first
FILES, SIZE = 5, 1024


def _wait(conductor: ConductorClient, wid: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        wf = conductor.get_workflow(wid, include_tasks=False)
        if wf.get("status") in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED"):
            if wf["status"] != "COMPLETED":
                raise SystemExit(
                    f"workflow {wid} {wf['status']}: {wf.get('reasonForIncompletion')}"
                )
            return wf
        time.sleep(0.5)
    raise SystemExit(f"workflow {wid} did not finish within {timeout:.0f} s")


def _nested(
    flow: str, ws: dict[str, Any], tasks: list[dict[str, Any]], inputs: dict[str, Any], groups: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The outer fork's tasks and inputs: ``groups`` sub-workflows of ``flow``, each with its
    share of the partitions."""
    outer_tasks, outer_inputs = [], {}
    for g in range(groups):
        mine = tasks[g::groups]
        outer_tasks.append(
            {
                "name": flow,
                "taskReferenceName": f"g{g}",
                "type": "SUB_WORKFLOW",
                "subWorkflowParam": {"name": flow, "version": 1},
            }
        )
        outer_inputs[f"g{g}"] = {
            "workspace": ws,
            "tasks": mine,
            "inputs": {t["taskReferenceName"]: inputs[t["taskReferenceName"]] for t in mine},
        }
    return outer_tasks, outer_inputs


def _fanout(
    conductor: ConductorClient,
    store: LakeFSStore,
    flow: str,
    parts: int,
    task: str = TASK,
    hook: bool = False,
    nested: int = 0,
) -> tuple[float, list[str]]:
    """(wall time, the ids of the workflows that ran the partitions) of a fan-out of
    ``parts`` ``task`` steps on a fresh repository, in ``nested`` sub-workflows (0: one
    flat fork); every partition checked on ``main`` exactly once."""
    repo = f"bench-scale-{parts}-{uuid.uuid4().hex[:6]}"
    store.create_repository(repo)
    if hook:
        install(store, repo, "main")  # the expected-head hook, as `perago repo init` commits it
    ws = {"repository": repo, "branch": "main", "ref": store.branch_head(repo, "main")}
    tasks = [{"name": task, "taskReferenceName": f"p{i}", "type": "SIMPLE"} for i in range(parts)]
    inputs = {f"p{i}": {"workspace": ws, "params": {"part": str(i)}} for i in range(parts)}
    if nested:
        tasks, inputs = _nested(flow, ws, tasks, inputs, nested)
    wid = conductor.start_workflow(
        f"{flow}_outer" if nested else flow, {"workspace": ws, "tasks": tasks, "inputs": inputs}
    )
    wf = _wait(conductor, wid, timeout=60 + parts * 2.0)
    ran = [wid]
    if nested:
        outer = conductor.get_workflow(wid, include_tasks=True)
        ran = [t["subWorkflowId"] for t in outer["tasks"] if t.get("subWorkflowId")]
        if len(ran) != nested:
            raise SystemExit(f"{wid}: {len(ran)} sub-workflows ran, expected {nested}")
    if task != READ_TASK:
        history = _history(store, repo)
        if task == TASK:  # each publication is a commit of its own kind
            landed = sum(c.metadata.get("perago.kind") == "publication" for c in history)
        else:  # each of the plain worker's merges
            landed = sum(len(c.parents) == 2 for c in history)
        if landed != parts:
            raise SystemExit(f"{repo}: {landed} publications on main, expected {parts}")
        files = sum(1 for _ in store.list_objects(repo, "main", prefix="parts/"))
        if files != parts * FILES:
            raise SystemExit(f"{repo}: {files} files under parts/, expected {parts * FILES}")
    return (int(wf["endTime"]) - int(wf["startTime"])) / 1000, ran


def _history(store: LakeFSStore, repo: str) -> list[Any]:
    """The whole first-parent history of ``main``, a page of lakeFS's log at a time."""
    out: list[Any] = []
    ref = "main"
    while True:
        page = store.log(repo, ref, amount=1000)
        out += page if not out else page[1:]
        if len(page) < 1000 or not page[-1].parents:
            return out
        ref = page[-1].id


def _alone(store: LakeFSStore, parts: int) -> float:
    """lakeFS alone: the same publications, BASELINE_THREADS at a time."""
    repo = f"bench-alone-{parts}-{uuid.uuid4().hex[:6]}"
    store.create_repository(repo)
    head = store.branch_head(repo, "main")

    def publish(i: int) -> None:
        branch = f"w{i}"
        store.create_branch(repo, branch, head)
        for f in range(FILES):
            store.upload_bytes(repo, branch, f"parts/p={i}/f{f}.bin", os.urandom(SIZE))
        store.commit(repo, branch, message=f"part {i}", metadata={})
        for attempt in range(20):
            try:
                store.merge(repo, branch, "main", message=f"merge part {i}", metadata={})
                break
            except StoreError as e:
                if e.status != 429 or attempt == 19:
                    raise
                time.sleep(0.05 * 2 ** min(attempt, 5))
        store.delete_branch(repo, branch)

    started = time.monotonic()
    with ThreadPoolExecutor(BASELINE_THREADS) as pool:
        list(pool.map(publish, range(parts)))
    return time.monotonic() - started


#: Events of a lease grant: the member that logs them may already have left its
#: attempt's log context, so they are taken whatever workflow they name (only publishing
#: attempts take leases).
_GRANT_EVENTS = frozenset({"branch_lease_acquired", "branch_lease_group_ended"})


def _events(logs: list[Path], workflow_ids: list[str]) -> list[dict[str, Any]]:
    out = []
    for log in logs:
        for line in log.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if e.get("workflow_id") in workflow_ids or e.get("event") in _GRANT_EVENTS:
                out.append(e)
    return out


def _figures(logs: list[Path], workflow_ids: list[str]) -> tuple[int, int, list[float], int]:
    """(lease grants taken, joined, publication latencies diffed -> published, retries)."""
    acquired = joined = retried = 0
    started: dict[str, datetime] = {}
    latencies = []
    for e in _events(logs, workflow_ids):
        event = e.get("event")
        acquired += event == "branch_lease_acquired"
        joined += event == "branch_lease_joined"
        retried += event == "attempt_finished" and e.get("retry_count", 0) > 0
        at = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
        if event == "diffed":
            started[e["task_id"]] = at
        elif event == "published" and e["task_id"] in started:
            latencies.append((at - started.pop(e["task_id"])).total_seconds())
    return acquired, joined, sorted(latencies), retried


def _branch_time(logs: list[Path], workflow_ids: list[str]) -> tuple[float, float, float]:
    """Where the target branch's time went in a Perago run, from the workers' logs:
    (seconds some publication held its turn, of which the merges' answers, seconds grants
    stayed held after their last merge: the members leaving it; before issue 41's report
    windows, their COMPLETED reports, sent under the lease)."""
    held = merges = tails = 0.0
    for log in logs:
        last_merge: datetime | None = None
        for e in _events([log], workflow_ids):
            event = e.get("event")
            at = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
            if event == "published":
                held += e.get("turn_held_ms", 0.0) / 1000
                merges += e.get("merge_ms", 0.0) / 1000
                last_merge = at
            elif event == "branch_lease_acquired":
                last_merge = None
            elif event == "branch_lease_group_ended" and last_merge is not None:
                tails += (at - last_merge).total_seconds()
                last_merge = None
    return held, merges, tails


_REQUESTS = re.compile(
    r"^http_server_requests_seconds_(?P<kind>count|sum)\{(?P<labels>.*)\} (?P<value>\S+)$"
)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class _Meter:
    """What a phase costs: the CPU seconds the stack's services, the phase's workers and
    this process (lakeFS alone's client) use over it, the machine's cores bounding what a
    phase can do in its wall time (only for the local stack, ``perago_dev``: a stack named
    by the environment may run elsewhere); and Conductor's API calls (``calls``, one entry
    per phase)."""

    def __init__(self, stack: Stack, conductor_url: str) -> None:
        self.pids: dict[str, int] = {}
        if stack.source.startswith("perago_dev"):
            from perago_dev.stack import service_pids

            self.pids = service_pids()
        self._prometheus = conductor_url.removesuffix("/").removesuffix("/api") + (
            "/actuator/prometheus"
        )
        #: the Conductor calls of each phase measured, in order: (method uri) -> (count, s)
        self.calls: list[dict[str, tuple[float, float]]] = []

    def _calls(self) -> dict[str, tuple[float, float]]:
        """Conductor's own count and server seconds of each API call (Spring's
        ``http.server.requests``); empty if the server does not publish them."""
        try:
            with _no_proxy.open(self._prometheus, timeout=10) as answer:
                text = answer.read().decode()
        except OSError:
            return {}
        calls: dict[str, list[float]] = {}
        for line in text.splitlines():
            m = _REQUESTS.match(line)
            if m is None:
                continue
            labels = dict(_LABEL.findall(m.group("labels")))
            if not labels.get("uri", "").startswith("/api/"):
                continue
            key = f"{labels.get('method', '?')} {labels['uri']}"
            entry = calls.setdefault(key, [0.0, 0.0])
            entry[0 if m.group("kind") == "count" else 1] += float(m.group("value"))
        return {k: (v[0], v[1]) for k, v in calls.items()}

    def read(self, workers: list[int]) -> dict[str, float]:
        if not self.pids:
            return {}
        used = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        used["workers"] = sum(cpu_seconds(pid) for pid in workers)
        used["client"] = sum(os.times()[:2])
        return used

    def measure(self, phase: Callable[[], T], workers: list[int]) -> tuple[T, dict[str, float]]:
        before, calls = self.read(workers), self._calls()
        result = phase()
        after, calls_after = self.read(workers), self._calls()
        self.calls.append(
            {
                k: (n - calls.get(k, (0.0, 0.0))[0], t - calls.get(k, (0.0, 0.0))[1])
                for k, (n, t) in calls_after.items()
                if n > calls.get(k, (0.0, 0.0))[0]
            }
        )
        return result, {k: after[k] - before[k] for k in after}


def _start_plain(env: dict[str, str], log: Path) -> list[subprocess.Popen[bytes]]:
    """The plain worker's processes: WORKERS x CONCURRENCY threads, as Perago's."""
    with log.open("w") as out:
        return [
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.plain_worker", PLAIN_TASK, str(CONCURRENCY)],
                cwd=Path(__file__).resolve().parent.parent,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for _ in range(WORKERS)
        ]


def _stop_plain(workers: list[subprocess.Popen[bytes]]) -> None:
    """conductor-python's handler runs a process per worker: stop the whole group."""
    for w in workers:
        os.killpg(w.pid, signal.SIGTERM)
    for w in workers:
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(w.pid, signal.SIGKILL)
            w.wait()


NOT_RUN = float("nan")  # a phase --perago-only skips


def _s(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds:.1f} s"


def _x(wall: float, baseline: float) -> str:
    return "-" if baseline != baseline else f"{wall / baseline:.2f}x"


def _plain(
    env: dict[str, str],
    work_dir: Path,
    suffix: str,
    cpu: _Meter,
    conductor: ConductorClient,
    store: LakeFSStore,
    flow: str,
    parts: int,
    nested: int = 0,
) -> tuple[float, dict[str, float]]:
    """The plain worker's phase: its processes started for it, stopped after."""
    plain_workers = _start_plain(env, work_dir / f"bench-scale-{suffix}-{parts}-plain.log")
    try:
        time.sleep(2)  # the handler's processes start polling
        (plain, _), used = cpu.measure(
            partial(_fanout, conductor, store, flow, parts, PLAIN_TASK, nested=nested),
            [w.pid for w in plain_workers],
        )
        return plain, used
    finally:
        _stop_plain(plain_workers)


def main(argv: list[str]) -> int:
    hook, perago_only = "--hook" in argv, "--perago-only" in argv
    nested = 0
    if "--nested" in argv:
        at = argv.index("--nested")
        nested = int(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    sizes = [int(a) for a in argv if not a.startswith("--")] or [64, 256]
    stack = resolve_stack()
    env = {**os.environ, **stack.env}
    settings = load(env=env)
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    suffix = uuid.uuid4().hex[:8]
    flow = f"bench_scale_{suffix}"
    register(conductor, discover(["benchmarks.fanout_scale_tasks"]))
    conductor.register_task_defs(
        [{"name": PLAIN_TASK, "retryCount": 0, "ownerEmail": "perago@example.com"}]
    )
    timeout = int(60 + max(sizes) * 2.0)  # as _fanout waits
    conductor.put_workflow_defs(
        [
            fanout_workflow(flow, timeout_seconds=timeout),
            fanout_workflow(f"{flow}_outer", timeout_seconds=timeout),
        ]
    )
    cpu = _Meter(stack, settings.conductor_server_url)
    rows: list[tuple[int, float, float, float, float, list[str], list[Path]]] = []
    used: list[tuple[int, str, float, dict[str, float]]] = []
    logs: list[Path] = []
    for parts in sizes:
        size_logs = [
            Path(settings.work_dir) / f"bench-scale-{suffix}-{parts}-w{n}.log"
            for n in range(WORKERS)
        ]
        logs += size_logs
        workers = start_workers(
            "benchmarks.fanout_scale_tasks", size_logs, concurrency=CONCURRENCY, env=env
        )
        pids = [w.pid for w in workers]
        try:
            if not rows:  # warm Conductor's JIT first: the first fan-out after a start is slow
                _fanout(conductor, store, flow, WARM_UP, READ_TASK)
            (floor, _), floor_cpu = cpu.measure(
                partial(_fanout, conductor, store, flow, parts, READ_TASK, nested=nested), pids
            )
            (wall, wid), perago_cpu = cpu.measure(
                partial(_fanout, conductor, store, flow, parts, TASK, hook, nested), pids
            )
        finally:
            stop_workers(workers)
        used += [(parts, "read-only", floor, floor_cpu), (parts, "Perago", wall, perago_cpu)]
        plain = alone = NOT_RUN
        if not perago_only:
            plain, plain_cpu = _plain(env, Path(settings.work_dir), suffix, cpu, conductor,
                                      store, flow, parts, nested)  # fmt: skip
            alone, alone_cpu = cpu.measure(partial(_alone, store, parts), [])
            used += [(parts, "plain worker", plain, plain_cpu),
                     (parts, "lakeFS alone", alone, alone_cpu)]  # fmt: skip
        rows.append((parts, wall, plain, alone, floor, wid, size_logs))
    print(
        f"(l) fan-out at scale{f' in {nested} sub-workflows' if nested else ''}: "
        f"{WORKERS} workers x {CONCURRENCY} places, each partition "
        f"{FILES} x {SIZE // 1024} KiB, expected-head hook {'on' if hook else 'off'}; plain: "
        f"conductor-python + lakefs-sdk without the protocol; lakeFS alone: the same "
        f"publications {BASELINE_THREADS} at a time; read-only: the fan-out publishing nothing"
    )
    print(
        "  partitions | Perago | plain worker | ratio | lakeFS alone | read-only | "
        "publications/s | latency p50 / p99 | lease taken / joined | retried"
    )
    for parts, wall, plain, alone, floor, ran, size_logs in rows:
        acquired, joined, lat, retried = _figures(size_logs, ran)
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        print(
            f"  {parts:10d} | {wall:4.1f} s | {_s(plain):>12} | {_x(wall, plain):>5} | "
            f"{_s(alone):>12} | {floor:7.1f} s | {parts / wall:14.1f} | "
            f"{p50:6.2f} / {p99:5.2f} s    | {acquired:>10} / {joined:<6}   | {retried}"
        )
    print(
        "  where the branch's time went in Perago's phase: turns (the publish fence, merge and "
        "read-back, one publication at a time), grant tails (after a grant's last merge, until "
        "its members have left it) and the rest (no staged publication in the holding "
        "process, grants changing hands)"
    )
    print("  partitions | wall    | turns held (merges)  | grant tails | rest")
    for parts, wall, *_, ran, size_logs in rows:
        held, merges, tails = _branch_time(size_logs, ran)
        rest = max(0.0, wall - held - tails)
        print(
            f"  {parts:10d} | {wall:5.1f} s | {held:5.1f} s ({merges:5.1f} s) | "
            f"{tails:9.1f} s | {rest:4.1f} s"
        )
    print(f"  worker logs: {', '.join(str(p) for p in logs)}")
    if used and used[0][3]:
        _print_cpu(used)
    if any(cpu.calls):
        _print_calls(used, cpu.calls)
    return 0


def _print_cpu(used: list[tuple[int, str, float, dict[str, float]]]) -> None:
    """CPU seconds per process in each phase and how busy the cores were (100 %: every core
    for the whole wall time, so the phase could not have gone faster on this machine)."""
    cores = os.cpu_count() or 1
    names = list(used[0][3])
    print(f"  CPU seconds per phase ({cores} cores; client: this process, lakeFS alone's client)")
    print(
        f"  partitions | {'phase':<12} | wall   | "
        + " | ".join(f"{n:>9}" for n in names)
        + " | total  | cores busy"
    )
    for parts, phase, wall, cpu in used:
        total = sum(cpu.values())
        print(
            f"  {parts:10d} | {phase:<12} | {wall:4.1f} s | "
            + " | ".join(f"{cpu[n]:7.1f} s" for n in names)
            + f" | {total:4.1f} s | {100 * total / (wall * cores):4.0f} %"
        )


def _print_calls(
    used: list[tuple[int, str, float, dict[str, float]]],
    calls: list[dict[str, tuple[float, float]]],
) -> None:
    """Conductor's API calls per partition in each phase (its own counts), and the server's
    milliseconds per call (time in the server, waits included: a long-poll's or the
    workflow's lock): who makes how many of which call."""
    phases = ["read-only", "Perago", "plain worker"]
    table: dict[int, dict[str, dict[str, tuple[float, float]]]] = {}
    for (parts, phase, _wall, _cpu), c in zip(used, calls, strict=True):
        if phase in phases:
            table.setdefault(parts, {})[phase] = c
    print("  Conductor's calls per partition in each phase (server ms per call, waits included)")
    print(f"  partitions | {'call':<38} | " + " | ".join(f"{p:>16}" for p in phases))
    for parts, by_phase in table.items():
        kinds = sorted({k for c in by_phase.values() for k in c})
        for kind in kinds:
            cells = []
            for phase in phases:
                n, t = by_phase.get(phase, {}).get(kind, (0.0, 0.0))
                cells.append(f"{n / parts:5.2f} ({1000 * t / n:6.1f})" if n else f"{'-':>16}")
            print(f"  {parts:10d} | {kind:<38} | " + " | ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
