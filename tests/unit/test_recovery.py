"""Recovery after a crash: records of dead attempts, and the fenced FAILED report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

from perago.core.orchestrator import Outcome, TaskSnapshot
from perago.testing import StubOrchestrator
from perago.worker.recovery import AttemptRecord, AttemptRecords, recover


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def _delivered(stub: StubOrchestrator, wid: str, worker_id: str) -> TaskSnapshot:
    stub.submit("t", {}, workflow_id=wid, reference_name="step", retries=2)
    (task,) = stub.poll("t", worker_id=worker_id, count=1)
    return task


def _leave_record(records: AttemptRecords, task: TaskSnapshot, worker_id: str, pid: int) -> None:
    """What a SIGKILLed attempt leaves: its record and its attempt directory."""
    with records.running(task, worker_id=worker_id) as record:
        kept = json.dumps(asdict(replace(record, pid=pid, started="")))
    records.folder.mkdir(parents=True, exist_ok=True)
    (records.folder / f"{task.task_id}-p{task.poll_count}.json").write_text(kept)
    (records.work_dir / f"{task.task_id}-abcd1234" / "workspace").mkdir(parents=True)


def test_a_dead_process_s_delivery_is_failed_at_once_and_its_leftovers_removed(
    tmp_path: Path,
) -> None:
    stub = StubOrchestrator()
    records = AttemptRecords(tmp_path)
    task = _delivered(stub, "wf-1", "host-111")
    _leave_record(records, task, "host-111", _dead_pid())
    assert recover(records, stub) == [task.task_id]
    (update,) = [u for u in stub.updates if u.kind == "report"]
    assert update.outcome.status == "FAILED" and "restarted" in update.outcome.reason
    assert list(records.folder.glob("*.json")) == []
    assert not (tmp_path / f"{task.task_id}-abcd1234").exists()


def test_deliveries_that_moved_on_or_belong_to_a_live_process_are_left_alone(
    tmp_path: Path,
) -> None:
    stub = StubOrchestrator()
    records = AttemptRecords(tmp_path)
    retried = _delivered(stub, "wf-2", "host-222")
    taken = _delivered(stub, "wf-3", "host-333")
    live = _delivered(stub, "wf-4", "host-444")
    dead = _dead_pid()
    _leave_record(records, retried, "host-222", dead)
    _leave_record(records, taken, "someone-else", dead)  # now delivered to another worker
    _leave_record(records, live, "host-444", os.getpid())  # this very process: alive
    stub.report(
        retried,
        Outcome("COMPLETED"),
        worker_id="host-222",
    )
    before = len(stub.updates)
    assert recover(records, stub) == []
    assert len(stub.updates) == before  # nothing reported
    remaining = sorted(p.name for p in records.folder.glob("*.json"))
    assert remaining == [f"{live.task_id}-p{live.poll_count}.json"]  # the live one stays


def test_unreadable_records_are_dropped(tmp_path: Path) -> None:
    records = AttemptRecords(tmp_path)
    records.folder.mkdir(parents=True)
    (records.folder / "junk-p1.json").write_text("{not json")
    assert records.orphans() == []
    assert not (records.folder / "junk-p1.json").exists()
    assert AttemptRecord("t", 1, "w", "tt", "wid", os.getpid(), "").owner_alive()


def test_a_delivery_close_to_its_response_timeout_is_left_to_conductor(tmp_path: Path) -> None:
    """Conductor may be timing it out and retrying it right now; an update then would race it."""
    stub = StubOrchestrator()
    records = AttemptRecords(tmp_path)
    stub.submit("t", {}, workflow_id="wf-9", reference_name="step", response_timeout_seconds=8)
    (task,) = stub.poll("t", worker_id="host-9", count=1)
    _leave_record(records, task, "host-9", _dead_pid())
    aged = replace(task, update_time_ms=int((time.time() - 5) * 1000))
    stub.get_task = lambda task_id: aged  # type: ignore[method-assign]
    assert recover(records, stub) == []
    assert not [u for u in stub.updates if u.kind == "report"]
    fresh = replace(task, response_timeout_seconds=120, update_time_ms=int(time.time() * 1000))
    _leave_record(records, task, "host-9", _dead_pid())
    stub.get_task = lambda task_id: fresh  # type: ignore[method-assign]
    assert recover(records, stub) == [task.task_id]


def test_records_added_while_others_end_never_fail(tmp_path: Path) -> None:
    """Attempts start and end side by side: an ending one removes the empty folder, even in
    the middle of another's ``mkdir`` (which then raised FileExistsError: CI, stop 33)."""
    records = AttemptRecords(tmp_path)
    stub = StubOrchestrator()
    tasks = [_delivered(stub, f"wf-{i}", "w") for i in range(4)]
    errors: list[BaseException] = []

    def churn(task: TaskSnapshot) -> None:
        try:
            for _ in range(300):
                with records.running(task, worker_id="w"):
                    pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(t,)) for t in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert not records.folder.exists()
