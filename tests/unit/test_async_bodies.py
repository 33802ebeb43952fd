"""``async def`` task bodies against the stub orchestrator and the in-memory store: many
awaiting at once on few threads, publication as for a plain body, cooperative cancellation,
the drain's last resort, and a blocking body named in the log. The real-server test is
tests/integration/test_runtime.py::test_thirty_async_bodies_run_at_once_on_few_threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs

import perago
from perago import TaskDefinitionError, WorkspaceSpec, task
from perago.core.orchestrator import Outcome
from perago.testing import MemoryStore, StubOrchestrator, run_task, running_worker


class Params(BaseModel):
    mode: str = "write"
    name: str = "a"


class Result(BaseModel):
    retry: int
    workflow: str


class Gate:
    """What the async bodies wait for, and how many are waiting."""

    def __init__(self) -> None:
        self.waiting = 0
        self.most = 0
        self.lock = threading.Lock()
        self.open = threading.Event()
        #: A body that waits for cancellation has started.
        self.in_body = threading.Event()
        #: Held until the test releases it: a "block" body blocks the loop on it.
        self.blocker = threading.Lock()
        self.blocker.acquire()


GATE = Gate()


@task("async_writer", workspace=WorkspaceSpec(prefix="data/{name}/"), body_retries=0)
async def async_writer(workspace: Path, params: Params) -> Result:
    me = perago.info()
    if params.mode == "gate":
        with GATE.lock:
            GATE.waiting += 1
            GATE.most = max(GATE.most, GATE.waiting)
        while not GATE.open.is_set():
            await asyncio.sleep(0.01)
        with GATE.lock:
            GATE.waiting -= 1
    elif params.mode == "until-cancelled":
        perago.progress("waiting")
        GATE.in_body.set()
        await perago.wait_cancelled_async(60)
    elif params.mode == "ignore-cancel":
        GATE.in_body.set()
        while True:
            await asyncio.sleep(0.01)
    elif params.mode == "block":
        GATE.blocker.acquire(timeout=30)  # blocks the loop until the watchdog named this line
    elif params.mode == "raise":
        raise ValueError("bad row 7")
    (workspace / f"{params.name}.txt").write_text(f"from {me.task_id}")
    return Result(retry=me.retry_count, workflow=me.workflow_id)


@pytest.fixture(autouse=True)
def _gate() -> Iterator[None]:
    GATE.__init__()  # type: ignore[misc]
    yield
    GATE.open.set()
    if GATE.blocker.locked():
        GATE.blocker.release()


def submit(stub: StubOrchestrator, wid: str, **params: Any) -> str:
    stub.submit(
        "async_writer",
        {"workspace": {"repository": "repo", "branch": "main"}, "params": params},
        workflow_id=wid,
        reference_name="step",
    )
    return wid


def settle(stub: StubOrchestrator, wid: str) -> Outcome:
    stub.wait_for(lambda s: s.settled(wid))
    outcome = stub.outcome(stub.final(wid).task_id)
    assert outcome is not None
    return outcome


def perago_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("perago-")]


def test_the_decorator_takes_coroutines_and_refuses_async_spark() -> None:
    assert async_writer.is_async
    with pytest.raises(TaskDefinitionError, match="write a Spark task as a plain `def`"):

        @task("async_spark", workspace=WorkspaceSpec(prefix="x/"))
        async def async_spark(workspace: Path, params: Params, spark: Any) -> Result:
            raise AssertionError


def test_run_task_awaits_an_async_body(tmp_path: Path) -> None:
    result = run_task(async_writer, tmp_path, {"name": "t"})
    assert isinstance(result, Result) and (tmp_path / "t.txt").exists()


def test_twenty_async_bodies_await_at_once_on_few_threads(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    with running_worker(
        [async_writer], store=store, orchestrator=stub, work_dir=tmp_path / "work", concurrency=20
    ):
        wids = [submit(stub, f"wf-{i}", mode="gate", name=f"f{i}") for i in range(20)]
        stub.wait_for(lambda s: GATE.waiting == 20)
        threads = perago_threads()
        GATE.open.set()
        outcomes = [settle(stub, wid) for wid in wids]
    # the loop, its watchdog, at most 8 step and 4 call threads: never one per attempt
    assert len(threads) <= 14, threads
    assert not any(n.startswith(("perago-attempt", "perago-extend")) for n in threads)
    assert [o.status for o in outcomes] == ["COMPLETED"] * 20
    assert outcomes[3].output["result"] == {"retry": 0, "workflow": "wf-3"}
    head = store.branch_head("repo", "main")
    files = {o.path for o in store.list_objects("repo", head, "data/")}
    assert {f"data/f{i}/f{i}.txt" for i in range(20)} <= files


def test_an_async_body_that_raises_fails_with_its_line(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    with running_worker([async_writer], store=store, orchestrator=stub, work_dir=tmp_path / "work"):
        outcome = settle(stub, submit(stub, "wf-raise", mode="raise"))
    assert outcome.status == "FAILED"
    assert "ValueError: bad row 7" in outcome.reason
    assert "test_async_bodies.py" in outcome.reason and "raise ValueError" in outcome.details
    assert store.branch_head("repo", "main") == base


def drained(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, mode: str, grace: timedelta
) -> tuple[Outcome, list[dict[str, Any]]]:
    """Run one attempt in ``mode``, drain the worker once its body runs: its outcome and
    the worker's log events."""
    with (
        capture_logs() as logs,
        running_worker(
            [async_writer],
            store=store,
            orchestrator=stub,
            work_dir=tmp_path / "work",
            shutdown_grace=grace,
        ) as worker,
    ):
        wid = submit(stub, f"wf-{mode}", mode=mode)
        assert GATE.in_body.wait(10)
        worker.stop()
        stub.wait_for(lambda s: s.outcome(s.final(wid).task_id) is not None)
    return settle(stub, wid), logs


