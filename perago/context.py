"""Which attempt is running, for task bodies that want to log or name things by it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from perago.errors import NoAttemptError

__all__ = ["AttemptInfo", "attempt_context", "info"]


@dataclass(frozen=True)
class AttemptInfo:
    workflow_id: str
    task_id: str
    task_type: str
    reference_name: str
    retry_count: int
    poll_count: int
    repository: str
    branch: str
    input_ref: str


_current: ContextVar[AttemptInfo | None] = ContextVar("perago_attempt", default=None)


@contextmanager
def attempt_context(current: AttemptInfo) -> Iterator[AttemptInfo]:
    """Make ``current`` what :func:`info` returns in this context (the runner, and
    ``perago.testing.TaskEnvironment`` for tests of task functions)."""
    token = _current.set(current)
    try:
        yield current
    finally:
        _current.reset(token)


def info() -> AttemptInfo:
    """The running attempt; :class:`~perago.errors.NoAttemptError` (a ``LookupError``)
    outside one."""
    current = _current.get()
    if current is None:
        raise NoAttemptError(
            "perago.info() is only available while Perago runs the task: to call a task "
            "function in a test, use perago.testing.run_task(task, tmp_path, params) (or "
            "TaskEnvironment), which sets it"
        )
    return current
