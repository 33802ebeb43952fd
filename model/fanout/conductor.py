"""Conductor for the fork: each step's task ids, polls, response timeouts and updates, as in
the serial model (``model.conductor``): an update is effective iff the task is not
terminal; FAILED and TIMED_OUT schedule the step's next retry, FAILED_WITH_TERMINAL_ERROR
does not."""

from __future__ import annotations

from model.fanout.config import FanoutConfig
from model.fanout.state import (
    COMPLETED,
    ENDED,
    IN_PROGRESS,
    LIVE_TASK,
    SCHEDULED,
    TERMINAL,
    Attempt,
    State,
    Task,
    step_of,
)

__all__ = ["poll", "report", "timeout"]


def _with(s: State, slot: int, t: Task) -> tuple[Task, ...]:
    return (*s.tasks[:slot], t, *s.tasks[slot + 1 :])


def _retry(cfg: FanoutConfig, tasks: tuple[Task, ...], slot: int) -> tuple[Task, ...]:
    step, retry = step_of(cfg, slot)
    if retry + 1 < cfg.tasks_of(step):
        return (*tasks[: slot + 1], Task(SCHEDULED), *tasks[slot + 2 :])
    return tasks


def poll(cfg: FanoutConfig, s: State, slot: int, attempt: Attempt) -> State | None:
    """A worker polls the SCHEDULED task and starts ``attempt`` (materialize, body, diff: the
    attempt's private work, folded into the poll)."""
    t = s.tasks[slot]
    if t.status != SCHEDULED:
        return None
    attempts = (*s.attempts[:slot], attempt, *s.attempts[slot + 1 :])
    tasks = _with(s, slot, t._replace(status=IN_PROGRESS, poll=1))
    return s._replace(tasks=tasks, attempts=attempts)


def timeout(cfg: FanoutConfig, s: State, slot: int) -> State | None:
    t = s.tasks[slot]
    if t.status != IN_PROGRESS:
        return None
    return s._replace(tasks=_retry(cfg, _with(s, slot, t._replace(status=ENDED)), slot))


def report(
    cfg: FanoutConfig, s: State, slot: int, status: str, ref: int, input_ref: int
) -> tuple[State, bool]:
    t = s.tasks[slot]
    if t.status not in LIVE_TASK:
        return s, False
    if status == COMPLETED:
        done = t._replace(status=COMPLETED, output=ref, input_ref=input_ref)
        return s._replace(tasks=_with(s, slot, done)), True
    tasks = _with(s, slot, t._replace(status=ENDED))
    return s._replace(tasks=tasks if status == TERMINAL else _retry(cfg, tasks, slot)), True
