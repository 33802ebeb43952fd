"""The updates one attempt sends Conductor: never two in flight, the final one read back.

Conductor applies an update as read-modify-write without a lock: an extension that read the
task before a COMPLETED landed writes IN_PROGRESS back over it, both answered 200, and the
finished attempt times out and runs again (issue 14, confirmed on the real server by
``tests/integration/test_report.py``). So the extensions and the final report of a task are
serialized here, no extension starts once the final report has, and the final report is
re-sent until a fresh read of the task shows it, or shows that Conductor moved on.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

import structlog
from tenacity import RetryError, Retrying, retry_if_result, stop_after_attempt, wait_exponential

from perago import metrics
from perago.orchestrator import TaskSnapshot

__all__ = ["Landing", "TaskUpdates", "landing"]

log = structlog.get_logger("perago.report")

#: How often the final report is sent at most, when the read-back keeps disagreeing.
REPORT_SENDS = 5


class Landing(enum.Enum):
    LANDED = "landed"  # Conductor shows the reported status
    SUPERSEDED = "superseded"  # the task ended otherwise, or another delivery owns it
    GONE = "gone"  # Conductor no longer knows the task (workflow removed)
    RESEND = "resend"  # still this delivery's and not ended: the report was overwritten


def landing(reported: str, now: TaskSnapshot | None, delivery: TaskSnapshot) -> Landing:
    """Did the final report of ``delivery`` land, judging from a fresh read ``now``?"""
    if now is None:
        return Landing.GONE
    if now.status == reported:
        return Landing.LANDED
    if now.terminal or now.poll_count != delivery.poll_count:
        return Landing.SUPERSEDED
    return Landing.RESEND


class TaskUpdates:
    """The updates of one delivered task: extensions, then exactly one final report."""

    def __init__(
        self,
        delivery: TaskSnapshot,
        *,
        extend: Callable[[], None],
        read: Callable[[], TaskSnapshot | None],
        sends: int = REPORT_SENDS,
    ) -> None:
        self._delivery = delivery
        self._extend = extend
        self._read = read
        self._sends = sends
        self._lock = threading.Lock()
        self._final = False

    def extend(self) -> bool:
        """Send one extension unless the final report has started (then False, and nothing)."""
        with self._lock:
            if self._final:
                return False
            self._extend()
            return True

    def report(self, status: str, send: Callable[[], None]) -> Landing:
        """``send`` the final report, after any extension in flight, until it shows or is moot.

        Errors of the send or the read propagate (the caller logs them); the verdict of the
        last read-back is returned otherwise.
        """
        with self._lock:  # waits for an extension in flight, and stops the next one
            self._final = True
        d = self._delivery
        retrying = Retrying(
            retry=retry_if_result(lambda verdict: verdict is Landing.RESEND),
            stop=stop_after_attempt(self._sends),
            wait=wait_exponential(multiplier=0.2, max=2),
        )
        sent = 0

        def send_and_read() -> Landing:
            nonlocal sent
            if sent:
                metrics.REPORT_RESENDS.inc()
                log.warning(
                    "report_resent",
                    workflow_id=d.workflow_id,
                    task_id=d.task_id,
                    retry_count=d.retry_count,
                    status=status,
                    sends=sent + 1,
                )
            send()
            sent += 1
            return landing(status, self._read(), d)

        try:
            return retrying(send_and_read)
        except RetryError:
            return Landing.RESEND