def test_an_async_body_stops_on_cancellation_and_publishes_nothing(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    outcome, logs = drained(stub, store, tmp_path, "until-cancelled", timedelta(seconds=30))
    assert outcome.status == "FAILED" and "the attempt was cancelled" in outcome.reason
    assert "nothing published" in outcome.reason
    # it stopped by itself: the drain never had to interrupt it
    assert not [e for e in logs if e["event"] == "interrupting_attempt"]
    assert store.branch_head("repo", "main") == base


def test_an_async_body_that_ignores_cancellation_is_cancelled_after_the_grace(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    outcome, logs = drained(stub, store, tmp_path, "ignore-cancel", timedelta(milliseconds=300))
    assert outcome == Outcome("FAILED", reason="worker shutdown: the attempt was interrupted")
    assert [e["event"] for e in logs if e["event"] == "interrupting_attempt"] == [
        "interrupting_attempt"
    ]
    assert store.branch_head("repo", "main") == base


def test_a_blocking_async_body_is_named_in_the_log(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    with (
        capture_logs() as logs,
        running_worker([async_writer], store=store, orchestrator=stub, work_dir=tmp_path / "work"),
    ):
        submit(stub, "wf-block", mode="block")
        deadline = time.monotonic() + 30
        while not any(e["event"] == "event_loop_blocked" for e in logs):
            assert time.monotonic() < deadline, "the watchdog never named the blocking call"
            time.sleep(0.01)
        GATE.blocker.release()
        outcome = settle(stub, "wf-block")
    assert outcome.status == "COMPLETED"  # blocking is slow, not wrong
    blocked = [e for e in logs if e["event"] == "event_loop_blocked"]
    assert len(blocked) == 1, blocked
    assert "test_async_bodies.py" in blocked[0]["where"]
    assert blocked[0]["where"].endswith("in async_writer")
    assert blocked[0]["body"].startswith("perago-body-")
