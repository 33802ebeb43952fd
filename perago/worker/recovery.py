"""Fast recovery after a crash: a restarted worker fails the attempts its previous life lost.

Without it, an attempt whose worker was killed stays IN_PROGRESS in Conductor until its
response timeout (2 minutes by default) runs out, and only then is it retried. Every running
attempt therefore leaves a small record under ``<work_dir>/attempts/`` naming its task id,
delivery (poll count), worker id and owning process; the record is removed when the attempt
ends. A worker starting up looks for records whose process is gone (a pid that is no longer
alive, or alive as another program since), removes what those attempts left in the work
directory, and reports each such delivery FAILED at once, but only if the orchestrator still
shows that very delivery IN_PROGRESS under the dead process's worker id (the same fence as
any report: a delivery that was retried, finished or taken over is left alone). Conductor
then retries it after the task's retry delay. What the dead attempt left in lakeFS (a staging
branch, a branch lease) is handled as for any dead attempt: the retry's publish fence, the
janitor, the lease's takeover.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from perago.core.orchestrator import IN_PROGRESS, Orchestrator, Outcome, TaskSnapshot
from perago.errors import PeragoError
from perago.workspace.processes import is_running, process_start

__all__ = ["AttemptRecord", "AttemptRecords", "recover"]

log = structlog.get_logger("perago.worker.recovery")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class AttemptRecord:
    """One running attempt, as a restarted worker needs to find it."""

    task_id: str
    poll_count: int
    workflow_id: str
    task_type: str
    worker_id: str
    pid: int
    started: str  # the owning process's start time ("" when unknown)

    def owner_alive(self) -> bool:
        return is_running(self.pid, self.started)


#: Attempts of one process add and remove records from many threads; the folder is
#: created and removed under this lock, so one thread's end never removes it under another.
_FOLDER_LOCK = threading.Lock()


class AttemptRecords:
    """The records under ``<work_dir>/attempts/``, one file per running attempt."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.folder = work_dir / "attempts"

    def _path(self, task_id: str, poll_count: int) -> Path:
        return self.folder / f"{_UNSAFE.sub('_', task_id)[:64]}-p{poll_count}.json"

    def add(self, task: TaskSnapshot, *, worker_id: str) -> Path:
        """Record a delivery this process now runs; :meth:`remove` when it is reported."""
        pid = os.getpid()
        record = AttemptRecord(
            task_id=task.task_id,
            poll_count=task.poll_count,
            workflow_id=task.workflow_id,
            task_type=task.task_type,
            worker_id=worker_id,
            pid=pid,
            started=process_start(pid) or "",
        )
        path = self._path(task.task_id, task.poll_count)
        tmp = path.with_suffix(".tmp")
        for tries_left in reversed(range(5)):
            # An ending attempt removes the empty folder: never one of this process in the
            # middle (the lock), but another worker sharing the folder may, even between
            # mkdir's own "exists" and "is a directory" checks (FileExistsError): try again.
            try:
                with _FOLDER_LOCK:
                    self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                    tmp.write_text(json.dumps(asdict(record)))
                    os.replace(tmp, path)
                break
            except (FileNotFoundError, FileExistsError):
                if not tries_left:
                    raise
        return path

    def remove(self, path: Path) -> None:
        with _FOLDER_LOCK:
            path.unlink(missing_ok=True)
            with suppress(OSError):  # only when empty: the work directory is left as found
                self.folder.rmdir()

    @contextmanager
    def running(self, task: TaskSnapshot, *, worker_id: str) -> Iterator[AttemptRecord]:
        """:meth:`add` for the duration of a block."""
        path = self.add(task, worker_id=worker_id)
        try:
            yield AttemptRecord(**json.loads(path.read_text()))
        finally:
            self.remove(path)

    def orphans(self) -> list[tuple[Path, AttemptRecord]]:
        """Records whose owning process is gone (unreadable ones are dropped with a warning)."""
        found = []
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            try:
                record = AttemptRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as e:
                log.warning("attempt_record_unreadable", path=str(path), error=str(e))
                path.unlink(missing_ok=True)
                continue
            if not record.owner_alive():
                found.append((path, record))
        return found

    def remove_leftovers(self, record: AttemptRecord) -> int:
        """Delete the attempt directories the dead attempt left (``<task id>-<random>``)."""
        removed = 0
        prefix = _UNSAFE.sub("_", record.task_id)[:64] + "-"
        for child in self.work_dir.iterdir() if self.work_dir.is_dir() else []:
            if child.is_dir() and child.name.startswith(prefix) and child != self.folder:
                shutil.rmtree(child, ignore_errors=True)
                removed += 1
        return removed


#: Leave a delivery to Conductor when its response timeout is this close (or past): its
#: sweeper may be retrying it right now, and an update of a task Conductor just timed out and
#: retried would fail the workflow (Conductor updates without compare-and-set). Also covers
#: clock skew between this worker and Conductor (updateTime is Conductor's clock).
TIMEOUT_MARGIN_SECONDS = 10.0


def _timing_out(task: TaskSnapshot) -> bool:
    if not task.response_timeout_seconds or not task.update_time_ms:
        return False
    idle = time.time() - task.update_time_ms / 1000
    return idle > task.response_timeout_seconds - TIMEOUT_MARGIN_SECONDS


def lost_reason(record: AttemptRecord) -> str:
    return (
        f"worker {record.worker_id} restarted: this attempt was lost in a crash of process "
        f"{record.pid} (found by the restarted worker, so Conductor retries it now instead of "
        "after the response timeout)"
    )


def recover(records: AttemptRecords, orchestrator: Orchestrator) -> list[str]:
    """Fail at once the deliveries a dead process of this worker left IN_PROGRESS; returns
    their task ids. Errors are logged, never raised: the response timeout still applies."""
    failed = []
    for path, record in records.orphans():
        bound = log.bind(
            workflow_id=record.workflow_id,
            task_id=record.task_id,
            poll_count=record.poll_count,
            dead_worker_id=record.worker_id,
        )
        dirs = records.remove_leftovers(record)
        try:
            task = orchestrator.get_task(record.task_id)
            live = (
                task is not None
                and task.status == IN_PROGRESS
                and task.worker_id == record.worker_id
                and task.poll_count == record.poll_count
                and not _timing_out(task)
            )
            if task is not None and live:
                orchestrator.report(
                    task, Outcome("FAILED", reason=lost_reason(record)), worker_id=record.worker_id
                )
                failed.append(record.task_id)
                bound.warning("lost_attempt_failed", removed_dirs=dirs)
            else:
                bound.info(
                    "lost_attempt_left_to_conductor",
                    status=task.status if task else "unknown to the orchestrator",
                    removed_dirs=dirs,
                )
        except PeragoError as e:
            bound.warning("lost_attempt_recovery_failed", error=e.message)
            continue  # keep the record: the next start tries again
        with suppress(OSError):
            path.unlink()
    return failed
