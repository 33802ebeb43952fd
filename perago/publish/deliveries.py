"""Which deliveries of each task id this worker process has run, when each came, and which
still run.

Conductor may hand out a task again while a worker still runs it (a second poll of an
in-progress task, seen under load on the 3.32.3 server). That re-delivery waits out every
earlier delivery's report window before it takes the branch lease (docs/protocol.md, report
windows): 22.5 s from its poll in general, since another process's window closes on that
process's clock. When every earlier delivery of the task id (poll counts 1 to n-1) was this
process's own and has ended with no COMPLETED that could still land (Conductor showed it,
or none was sent), none of them has a window open or can open one, and the wait ends at
once. The worker marks a delivery ended only then; one whose COMPLETED is in doubt stays
"running".

Across processes the same fact travels as a record in the coordination store of the
repository the delivery publishes to (:class:`EndedRecords`): a delivery that learnt from
Conductor that its task id was handed out again, and ends as above, writes
``deliveries/<task id>/p<poll count>`` after it has ended, and a re-delivery in another
process stops waiting once every earlier delivery is either ended here or recorded. A record
is only ever written after the end it states, so reading it proves what a local end proves;
a record that is missing (a delivery killed, one that never resolved its target, a write
that failed) costs only the full wait. Records are written only by superseded deliveries
(a re-delivery is rare), and the janitor removes them after ``RECORD_KEEP``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

import structlog

from perago.coord.store import ABSENT, CoordStore, PredicateFailedError
from perago.errors import PeragoError
from perago.telemetry.failure_text import describe

__all__ = ["RECORD_KEEP", "EndedRecords", "LocalDeliveries"]

log = structlog.get_logger("perago.publish")

#: Task ids remembered; an older one is forgotten (its re-delivery then waits in full).
MAX_TASKS = 50_000
#: An ended-delivery record older than this is removed by the janitor: a re-delivery reads
#: records only during its wait (22.5 s from its poll), so by then none reads it any more.
RECORD_KEEP = timedelta(minutes=10)
_PREFIX = "deliveries/"


def _record_key(task_id: str, poll_count: int) -> str:
    return f"{_PREFIX}{task_id}/p{poll_count}"


class EndedRecords:
    """Ended deliveries recorded in each repository's coordination store (thread-safe)."""

    def __init__(self, stores: Callable[[str], CoordStore], *, worker_id: str) -> None:
        self._stores = stores
        self._worker_id = worker_id

    def write(self, repository: str, task_id: str, poll_count: int) -> None:
        """Record that the delivery has ended (call only once it has). Never raises (the
        worker calls it as it frees the delivery's place): a record that could not be
        written costs the re-delivery its full wait, and is logged."""
        body = json.dumps({"worker": self._worker_id, "ended_at": time.time()}).encode()
        try:
            self._stores(repository).set_if(_record_key(task_id, poll_count), body, ABSENT)
        except PredicateFailedError:
            pass  # recorded already
        except Exception as e:  # noqa: BLE001 - logged; the worker's accounting must go on
            log.warning(
                "delivery_end_record_failed",
                task_id=task_id,
                poll_count=poll_count,
                repository=repository,
                error=e.message if isinstance(e, PeragoError) else describe(e),
            )
            return
        log.info(
            "delivery_end_recorded", task_id=task_id, poll_count=poll_count, repository=repository
        )

    def all_ended(self, repository: str, task_id: str, polls: Iterable[int]) -> bool:
        """Whether each of these deliveries of the task id recorded its end (a read each,
        stopping at the first missing; a store that cannot be read counts as missing)."""
        store = self._stores(repository)
        try:
            return all(store.get(_record_key(task_id, n)) is not None for n in polls)
        except Exception as e:  # noqa: BLE001 - logged; counts as not recorded
            error = e.message if isinstance(e, PeragoError) else describe(e)
            log.warning("delivery_end_records_unread", task_id=task_id, error=error)
            return False

    def sweep(
        self, repository: str, *, older_than: timedelta = RECORD_KEEP, dry_run: bool = False
    ) -> list[str]:
        """Remove the records written more than ``older_than`` ago; the keys removed (or,
        with ``dry_run``, that would be)."""
        store, removed = self._stores(repository), []
        cutoff = time.time() - older_than.total_seconds()
        for key, current in list(store.scan(_PREFIX)):
            try:
                ended_at = float(json.loads(current.value)["ended_at"])
            except (ValueError, KeyError, TypeError):
                ended_at = 0.0  # unreadable: nothing reads it either
            if ended_at > cutoff:
                continue
            if dry_run:
                removed.append(key)
                continue
            try:
                store.delete_if(key, current.version)
            except PredicateFailedError:
                continue
            removed.append(key)
        return removed


