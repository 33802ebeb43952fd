"""The one retry policy of the adapters' calls that are safe to repeat, as tenacity objects.

Blocking calls (lakeFS metadata, Conductor) take it as a decorator; libcurl's batch loop
cannot block in a call, so it asks :class:`Backoff` the same questions per transfer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from tenacity import (
    RetryCallState,
    retry,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)
from tenacity.stop import stop_base

__all__ = ["RETRY_FOR_S", "Backoff", "body_retry_wait", "retrying"]

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
