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
import time
from collections.abc import Callable

import structlog
from tenacity import RetryCallState, RetryError

from perago.core.orchestrator import TaskSnapshot
from perago.core.retry_policy import guarded_report, report_resends
from perago.errors import OrchestratorError, ReportWindowClosedError
from perago.publish import group_commit
from perago.telemetry import metrics

__all__ = [
    "REPORT_WINDOWS",
    "Landing",
    "TaskUpdates",
    "delivered_again",
    "in_report_windows",
    "landing",
    "within_window",
]

log = structlog.get_logger("perago.worker.report")

#: How often the final report is sent at most, when the read-back keeps disagreeing.
REPORT_SENDS = 5
#: Report windows a COMPLETED gets at most: the first, and each after taking the branch lease
#: again and re-running the attempt fence under it.
REPORT_WINDOWS = 3


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


def within_window(
    deadline: float, send: Callable[[float], None], *, clock: Callable[[], float] = time.monotonic
) -> Callable[[], None]:
    """``send(timeout)`` only before ``deadline`` (this process's monotonic clock), each try's
    timeout ending at it, tried again on transient errors (unreachable, 5xx, 429) until then.
    ReportWindowClosedError once it has passed: a re-delivery of this task id may be
    publishing by then, so this delivery must not report COMPLETED (docs/protocol.md,
    report windows)."""

    def transient(e: BaseException) -> bool:
        return isinstance(e, OrchestratorError) and (
            not e.status or e.status >= 500 or e.status == 429
        )

    def closed(last: str) -> ReportWindowClosedError:
        return ReportWindowClosedError(
            "the report window closed before Conductor took the COMPLETED report (a window "
            f"is {group_commit.REPORT_SEND_SECONDS:g} s from leaving the branch lease, none if "
            f"the lease was lost first; {last}): if Conductor is down or slow, check its health"
        )

    def send_once() -> None:
        left = deadline - clock()
        if left <= 0:
            raise closed("no try left")
        send(left)

    def logged(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "report_send_failed", error=getattr(error, "message", str(error)), retry_in=wait
        )

    def guarded_send() -> None:
        patience = max(0.0, deadline - clock())
        try:
            guarded_report(transient, patience=patience, before_sleep=logged)(send_once)
        except OrchestratorError as e:
            if transient(e):  # tried until the window closed
                raise closed(f"last error: {e.message}") from e
            raise

    return guarded_send


def in_report_windows(
    first: group_commit.GroupMember,
    send: Callable[[float], None],
    *,
    again: Callable[[group_commit.GroupMember], group_commit.GroupMember | None],
    leave: Callable[[group_commit.GroupMember], None],
    before_send: Callable[[], None] = lambda: None,
    windows: int = REPORT_WINDOWS,
) -> Callable[[], None]:
    """A COMPLETED sent inside report windows (docs/protocol.md): leave the grant (``leave``),
    then ``send`` inside the window that opens (:func:`within_window`). If the window closes
    first, ``again(member)`` takes the branch lease again and re-runs the attempt fence under
    it (ReportWindowClosedError if it cannot; None if Conductor shows the report landed
    after all), and the report goes inside a new window: ``windows`` in all, so that a
    Conductor slower than one window costs a lease round trip, not the step's retry."""

    def windowed() -> None:
        member = first
        for n in range(1, windows + 1):
            try:
                deadline = member.open_report_window()
            finally:
                leave(member)
            if n == 1:
                before_send()
            try:
                within_window(deadline, send)()
                return
            except ReportWindowClosedError as e:
                if n == windows:
                    raise
                log.warning("report_window_closed", window=n, windows=windows, error=e.message)
                taken = again(member)
                if taken is None:
                    return
                member = taken

    return windowed