@dataclass
class _Delivery:
    running: bool
    #: when it started here (``time.monotonic()``)
    started: float
    #: the repository it publishes to, once its target is resolved
    repository: str | None = None
    #: Conductor showed the task id handed out again: its end is recorded for other processes
    superseded: bool = False


class LocalDeliveries:
    """Deliveries this process started, per task id: running or ended (thread-safe)."""

    def __init__(self, max_tasks: int = MAX_TASKS, *, records: EndedRecords | None = None) -> None:
        self._max = max_tasks
        self._lock = threading.Lock()
        self._tasks: OrderedDict[str, dict[int, _Delivery]] = OrderedDict()
        #: Where ended deliveries are recorded for other processes (None: not at all).
        self.records = records

    def started(self, task_id: str, poll_count: int) -> None:
        """A delivery starts, after its poll's answer came (so after Conductor counted it)."""
        with self._lock:
            polls = self._tasks.setdefault(task_id, {})
            self._tasks.move_to_end(task_id)
            polls[poll_count] = _Delivery(running=True, started=time.monotonic())
            while len(self._tasks) > self._max:
                self._tasks.popitem(last=False)

    def started_at(self, task_id: str, poll_count: int) -> float | None:
        """When the delivery started here (``time.monotonic()``), None if it did not."""
        with self._lock:
            delivery = self._tasks.get(task_id, {}).get(poll_count)
            return None if delivery is None else delivery.started

    def publishes_to(self, task_id: str, poll_count: int, repository: str) -> None:
        """The delivery resolved its target: the repository its end is recorded in."""
        with self._lock:
            delivery = self._tasks.get(task_id, {}).get(poll_count)
            if delivery is not None:
                delivery.repository = repository

    def superseded(self, task_id: str, poll_count: int) -> None:
        """Conductor showed the task id handed out again: a re-delivery, perhaps in another
        process, waits for this one; its end will be recorded for it."""
        with self._lock:
            delivery = self._tasks.get(task_id, {}).get(poll_count)
            if delivery is not None:
                delivery.superseded = True

    def ended(self, task_id: str, poll_count: int) -> None:
        """The delivery is over, and no COMPLETED of it can land any more. A superseded
        delivery then records its end for other processes (after the end, never before)."""
        with self._lock:
            delivery = self._tasks.get(task_id, {}).get(poll_count)
            if delivery is None:
                return
            delivery.running = False
            repository = delivery.repository if delivery.superseded else None
        if repository is not None and self.records is not None:
            self.records.write(repository, task_id, poll_count)

    def earlier_ended_here(self, task_id: str, poll_count: int) -> bool:
        """Whether every earlier delivery of the task id was this process's and has ended."""
        if poll_count <= 1:
            return True
        with self._lock:
            polls = self._tasks.get(task_id)
            return polls is not None and all(
                k in polls and not polls[k].running for k in range(1, poll_count)
            )

    def earlier_recorded(self, repository: str, task_id: str, poll_count: int) -> bool:
        """Whether every earlier delivery not ended here recorded its end (another process's
        records; an earlier delivery still running here has none, and no read is made)."""
        if poll_count <= 1:
            return True
        with self._lock:
            polls = self._tasks.get(task_id, {})
            if any(k in polls and polls[k].running for k in range(1, poll_count)):
                return False
            elsewhere = [k for k in range(1, poll_count) if k not in polls]
        if not elsewhere:
            return True
        return self.records is not None and self.records.all_ended(repository, task_id, elsewhere)
