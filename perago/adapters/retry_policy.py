"""The one retry policy of the calls that are safe to repeat, as tenacity objects, and its
deliberate deviations, each named here.

Blocking calls (lakeFS metadata, Conductor) take it as a decorator; libcurl's batch loop
cannot block in a call, so it asks :class:`Backoff` the same questions per transfer.
Deviations: a task body's tries inside its attempt (:func:`body_retry_wait`), the final
report's re-sends until its read-back shows it (:func:`report_resends`), and a report sent
under the branch lease (:func:`guarded_report`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from tenacity import (
    RetryCallState,
    Retrying,
    retry,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)
from tenacity.stop import stop_base

__all__ = [
    "RETRY_FOR_S",
    "Backoff",
    "body_retry_wait",
    "guarded_report",
    "report_resends",
    "retrying",
]

F = TypeVar("F", bound=Callable[..., Any])

#: How long a call keeps being tried after its first try (a server restart fits in it).
RETRY_FOR_S = 60.0
WAIT = wait_exponential(multiplier=0.2, max=5)


def retrying(
    is_transient: Callable[[BaseException], bool], *, retry_for: float = RETRY_FOR_S
) -> Callable[[F], F]:
    """A decorator repeating a call while it fails with what ``is_transient`` accepts."""
    return cast(
        Callable[[F], F],
        retry(
            retry=retry_if_exception(is_transient),
            stop=stop_after_delay(retry_for),
            wait=WAIT,
            reraise=True,
        ),
    )


class Backoff:
    """The policy for one transfer of a loop: after each transient failure, how long to
    wait before the next try, or None when the tries ran out."""

    def __init__(self, *, retry_for: float = RETRY_FOR_S) -> None:
        self._stop: stop_base = stop_after_delay(retry_for)
        self._state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]

    def next_wait(self, error: BaseException) -> float | None:
        state = self._state
        state.set_exception((type(error), error, None))
        if self._stop(state):
            return None
        wait = float(WAIT(state))
        state.prepare_for_next_attempt()
        return wait


def body_retry_wait(first: float, failed: int) -> float:
    """Seconds before a task body's next try inside its attempt, after ``failed`` tries:
    the task's ``retry_delay``, doubling, at most 5 minutes. A deliberate deviation from
    :data:`WAIT`: the author chose the first delay, as for Conductor's retries."""
    wait = wait_exponential(multiplier=first, min=first, max=max(first, 300.0))
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = failed
    return float(wait(state))


def report_resends(resend: Callable[[Any], bool], *, sends: int) -> Retrying:
    """The final report, sent again while its read-back says ``resend`` (Conductor wrote an
    extension back over it), at most ``sends`` times. A deviation from :data:`WAIT`: the
    count, not a time, bounds it (each send is answered), and waits stop growing at 2 s."""
    return Retrying(
        retry=retry_if_result(resend),
        stop=stop_after_attempt(sends),
        wait=wait_exponential(multiplier=0.2, max=2),
    )


def guarded_report(
    is_transient: Callable[[BaseException], bool],
    *,
    patience: float,
    before_sleep: Callable[[RetryCallState], None],
) -> Retrying:
    """A report sent under the branch lease, tried again on ``is_transient`` errors for
    ``patience`` seconds (a Conductor restart). A deviation from :data:`WAIT`: the first
    wait is 0.25 s, since siblings wait for the lease this report holds."""
    return Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_delay(patience),
        wait=wait_exponential(multiplier=0.25, max=5),
        before_sleep=before_sleep,
        reraise=True,
    )
