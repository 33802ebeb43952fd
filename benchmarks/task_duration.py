"""(h) A task's own duration in Conductor (start to end) against ``lakectl local`` on the data.

A Perago worker runs in this process (a thread, concurrency 1) with two tasks:

* ``read``: a read-only task over ``data/`` whose body only counts the files (the input, N
  small files, was committed by lakectl beforehand, not timed);
* ``write``: a writable task over ``out/`` whose body "produces" M files instantly (it
  renames the folders of a tree prepared for the run into the workspace, so the body's own
  time is negligible; hard links were used before, but a linked file is never adopted by
  the cache), then Perago diffs, stages, fences and merges them.

Seconds are Conductor's task ``endTime - startTime`` (poll to the COMPLETED update). The
lakectl side is one process each: ``lakectl local clone`` of the same ``data/`` and
``lakectl local commit`` of the same tree onto a fresh branch.

Cache rows (the worker's content cache): the read task again on the same worker (the
re-read), and a read of what the write task just published (``out/`` at its head).
The first two rows run on a worker with ``PERAGO_CACHE_BYTES=0`` (no cache), so they are
first reads.
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from benchmarks.common import BenchmarkError, Trash, TreeSpec, write_tree
from perago._api.task import WorkspaceSpec, task
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.conductor.registry import register
from perago.config import load
from perago.worker import Worker

__all__ = ["measure"]


class Params(BaseModel):
    source: str = ""


class Count(BaseModel):
    files: int


def _workflow(name: str, task_name: str) -> dict[str, Any]:
    return {
        "name": name,
        "version": 1,
        "schemaVersion": 2,
        "ownerEmail": "perago@example.com",
        "timeoutSeconds": 600,
        "timeoutPolicy": "TIME_OUT_WF",
        "inputParameters": ["workspace", "params"],
        "tasks": [
            {
                "name": task_name,
                "taskReferenceName": "step",
                "type": "SIMPLE",
                "inputParameters": {
                    "workspace": "${workflow.input.workspace}",
                    "params": "${workflow.input.params}",
                },
            }
        ],
    }


def _read_body(workspace: Path, params: Params) -> Count:
    return Count(files=sum(len(files) for _, _, files in os.walk(workspace)))


def _write_body(workspace: Path, params: Params) -> Count:
    """Move a tree prepared for this run into the workspace: output produced instantly."""
    for name in os.listdir(params.source):
        os.rename(Path(params.source) / name, workspace / name)
    return Count(files=sum(len(files) for _, _, files in os.walk(workspace)))


def _run(conductor: ConductorClient, workflow: str, wf_input: dict[str, Any]) -> float:
    """Run one workflow; the task's own duration in seconds (Conductor's timestamps)."""
    workflow_id = conductor.start_workflow(workflow, wf_input)
    deadline = time.monotonic() + 600
    while True:
        wf = conductor.get_workflow(workflow_id)
        if wf.get("status") in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED"):
            break
        if time.monotonic() > deadline:
            raise BenchmarkError(f"workflow {workflow_id} still running after 600 s")
        time.sleep(0.05)
    if wf.get("status") != "COMPLETED":
        reasons = [t.get("reasonForIncompletion") for t in wf.get("tasks", [])]
        raise BenchmarkError(f"workflow {workflow_id} ended {wf.get('status')}: {reasons}")
    (t,) = wf["tasks"]
    return float(t["endTime"] - t["startTime"]) / 1000


class _WorkerThread:
    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._thread = threading.Thread(
            target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True
        )

    def __enter__(self) -> _WorkerThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._worker.stop()
        self._thread.join(timeout=60)


def measure(
    env: dict[str, str],
    lakectl: Any,
    *,
    reads: TreeSpec,
    writes: TreeSpec,
    repeats: int,
    work_dir: Path,
) -> dict[str, Any]:
    token = uuid.uuid4().hex[:8]
    repo = f"bench-h-{token}"
    read_name, write_name = f"bench_read_{token}", f"bench_write_{token}"
    base = load(env, janitor_on_start=False, concurrency=1, work_dir=work_dir / "work")
    store = LakeFSStore(base)
    conductor = ConductorClient(base)
    common: dict[str, Any] = {"retry_count": 0, "response_timeout": timedelta(seconds=300)}
    read_task = task(read_name, workspace=WorkspaceSpec("data/", read_only=True), **common)(
        _read_body
    )
    read_out = task(f"{read_name}_out", workspace=WorkspaceSpec("out/", read_only=True),
                    **common)(_read_body)  # fmt: skip
    write_task = task(write_name, workspace=WorkspaceSpec("out/"), **common)(_write_body)
    tasks = [read_task, read_out, write_task]
    produced = work_dir / "produced"
    write_tree(produced / "part", writes, seed=7)
    store.create_repository(repo)
    samples: dict[str, list[tuple[float, float]]] = {}
    trash = Trash(work_dir / "trash")

    def add(row: str, perago_s: float, lakectl_s: float) -> None:
        samples.setdefault(row, []).append((perago_s, lakectl_s))

    try:
        src = work_dir / "input"
        write_tree(src, reads, seed=8)
        lakectl.init(f"lakefs://{repo}/main/data/", src)
        lakectl.commit(src, "bench h: input")
        register(conductor, tasks)
        conductor.put_workflow_defs([_workflow(f"{t.name}_wf", t.name) for t in tasks])
        on_main = {"workspace": {"repository": repo, "branch": "main"}, "params": {}}

        def clone(uri: str = f"lakefs://{repo}/main/data/") -> float:
            out = work_dir / f"clone-{uuid.uuid4().hex[:6]}"
            run = lakectl.clone(uri, out)
            trash.discard(out)
            return float(run.seconds)

        for rep in range(repeats):
            branch = f"perago-{rep}"
            store.create_branch(repo, branch, "main")
            l_branch = f"lakectl-{rep}"
            store.create_branch(repo, l_branch, "main")

            def write_input(on: str) -> dict[str, Any]:
                fresh = work_dir / f"produced-{uuid.uuid4().hex[:6]}"  # the body empties it
                shutil.copytree(produced, fresh)
                return {
                    "workspace": {"repository": repo, "branch": on},
                    "params": {"source": str(fresh)},
                }

            # No cache: first reads and a plain write.
            cold = load(env, janitor_on_start=False, concurrency=1, work_dir=work_dir / "work",
                        cache_bytes=0)  # fmt: skip
            with _WorkerThread(Worker(tasks, settings=cold, store=store, orchestrator=
                                      conductor)):  # fmt: skip
                add(f"(h) read task, {reads.describe()}", _run(conductor, f"{read_name}_wf",
                    on_main), clone())  # fmt: skip
                l_src = work_dir / f"lakectl-src-{rep}"
                shutil.copytree(produced, l_src, copy_function=os.link)
                lakectl.init(f"lakefs://{repo}/{l_branch}/out/", l_src)
                perago_w = _run(conductor, f"{write_name}_wf", write_input(branch))
                add(f"(h) write task, {writes.describe()}", perago_w,
                    float(lakectl.commit(l_src, "bench h").seconds))  # fmt: skip
                trash.discard(l_src)
            # With the cache: read, read again; write, then read what was written.
            warm = load(env, janitor_on_start=False, concurrency=1, work_dir=work_dir / "work",
                        cache_dir=work_dir / "cache")  # fmt: skip
            store.create_branch(repo, f"{branch}-c", "main")
            with _WorkerThread(Worker(tasks, settings=warm, store=store, orchestrator=
                                      conductor)):  # fmt: skip
                _run(conductor, f"{read_name}_wf", on_main)
                add(f"(h) read task again on the same worker, {reads.describe()}",
                    _run(conductor, f"{read_name}_wf", on_main), clone())  # fmt: skip
                chained = f"{branch}-c"
                _run(conductor, f"{write_name}_wf", write_input(chained))
                # the next step on this worker reads what the write just published
                add(f"(h) read what the previous step on the worker published, "
                    f"{writes.describe()}",
                    _run(conductor, f"{read_name}_out_wf",
                         {"workspace": {"repository": repo, "branch": chained}, "params": {}}),
                    clone(f"lakefs://{repo}/{chained}/out/"))  # fmt: skip
        rows = []
        for name, pairs in samples.items():
            p = statistics.median(x for x, _ in pairs)
            lk = statistics.median(y for _, y in pairs)
            rows.append({"scenario": name, "perago_s": p, "lakectl_s": lk,
                         "ratio": lk / p if p else None, "samples": pairs})  # fmt: skip
        return {"rows": rows}
    finally:
        trash.empty()
        try:
            store.delete_repository(repo)
        except Exception:  # noqa: BLE001 - cleanup only
            pass
        store.close()
        conductor.close()
