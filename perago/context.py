"""Which attempt is running, for task bodies that want to log or name things by it."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["AttemptInfo", "info"]


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


def info() -> AttemptInfo:
    """The running attempt; raises LookupError outside a Perago attempt."""
    current = _current.get()
    if current is None:
        raise LookupError("perago.context.info() is only available inside a running task")
    return current
