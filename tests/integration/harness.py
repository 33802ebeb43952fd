"""Driving real worker processes and workflows from tests."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.coord.lakefs_objects import LakeFSObjectsStore
from perago.coord.lease import LeaseManager
from perago.core.store import Commit

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tests.integration.taskmods.tasks"


def free_port() -> int:
    """A TCP port nothing listens on now (for servers a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    """Status and body of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def perago_cli(
    args: list[str], env: dict[str, str], *, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perago", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def register_tasks(env: dict[str, str], module: str = TASKS) -> None:
    """What `perago register MODULE` does, in this process: the module is executed afresh
    under ``env`` (its task names carry the test's suffix), its tasks registered in Conductor.
    `perago register` itself is tested as a command elsewhere (test_readme, test_cli_basics)."""
    from perago import config
    from perago._api.task import TaskDefinition
    from perago.conductor.registry import register

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.loader is not None, module
        fresh = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fresh)
        settings = config.load(env=dict(os.environ))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    tasks = [v for v in vars(fresh).values() if isinstance(v, TaskDefinition)]
    register(ConductorClient(settings), tasks)


def simple_task(name: str, ref: str, workspace: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "taskReferenceName": ref,
        "type": "SIMPLE",
        "inputParameters": {"workspace": workspace, "params": params},
    }


def fork(ref: str, branches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A FORK_JOIN ``ref`` of the given branches, then its JOIN ``<ref>_join``."""
    return [
        {"name": ref, "taskReferenceName": ref, "type": "FORK_JOIN", "forkTasks": branches},
        {
            "name": f"{ref}_join",
            "taskReferenceName": f"{ref}_join",
            "type": "JOIN",
            "joinOn": [b[-1]["taskReferenceName"] for b in branches],
        },
    ]


def dynamic_fork(tasks: str, inputs: str) -> list[dict[str, Any]]:
    """A FORK_JOIN_DYNAMIC over the tasks and inputs the given expressions name, then its
    JOIN (``fan`` and ``fan_join``)."""
    return [
        {
            "name": "fan",
            "taskReferenceName": "fan",
            "type": "FORK_JOIN_DYNAMIC",
            "inputParameters": {"dynamicTasks": tasks, "dynamicTasksInput": inputs},
            "dynamicForkTasksParam": "dynamicTasks",
            "dynamicForkTasksInputParamName": "dynamicTasksInput",
        },
        {"name": "fan_join", "taskReferenceName": "fan_join", "type": "JOIN"},
    ]


def put_workflow(conductor: ConductorClient, name: str, tasks: list[dict[str, Any]]) -> None:
    last = tasks[-1]["taskReferenceName"]
    conductor.put_workflow_defs(
        [
            {
                "name": name,
                "version": 1,
                "schemaVersion": 2,
                "ownerEmail": "perago@example.com",
                "timeoutSeconds": 600,
                "inputParameters": ["workspace"],
                "tasks": tasks,
                "outputParameters": {"workspace": f"${{{last}.output.workspace}}"},
            }
        ]
    )


def one_step(conductor: ConductorClient, name: str, task: str, params: Any) -> str:
    """Define workflow ``name``: one step ``step`` of ``task`` on the workflow's workspace."""
    put_workflow(
        conductor, name, [simple_task(task, "step", "${workflow.input.workspace}", params)]
    )
    return name


def start(
    conductor: ConductorClient,
    name: str,
    repo: str,
    *,
    ref: str | None = None,
    branch: str = "main",
    **inputs: Any,
) -> str:
    """Start ``name`` on ``repo``/``branch`` (pinned to ``ref`` if given); the workflow id."""
    workspace: dict[str, Any] = {"repository": repo, "branch": branch}
    if ref is not None:
        workspace["ref"] = ref
    return conductor.start_workflow(name, {"workspace": workspace, **inputs})


def wait_workflow(
    conductor: ConductorClient, workflow_id: str, *, timeout: float = 120, nudge: bool = False
) -> dict[str, Any]:
    """Poll until the workflow ends; ``nudge`` asks Conductor to decide it (and its running
    sub-workflows) every 2 s.

    Conductor's embedded queue re-checks a timed-out task only every ~60 s; a decide call
    makes it notice the response timeout now, as a busy production sweeper would.
    """
    deadline = time.monotonic() + timeout
    nudged = 0.0
    while True:
        wf = conductor.get_workflow(workflow_id)
        if wf.get("status") in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED"):
            return wf
        if time.monotonic() > deadline:
            raise AssertionError(
                f"workflow {workflow_id} still {wf.get('status')} after {timeout}s"
            )
        if nudge and time.monotonic() - nudged > 2:
            decide_now(conductor, workflow_id)
            for t in wf.get("tasks", []):  # and its running sub-workflows
                if t.get("subWorkflowId") and t.get("status") == "IN_PROGRESS":
                    decide_now(conductor, t["subWorkflowId"])
            nudged = time.monotonic()
        time.sleep(0.3)


def decide_now(conductor: ConductorClient, workflow_id: str) -> None:
    """Ask Conductor to decide the workflow now (see :func:`wait_workflow`)."""
    conductor.decide(workflow_id)


def requeue(stack_env: dict[str, str], task_type: str) -> None:
    """Conductor's admin requeue (``POST /tasks/queue/requeue/{type}``): every task of the
    type not yet ended goes back into its queue, in progress or not, so the next poll
    delivers a running task id again (poll count + 1), as its sweeper does under load."""
    url = f"{stack_env['CONDUCTOR_SERVER_URL']}/tasks/queue/requeue/{task_type}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30) as r:
        assert r.status == 200, r.status


def attempts(wf: dict[str, Any], ref: str) -> list[dict[str, Any]]:
    return [t for t in wf.get("tasks", []) if t.get("referenceTaskName") == ref]


def foreign_commit(store: LakeFSStore, repo: str, branch: str = "main") -> Commit:
    """A commit by a writer that is not Perago (``elsewhere/foreign.txt``)."""
    store.upload_bytes(repo, branch, "elsewhere/foreign.txt", b"someone else")
    return store.commit(repo, branch, message="foreign writer", metadata={})


def text(store: LakeFSStore, repo: str, path: str, ref: str = "main") -> str:
    """The text of ``path`` at ``ref``."""
    buf = io.BytesIO()
    store.download(repo, ref, path, buf)
    return buf.getvalue().decode()


def publications(store: LakeFSStore, repo: str, branch: str = "main") -> list[Commit]:
    """Commits on the target's first-parent history written by a Perago publication."""
    return [
        c
        for c in store.log(repo, branch, amount=100)
        if c.metadata.get("perago.kind") in ("publication", "staged")
    ]


#: What the worker logs once an attempt's report is over (its branch lease released).
_REPORT_ENDS = ("attempt_reported", "report_not_shown", "report_failed", "attempt_interrupted")


def held_leases(store: LakeFSStore, repo: str, *, settle: float = 10.0) -> list[str]:
    """The branch leases still held in ``repo`` once a worker's background releases, which
    land a write after the report, have had ``settle`` seconds to do so."""
    leases = LeaseManager(LakeFSObjectsStore(store, repo), ttl=timedelta(seconds=4))
    deadline = time.monotonic() + settle
    while True:
        held = [r.name for r in leases.records() if r.held]
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


def staging_branches(store: LakeFSStore, repo: str) -> list[str]:
    return [name for name, _ in store.list_branches(repo, prefix="perago-stg-")]


def log_events(path: Path) -> list[dict[str, Any]]:
    """The JSON events of a worker's log (other lines, such as console spans, skipped)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def attempt_spans(
    events: list[dict[str, Any]], workflow_id: str | None = None
) -> dict[str, tuple[float, float]]:
    """Each step's attempt, from its pre-guardrails to its end, as (start, end) seconds (of a
    step run once; ``workflow_id`` narrows a shared worker's log to one workflow)."""
    times: dict[str, list[float]] = {}
    for e in events:
        if e.get("event") not in ("pre_guardrails_passed", "attempt_finished"):
            continue
        if workflow_id is not None and e.get("workflow_id") != workflow_id:
            continue
        at = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
        times.setdefault(e["task_ref"], []).append(at)
    return {ref: (t[0], t[1]) for ref, t in times.items()}


class WorkerProcess:
    """A real `perago worker` subprocess whose JSON log lines tests can wait for."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        *,
        module: str = TASKS,
        concurrency: int = 1,
        extra_args: list[str] | None = None,
    ) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "perago",
                "worker",
                module,
                "--concurrency",
                str(concurrency),
                *(extra_args or []),
            ],
            cwd=ROOT,
            # No start-up janitor pass unless a test asks for one: it sweeps every repository,
            # and tests running beside this one keep orphans on purpose for their own janitor.
            env={
                **os.environ,
                "PERAGO_POLL_INTERVAL": "0.1",
                "PERAGO_LEASE_TTL": "4",
                "PERAGO_JANITOR_ON_START": "false",
                "PERAGO_WAP_SWEEP_INTERVAL": "0",
                **env,
            },
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def events(self) -> list[dict[str, Any]]:
        return log_events(self.log_path)

    def wait_for(self, event: str, *, timeout: float = 60, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if e.get("event") == event and all(e.get(k) == v for k, v in fields.items()):
                    return e
            if self.proc.poll() is not None and self.proc.returncode != 0:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"no {event} {fields} in worker log:\n{self.log_path.read_text()[-4000:]}"
        )

    def wait_killed(self, conductor: ConductorClient, workflow_id: str, timeout: float = 90) -> int:
        """Wait for the worker to die at its failpoint, nudging the workflow meanwhile."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"worker still alive after {timeout}s: {self.log_path}")
            decide_now(conductor, workflow_id)
            time.sleep(1)
        return self.proc.returncode

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, *, timeout: float = 30) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def close(self) -> None:
        """Kill the worker, once every attempt it finished is reported (up to 3 s): a test
        that ends when Conductor shows COMPLETED would otherwise kill the worker between the
        report and its branch lease release, and leave a lease held."""
        deadline = time.monotonic() + 3
        while self.proc.poll() is None and time.monotonic() < deadline:
            names = [e.get("event") for e in self.events()]
            ended = sum(names.count(n) for n in _REPORT_ENDS)
            if ended >= names.count("attempt_finished"):
                break
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@contextmanager
def worker(env: dict[str, str], log_path: Path, **kwargs: Any) -> Iterator[WorkerProcess]:
    w = WorkerProcess(env, log_path, **kwargs)
    try:
        yield w
    finally:
        w.close()
