"""The updates one attempt sends Conductor: never two in flight, the final one read back.

Conductor applies an update as read-modify-write without a lock: an extension that read the
task before a COMPLETED landed writes IN_PROGRESS back over it, both answered 200, and the
finished attempt times out and runs again (seen on the real server; docs/model-check.md,
"serial-report"). So the extensions and the final report of a task are
serialized here, no extension starts once the final report has, and the final report is
re-sent until a fresh read of the task shows it, or shows that Conductor moved on.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

import structlog
from tenacity import RetryCallState, RetryError

from perago.core.orchestrator import TaskSnapshot
from perago.core.retry_policy import guarded_report, report_resends
from perago.errors import OrchestratorError
from perago.publish.group_commit import GroupMember
from perago.telemetry import metrics

__all__ = ["Landing", "TaskUpdates", "delivered_again", "landing", "under_lease"]

log = structlog.get_logger("perago.worker.report")

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


def delivered_again(now: TaskSnapshot | None, delivery: TaskSnapshot) -> bool:
    """Is the task, as read ``now``, running under another delivery of its id? Then a
    failure of ``delivery`` is not the task's: Conductor takes a FAILED from any worker, so
    reporting it would end the task under the live delivery and spend a retry."""
    return now is not None and now.status == "IN_PROGRESS" and now.poll_count != delivery.poll_count


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
        retrying = report_resends(lambda verdict: verdict is Landing.RESEND, sends=self._sends)
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


def under_lease(
    lease: GroupMember, send: Callable[[float], None], *, patience: float = 120.0
) -> Callable[[], None]:
    """``send(timeout)`` as a guarded write under the branch lease (renewed first when half
    its ttl is gone), retried on transient errors while the lease holds, for ``patience``
    seconds (a Conductor restart). LeaseLostError: another delivery took the branch, so this
    one must not report COMPLETED: the branch may contradict it (docs/model-check.md)."""

    def transient(e: BaseException) -> bool:
        """Unreachable or 5xx/429: ride out a restart while the lease holds."""
        return isinstance(e, OrchestratorError) and (
            not e.status or e.status >= 500 or e.status == 429
        )

    def logged(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "report_send_failed", error=getattr(error, "message", str(error)), retry_in=wait
        )

    def send_once() -> None:
        lease.refresh()  # renewed first when half its ttl is gone
        lease.guarded(send)

    def guarded_send() -> None:
        guarded_report(transient, patience=patience, before_sleep=logged)(send_once)

    return guarded_send
