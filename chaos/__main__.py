"""`python -m chaos`: the seeded chaos run and its audit (see docs/chaos.md)."""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from perago import config
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.coord.factory import branch_leases
from perago.errors import ConflictError, PeragoError
from perago.publish.janitor import sweep, sweep_leases, takeover_watch
from perago_dev import stack

from .audit import Figures, Run, audit, percentile
from .controller import Fault, Workers, fault_schedule
from .proxy import Toxiproxy, toxic
from .workflows import definitions, params_for

ROOT = Path(__file__).resolve().parents[1]
_TERMINAL = ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _say(text: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {text}", flush=True)


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed: int = args.seed
        self.profile = "embedded"  # the stack's, once set up
        self.stop = threading.Event()  # the end of everything (the starter, the nudger)
        self.stop_faults = threading.Event()
        self.runs: list[Run] = []
        self.open: set[str] = set()  # workflow ids not yet seen terminal
        self.lock = threading.Lock()
        self.heads: dict[tuple[str, str], set[str]] = {}
        self.foreign: list[tuple[str, str, str]] = []
        self.done_faults: Counter[str] = Counter()
        self.fault_errors: Counter[str] = Counter()
        self.logs = ROOT / ".stack" / "chaos" / f"seed-{self.seed}-{uuid.uuid4().hex[:6]}"
        self.logs.mkdir(parents=True, exist_ok=True)

    # -- set-up ---------------------------------------------------------------------------

    def setup(self) -> None:
        _say("starting the stack")
        info = stack.up(progress=False)
        self.profile = info.profile
        self.stack_env = info.env()
        self.settings = config.load(env=self.stack_env)
        self.store = LakeFSStore(self.settings)
        self.conductor = ConductorClient(self.settings)
        env = {**self.stack_env, "CHAOS_RESPONSE_TIMEOUT": str(self.args.response_timeout)}
        done = subprocess.run(
            [sys.executable, "-m", "perago", "register", "chaos.tasks"],
            cwd=ROOT,
            env={**dict(__import__("os").environ), **env},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"perago register failed: {done.stderr}")
        self.conductor.put_workflow_defs(definitions())
        tag = uuid.uuid4().hex[:4]
        self.repos = [f"chaos-{self.seed}-{tag}-{k}" for k in range(self.args.repositories)]
        for repo in self.repos:
            self.store.create_repository(repo)
        worker_env = dict(env)
        self.proxy: Toxiproxy | None = None
        if self.args.proxy:
            _say("starting toxiproxy (built from the Go module proxy on first use)")
            self.proxy = Toxiproxy(_free_port(), self.logs / "toxiproxy.log")
            ports = {"lakefs": _free_port(), "conductor": _free_port()}
            upstream = json.loads((ROOT / ".stack" / "ports.json").read_text())
            self.proxy.add("lakefs", ports["lakefs"], int(upstream["lakefs"]))
            self.proxy.add("conductor", ports["conductor"], int(upstream["conductor"]))
            worker_env["LAKECTL_SERVER_ENDPOINT_URL"] = f"http://127.0.0.1:{ports['lakefs']}"
            worker_env["CONDUCTOR_SERVER_URL"] = f"http://127.0.0.1:{ports['conductor']}/api"
        worker_env.update(
            {
                "PERAGO_POLL_INTERVAL": "0.2",
                "PERAGO_LEASE_TTL": "10",
                "PERAGO_HTTP_TIMEOUT": "20",
            }
        )
        self.workers = Workers(
            self.args.workers, concurrency=self.args.concurrency, env=worker_env, logs=self.logs
        )

    # -- the run --------------------------------------------------------------------------

    def start_workflows(self, rng: random.Random, started_at: float) -> None:
        gap = self.args.minutes * 60 / self.args.workflows
        for i in range(self.args.workflows):
            kind, sleep = params_for(rng)
            repo = self.repos[rng.randrange(len(self.repos))]
            when = started_at + i * gap
            while time.monotonic() < when and not self.stop.is_set():
                self.stop.wait(min(1.0, when - time.monotonic()))
            if self.stop.is_set():
                return
            while not self.stop.is_set():
                with self.lock:
                    busy = len(self.open)
                if busy < self.args.max_open:
                    break
                self.stop.wait(1)
            branch = f"wf-{i:05d}"
            started = self._start_one(i, kind, repo, branch, sleep)
            if started is None:
                continue
            wid, head = started
            with self.lock:
                self.runs.append(Run(wid, kind, repo, branch, head))
                self.open.add(wid)

    def _start_one(
        self, i: int, kind: str, repo: str, branch: str, sleep: float
    ) -> tuple[str, str] | None:
        """Create the workflow's branch and start it, riding out server restarts."""
        head = ""
        for _ in range(100):
            if self.stop.is_set():
                return None
            try:
                if not head:
                    try:
                        self.store.create_branch(repo, branch, self.store.branch_head(repo, "main"))
                    except ConflictError:
                        pass  # created by an earlier try whose answer was lost
                    head = self.store.branch_head(repo, branch)
                workspace = {"repository": repo, "branch": branch, "ref": head}
                wid = self.conductor.start_workflow(kind, {"workspace": workspace, "sleep": sleep})
                return wid, head
            except PeragoError as e:  # a server is restarting: try again
                _say(f"start {i} failed, retrying: {e.message[:120]}")
                self.stop.wait(3)
        return None

    def nudge(self) -> None:
        """Conductor's sweeper, sped up: decide open workflows (and sub-workflows) often."""
        while not self.stop.wait(3):
            with self.lock:
                ids = list(self.open)
                runs = [r for r in self.runs if r.workflow_id in self.open]
            for wid in ids:
                try:
                    wf = self.conductor.get_workflow(wid)
                    if wf.get("status") in _TERMINAL:
                        with self.lock:
                            self.open.discard(wid)
                        continue
                    self.conductor.decide(wid)
                    for t in wf.get("tasks", []):
                        if t.get("subWorkflowId") and t.get("status") == "IN_PROGRESS":
                            self.conductor.decide(t["subWorkflowId"])
                except PeragoError:
                    continue
            for run in runs:
                try:
                    head = self.store.branch_head(run.repository, run.branch)
                except PeragoError:
                    continue
                self.heads.setdefault((run.repository, run.branch), set()).add(head)

    def fault(self, f: Fault, rng: random.Random) -> None:
        n = self.args.workers
        if f.action == "kill_worker":
            slot = f.target % n
            self.workers.kill(slot)
            self.stop_faults.wait(min(f.seconds, 5))
            self.workers.start(slot)
        elif f.action == "pause_worker":
            self.workers.pause(f.target % n, f.seconds, self.stop_faults.wait)
        elif f.action == "restart_lakefs":
            stack.restart("lakefs")
        elif f.action == "restart_conductor":
            stack.restart("conductor")
        elif f.action == "foreign_commit":
            with self.lock:
                runs = [r for r in self.runs if r.workflow_id in self.open]
            if not runs:
                return
            run = runs[f.target % len(runs)]
            name = f"foreign/{uuid.uuid4().hex[:8]}.txt"
            self.store.upload_bytes(run.repository, run.branch, name, b"not Perago")
            commit = self.store.commit(
                run.repository,
                run.branch,
                message="a foreign writer",
                metadata={"chaos.kind": "foreign"},
            )
            self.foreign.append((run.repository, run.branch, commit.id))
        elif f.action == "proxy_fault" and self.proxy is not None:
            body, seconds = toxic(f.detail, rng)
            target = ["lakefs", "conductor"][f.target % 2]
            self.proxy.add_toxic(target, body)
            self.stop_faults.wait(seconds)
            self.proxy.remove_toxic(target, str(body["name"]))

    def faults(self, schedule: list[Fault], started_at: float) -> None:
        rng = random.Random(self.seed * 7919)  # the toxics' details, drawn in schedule order
        for f in schedule:
            while time.monotonic() < started_at + f.at:
                if self.stop_faults.wait(min(1.0, started_at + f.at - time.monotonic())):
                    return
            if self.stop_faults.is_set():
                return
            _say(f"fault: {f.action} target={f.target} {f.detail}")
            try:
                self.fault(f, rng)
                self.done_faults[f.action if not f.detail else f"proxy_{f.detail}"] += 1
            except Exception as e:  # noqa: BLE001 - a fault that fails is counted, the run goes on
                self.fault_errors[f.action] += 1
                _say(f"fault {f.action} failed: {type(e).__name__}: {e}")

    def run(self) -> dict[str, Any]:
        args = self.args
        rng = random.Random(self.seed)
        schedule = fault_schedule(
            random.Random(self.seed + 1),
            duration=args.minutes * 60,
            workers=args.workers,
            mean_gap=args.fault_gap,
            proxies=args.proxy,
        )
        self.setup()
        _say(
            f"seed {self.seed}: {args.workflows} workflows over {args.minutes} min, "
            f"{args.workers} workers x {args.concurrency}, {len(schedule)} faults; logs in "
            f"{self.logs}"
        )
        self.workers.start_all()
        started_at = time.monotonic()
        threads = [
            threading.Thread(target=self.nudge, daemon=True),
            threading.Thread(target=self.faults, args=(schedule, started_at), daemon=True),
        ]
        for t in threads:
            t.start()
        self.start_workflows(rng, started_at)
        self.stop_faults.wait(max(0.0, started_at + args.minutes * 60 - time.monotonic()))
        self.stop_faults.set()
        _say(f"faults over; {len(self.runs)} workflows started; letting them finish")
        threads[1].join(timeout=120)
        if self.proxy is not None:
            self.proxy.clear()
        self.workers.ensure_running()
        deadline = time.monotonic() + args.grace * 60
        while time.monotonic() < deadline:
            with self.lock:
                left = len(self.open)
            if not left:
                break
            time.sleep(5)
        self.stop.set()
        elapsed = time.monotonic() - started_at
        _say("stopping workers (SIGTERM, drain)")
        self.workers.stop_all()
        return self.finish(elapsed, schedule)

    def finish(self, elapsed: float, schedule: list[Fault]) -> dict[str, Any]:
        _say("janitor: staging branches, then leases (watched for the takeover time)")
        removed = sweep(self.store, self.conductor, repositories=self.repos)
        leases = branch_leases(self.settings, self.store)
        held: list[str] = []
        lease_removed = 0
        if leases is not None:
            report = sweep_leases(
                leases, repositories=self.repos, watch=takeover_watch(self.settings)
            )
            lease_removed = len(report.removed)
            for repo in self.repos:
                held += [
                    f"{repo} {r.name} by {r.owner}"
                    for r in leases.manager(repo).records(f"branches/{repo}/")
                    if r.held
                ]
        _say("audit")
        f = audit(
            self.settings,
            self.conductor,
            self.runs,
            sampled_heads=self.heads,
            foreign=self.foreign,
            leases_held=held,
        )
        result = self.figures(f, elapsed, schedule, len(removed.removed), lease_removed)
        if self.proxy is not None:
            self.proxy.close()
        return result

    def figures(
        self, f: Figures, elapsed: float, schedule: list[Fault], staging: int, leases: int
    ) -> dict[str, Any]:
        a = self.args
        on = "PERAGO_STACK_PROFILE=production " if self.profile == "production" else ""
        return {
            "seed": self.seed,
            "profile": self.profile,
            "command": (
                f"{on}make chaos CHAOS_ARGS='--seed {self.seed} --minutes {a.minutes} --workflows "
                f"{a.workflows} --workers {a.workers} --concurrency {a.concurrency}"
                f"{'' if a.proxy else ' --no-proxy'}'"
            ),
            "finished": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "minutes": round(elapsed / 60, 1),
            "workers": a.workers,
            "concurrency": a.concurrency,
            "workflows_started": len(self.runs),
            "workflows": dict(f.workflows),
            "kinds": dict(f.kinds),
            "steps": f.steps,
            "attempts": dict(f.attempts),
            "attempts_total": sum(f.attempts.values()),
            "publications": f.publications,
            "faults_scheduled": len(schedule),
            "faults_done": dict(self.done_faults),
            "faults_failed": dict(self.fault_errors),
            "janitor_removed_staging_branches": staging,
            "janitor_removed_leases": leases,
            "double_publications": f.double_publications,
            "lost_publications_of_completed_steps": f.lost_publications,
            "publications_without_a_completed_step": f.publications_without_completed_step,
            "foreign_commits": f.foreign_commits,
            "foreign_commits_replaced": f.foreign_commits_replaced,
            "orphan_staging_branches_after_janitor": f.orphan_staging_branches,
            "leases_left_held": f.leases_held,
            "commits_checked_for_reachability": f.commits_checked,
            "unreachable_commits": f.unreachable_commits,
            "step_latency_p50_s": round(percentile(f.step_seconds, 50), 2),
            "step_latency_p99_s": round(percentile(f.step_seconds, 99), 2),
            "attempt_latency_p50_s": round(percentile(f.attempt_seconds, 50), 2),
            "attempt_latency_p99_s": round(percentile(f.attempt_seconds, 99), 2),
            "violations": f.violations(),
        }


def _markdown(r: dict[str, Any]) -> str:
    def n(key: str) -> int:
        v = r[key]
        return len(v) if isinstance(v, list) else int(v)

    wf = r["workflows"]
    done, failed = wf.get("COMPLETED", 0), wf.get("FAILED", 0)
    rows = [
        ("workflows started", r["workflows_started"]),
        (
            "workflows completed / failed / other",
            f"{done} / {failed} / {r['workflows_started'] - done - failed}",
        ),
        ("mix", ", ".join(f"{k} {v}" for k, v in sorted(r["kinds"].items()))),
        ("steps", r["steps"]),
        (
            "attempts (by status)",
            f"{r['attempts_total']} ("
            + ", ".join(f"{k} {v}" for k, v in sorted(r["attempts"].items()))
            + ")",
        ),
        ("publications on target branches", r["publications"]),
        ("faults done", ", ".join(f"{k} {v}" for k, v in sorted(r["faults_done"].items()))),
        ("**double publications**", n("double_publications")),
        ("**lost publications of COMPLETED steps**", n("lost_publications_of_completed_steps")),
        (
            "publications of steps Conductor did not record COMPLETED",
            n("publications_without_a_completed_step"),
        ),
        (
            "**foreign commits replaced** (of committed)",
            f"{n('foreign_commits_replaced')} (of {r['foreign_commits']})",
        ),
        (
            "**orphan staging branches after the janitor**",
            n("orphan_staging_branches_after_janitor"),
        ),
        ("**leases left held**", n("leases_left_held")),
        (
            "**unreachable commits** (of checked)",
            f"{n('unreachable_commits')} (of {r['commits_checked_for_reachability']})",
        ),
        (
            "step latency p50 / p99 (scheduled to COMPLETED, retries included)",
            f"{r['step_latency_p50_s']} s / {r['step_latency_p99_s']} s",
        ),
        (
            "attempt latency p50 / p99 (start to end)",
            f"{r['attempt_latency_p50_s']} s / {r['attempt_latency_p99_s']} s",
        ),
    ]
    lines = [
        f"### Seed {r['seed']}: {r['minutes']} min, {r['workers']} workers x "
        f"{r['concurrency']}, {r.get('profile', 'embedded')} profile ({r['finished']})",
        "",
        f"`{r['command']}`",
        "",
        "| figure | value |",
        "|---|---:|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--minutes", type=float, default=20, help="how long faults are injected")
    p.add_argument("--workflows", type=int, default=200, help="started evenly over the run")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=3, help="attempts per worker (2-4)")
    p.add_argument("--repositories", type=int, default=4)
    p.add_argument("--max-open", type=int, default=40, help="workflows running at once, at most")
    p.add_argument("--fault-gap", type=float, default=20, help="mean seconds between faults")
    p.add_argument("--response-timeout", type=float, default=20)
    p.add_argument("--grace", type=float, default=10, help="minutes to let workflows finish")
    p.add_argument("--no-proxy", dest="proxy", action="store_false", help="no Toxiproxy")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "chaos.md")
    args = p.parse_args(argv)
    chaos = Chaos(args)
    result = chaos.run()
    (chaos.logs / "figures.json").write_text(json.dumps(result, indent=2))
    text = _markdown(result)
    print(text)
    print(json.dumps({k: v for k, v in result.items() if isinstance(v, list) and v}, indent=2))
    if args.out:
        existing = args.out.read_text() if args.out.exists() else ""
        marker = "<!-- chaos runs: newest first -->\n"
        if marker not in existing:
            existing = existing or "# Chaos run figures\n\n"
            existing += "\n" + marker
        head, _, tail = existing.partition(marker)
        args.out.write_text(head + marker + "\n" + text + "\n" + tail)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
