"""A writable no-op task end to end through Conductor: Perago worker vs a bare worker.

Both workers run in this process as threads and poll with the same cadence (one
``batch_poll`` long-poll of 100 ms, then ``poll_interval`` idle when nothing came), so the
difference is what each does per task: the bare worker only reports COMPLETED; Perago checks
the input, pins the ref, materializes the (empty) prefix, runs the body, diffs, passes the
attempt fence (a Conductor read) and the publish fence (lakeFS reads), then reports.

The bare worker is conductor-python 2.0's generated ``TaskResourceApi`` (``batch_poll`` +
``update_task``) in a loop, not its ``TaskHandler``: TaskHandler forks a process per worker
and has its own poll interval and thread pool, which would measure its scheduling instead.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from conductor.client.configuration.configuration import Configuration
from conductor.client.http.api.metadata_resource_api import MetadataResourceApi
from conductor.client.http.api.task_resource_api import TaskResourceApi
from conductor.client.http.api_client import ApiClient
from conductor.client.http.models.task_result import TaskResult
from conductor.client.http.models.task_result_status import TaskResultStatus
from conductor.client.http.rest import ApiException
from pydantic import BaseModel

from benchmarks.common import BenchmarkError, percentile
from perago._api.task import WorkspaceSpec, task
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import register
from perago.config import Settings, load
from perago.errors import PeragoError
from perago.worker import Worker

__all__ = ["measure"]

_POLL_TIMEOUT_MS = 100  # what perago.worker.Worker asks batch_poll for


class NoParams(BaseModel):
    pass


class NoResult(BaseModel):
    pass


def _noop(workspace: Path, params: NoParams) -> NoResult:
    return NoResult()


class BareWorker:
    """conductor-python 2.0 ``TaskResourceApi``: poll one task, report it COMPLETED."""

    def __init__(self, api_url: str, task_type: str, *, worker_id: str, idle: float) -> None:
        self._api = TaskResourceApi(ApiClient(Configuration(server_api_url=api_url)))
        self._task_type = task_type
        self._worker_id = worker_id
        self._idle = idle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-bare-worker", daemon=True)
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                polled = self._api.batch_poll(
                    self._task_type,
                    workerid=self._worker_id,
                    count=1,
                    timeout=_POLL_TIMEOUT_MS,
                )
                if not polled:
                    self._stop.wait(self._idle)
                    continue
                for t in polled:
                    self._api.update_task(
                        TaskResult(
                            workflow_instance_id=t.workflow_instance_id,
                            task_id=t.task_id,
                            worker_id=self._worker_id,
                            status=TaskResultStatus.COMPLETED,
                            output_data={},
                        )
                    )
            except (ApiException, httpx.HTTPError) as e:
                self.errors.append(str(e))
                self._stop.wait(self._idle)


class _PeragoWorkerThread:
    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._thread = threading.Thread(
            target=worker.run,
            kwargs={"install_signal_handlers": False},
            name="bench-perago-worker",
            daemon=True,
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._worker.stop()
        self._thread.join(timeout=30)


def _workflow_def(name: str, task_name: str) -> dict[str, Any]:
    return {
        "name": name,
        "version": 1,
        "schemaVersion": 2,
        "ownerEmail": "perago@example.com",
        "timeoutSeconds": 120,
        "timeoutPolicy": "TIME_OUT_WF",
        "inputParameters": ["workspace"],
        "tasks": [
            {
                "name": task_name,
                "taskReferenceName": "noop",
                "type": "SIMPLE",
                "inputParameters": {"workspace": "${workflow.input.workspace}", "params": {}},
            }
        ],
    }


def _wait(conductor: ConductorClient, workflow_id: str, *, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        wf = conductor.get_workflow(workflow_id)
        if wf.get("status") in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED"):
            return wf
        if time.monotonic() > deadline:
            raise BenchmarkError(
                f"workflow {workflow_id} still {wf.get('status')} after {timeout}s"
            )
        time.sleep(0.02)


def _one(conductor: ConductorClient, workflow: str, wf_input: dict[str, Any]) -> dict[str, float]:
    """Run one workflow to its end; latencies from Conductor's own timestamps (ms)."""
    started = time.perf_counter()
    workflow_id = conductor.start_workflow(workflow, wf_input)
    wf = _wait(conductor, workflow_id)
    seen = time.perf_counter() - started
    if wf.get("status") != "COMPLETED":
        reasons = [t.get("reasonForIncompletion") for t in wf.get("tasks", [])]
        raise BenchmarkError(f"workflow {workflow_id} ended {wf.get('status')}: {reasons}")
    (t,) = wf["tasks"]
    return {
        "total": float(wf["endTime"] - (wf.get("createTime") or wf["startTime"])),
        "poll_wait": float(t["startTime"] - t["scheduledTime"]),
        "worker": float(t["endTime"] - t["startTime"]),
        "client_observed": seen * 1000,
    }


