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
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

__all__ = ["LocalDeliveries"]

#: Task ids remembered; an older one is forgotten (its re-delivery then waits in full).
MAX_TASKS = 50_000


class LocalDeliveries:
    """Deliveries this process started, per task id: running or ended (thread-safe)."""

    def __init__(self, max_tasks: int = MAX_TASKS) -> None:
        self._max = max_tasks
        self._lock = threading.Lock()
        #: task id -> poll count -> (still running, when it started: ``time.monotonic()``)
        self._tasks: OrderedDict[str, dict[int, tuple[bool, float]]] = OrderedDict()

    def started(self, task_id: str, poll_count: int) -> None:
        """A delivery starts, after its poll's answer came (so after Conductor counted it)."""
        with self._lock:
            polls = self._tasks.setdefault(task_id, {})
            self._tasks.move_to_end(task_id)
            polls[poll_count] = (True, time.monotonic())
            while len(self._tasks) > self._max:
                self._tasks.popitem(last=False)

    def started_at(self, task_id: str, poll_count: int) -> float | None:
        """When the delivery started here (``time.monotonic()``), None if it did not."""
        with self._lock:
            delivery = self._tasks.get(task_id, {}).get(poll_count)
            return None if delivery is None else delivery[1]

    def ended(self, task_id: str, poll_count: int) -> None:
        """The delivery is over, and no COMPLETED of it can land any more."""
        with self._lock:
            polls = self._tasks.get(task_id)
            if polls is not None and poll_count in polls:
                polls[poll_count] = (False, polls[poll_count][1])

    def earlier_ended_here(self, task_id: str, poll_count: int) -> bool:
        """Whether every earlier delivery of the task id was this process's and has ended."""
        if poll_count <= 1:
            return True
        with self._lock:
            polls = self._tasks.get(task_id)
            return polls is not None and all(
                k in polls and not polls[k][0] for k in range(1, poll_count)
            )
