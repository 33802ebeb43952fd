"""The one retry policy of the calls that are safe to repeat, as tenacity objects, and its
deliberate deviations, each named here.

Blocking calls (lakeFS metadata, Conductor) take it as a decorator; libcurl's batch loop
cannot block in a call, so it asks :class:`Backoff` the same questions per transfer.
Deviations, each for a reason given where it is defined:

- a task body's tries inside its attempt (:func:`body_retry_wait`);
- the final report's re-sends until its read-back shows it (:func:`report_resends`);
- a COMPLETED report sent inside its report window (:func:`guarded_report`);
- a read of the coordination store (:func:`coordination_reads`);
- the worker's polls after Conductor failed to answer (:func:`poll_backoff`);
- a merge lakeFS throttled, tried again under the branch lease (:data:`MERGE_TRIES`,
  :func:`merge_throttle_wait`; the publisher fences again between tries);
- a put-and-verify write that found other writers busy (:func:`contention_wait`).

Loops elsewhere that look like retries are not: a lease waits for its holder to go silent
(``coord/lease.py``), a coordination key is re-listed when it changed while being read
(``coord/generations.py``), and the publisher's merge loop re-runs the publish fence.
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
    wait_random_exponential,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

__all__ = [
    "MERGE_TRIES",
    "RETRY_FOR_S",
    "Backoff",
    "body_retry_wait",
    "contention_wait",
    "coordination_reads",
    "guarded_report",
    "merge_throttle_wait",
    "poll_backoff",
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


def _wait_after(wait: wait_base, failed: int) -> float:
    """What ``wait`` answers after ``failed`` tries (for loops that cannot be a Retrying)."""
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = failed
    return float(wait(state))


def body_retry_wait(first: float, failed: int) -> float:
    """Seconds before a task body's next try inside its attempt, after ``failed`` tries:
    the task's ``retry_delay``, doubling, at most 5 minutes. A deliberate deviation from
    :data:`WAIT`: the author chose the first delay, as for Conductor's retries."""
    return _wait_after(wait_exponential(multiplier=first, min=first, max=max(first, 300.0)), failed)


def poll_backoff(failures: int) -> float:
    """Seconds a worker waits before polling again after ``failures`` polls in a row found
    Conductor unreachable: 1 s, doubling, at most 30 s. A deviation from :data:`WAIT`: a poll
    is never given up (the worker outlives a Conductor restart), and a long-poll is already
    a wait."""
    return _wait_after(wait_exponential(multiplier=0.5, max=30), failures + 1)


#: Merges tried when the expected-head hook refuses because fan-out siblings moved the head,
#: or lakeFS answers 429 (its own branch-update retries ran out under contention).
MERGE_TRIES = 4
#: The first wait after a 429, doubled for each further one (0.25, 0.5, 1 s).
MERGE_THROTTLE_FIRST_S = 0.25


def merge_throttle_wait(tries: int) -> float:
    """Seconds before merging again after lakeFS throttled ``tries`` merges. A deviation
    from :data:`WAIT`: the publisher holds the branch lease meanwhile, so the waits are
    short and the tries few (:data:`MERGE_TRIES`)."""
    return _wait_after(wait_exponential(multiplier=MERGE_THROTTLE_FIRST_S), tries)


def coordination_reads(is_transient: Callable[[BaseException], bool]) -> Retrying:
    """A read of the coordination store (S3, DynamoDB), tried 4 times 0.1, 0.2, 0.4 s apart.
    A deviation from :data:`WAIT`: a lease's holder and its waiters are behind the read, and
    a longer outage is the lease's own timeout to ride out, not the read's."""
    return Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(4),
        wait=wait_exponential(multiplier=0.1),
        reraise=True,
    )


def contention_wait(attempt: int, *, first: float, cap: float) -> float:
    """Seconds before a put-and-verify write tries again after ``attempt`` (from 0) found
    other writers busy: full jitter, uniform up to ``first`` doubling to ``cap``. A deviation
    from :data:`WAIT`: the jitter spreads writers racing for the same key
    (reference: put-and-verify exclusive writes on object storage)."""
    return _wait_after(wait_random_exponential(multiplier=first, max=cap), attempt + 1)


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
    """A COMPLETED report sent inside its report window, tried again on ``is_transient``
    errors for ``patience`` seconds (the rest of the window). A deviation from :data:`WAIT`:
    the first wait is 0.25 s, since the window is short."""
    return Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_delay(patience),
        wait=wait_exponential(multiplier=0.25, max=5),
        before_sleep=before_sleep,
        reraise=True,
    )