def _summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    total = [s["total"] for s in samples]
    worker = [s["worker"] for s in samples]
    return {
        "runs": len(samples),
        "median_ms": statistics.median(total),
        "p90_ms": percentile(total, 90),
        "median_poll_wait_ms": statistics.median(s["poll_wait"] for s in samples),
        "median_worker_ms": statistics.median(worker),
        "p90_worker_ms": percentile(worker, 90),
        "median_client_observed_ms": statistics.median(s["client_observed"] for s in samples),
        "samples_ms": total,
    }


def measure(env: dict[str, str], *, runs: int, work_dir: Path, warmup: int = 2) -> dict[str, Any]:
    token = uuid.uuid4().hex[:8]
    settings: Settings = load(
        env,
        janitor_on_start=False,
        concurrency=1,
        worker_id=f"bench-perago-{token}",
        work_dir=work_dir,
    )
    conductor = ConductorClient(settings)
    store = LakeFSStore(settings)
    metadata = MetadataResourceApi(
        ApiClient(Configuration(server_api_url=settings.conductor_server_url))
    )
    repo = f"bench-d-{token}"
    perago_task, bare_task = f"bench_noop_perago_{token}", f"bench_noop_bare_{token}"
    perago_wf, bare_wf = f"{perago_task}_wf", f"{bare_task}_wf"
    idle = settings.poll_interval.total_seconds()
    cycle = idle + _POLL_TIMEOUT_MS / 1000
    defn = task(
        perago_task,
        workspace=WorkspaceSpec(prefix="noop/"),
        retry_count=0,
        response_timeout=timedelta(seconds=30),
        timeout=timedelta(seconds=60),
    )(_noop)
    store.create_repository(repo)
    try:
        register(conductor, [defn])
        conductor.register_task_defs(
            [
                {
                    "name": bare_task,
                    "retryCount": 0,
                    "timeoutSeconds": 60,
                    "responseTimeoutSeconds": 30,
                    "timeoutPolicy": "TIME_OUT_WF",
                    "ownerEmail": "perago@example.com",
                }
            ]
        )
        conductor.put_workflow_defs(
            [_workflow_def(perago_wf, perago_task), _workflow_def(bare_wf, bare_task)]
        )
        perago = _PeragoWorkerThread(
            Worker([defn], settings=settings, store=store, orchestrator=conductor)
        )
        bare = BareWorker(
            settings.conductor_server_url, bare_task, worker_id=f"bench-bare-{token}", idle=idle
        )
        perago.start()
        bare.start()
        sides = {
            "perago": (perago_wf, {"workspace": {"repository": repo, "branch": "main"}}),
            "bare": (bare_wf, {}),
        }
        samples: dict[str, list[dict[str, float]]] = {"perago": [], "bare": []}
        rng = random.Random(1)
        try:
            # Interleaved, alternating who goes first, so drifting machine load hits both.
            for i in range(warmup + runs):
                for side in ("perago", "bare") if i % 2 == 0 else ("bare", "perago"):
                    # A random gap, so a start does not always meet the same point of the
                    # workers' poll cycle.
                    time.sleep(rng.uniform(0, cycle))
                    sample = _one(conductor, *sides[side])
                    if i >= warmup:
                        samples[side].append(sample)
        finally:
            perago.stop()
            bare.stop()
        results: dict[str, Any] = {
            "poll_interval_s": idle,
            "poll_timeout_ms": _POLL_TIMEOUT_MS,
            "warmup": warmup,
            "perago": _summary(samples["perago"]),
            "bare": _summary(samples["bare"]),
        }
        if bare.errors:
            results["bare"]["errors"] = bare.errors[:5]
        return results
    finally:
        for wf in (perago_wf, bare_wf):
            try:
                metadata.unregister_workflow_def(wf, 1)
            except (ApiException, httpx.HTTPError):
                pass
        for name in (perago_task, bare_task):
            try:
                metadata.unregister_task_def(name)
            except (ApiException, httpx.HTTPError):
                pass
        try:
            store.delete_repository(repo)
        except PeragoError:
            pass
        store.close()
        conductor.close()
