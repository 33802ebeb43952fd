"""Conductor as the attempts see it: task ids, deliveries, timeouts, retries, updates.

Follows the server's behaviour (as the integration tests see the real server): a response
timeout makes an IN_PROGRESS task TIMED_OUT and schedules the retry (new task id, retry
count + 1) whether or not its worker is still alive; an update is effective iff the task id
is not terminal (the server checks neither worker id nor poll count, so with re-deliveries
a stale delivery's report of a live task id counts); FAILED schedules the retry too.
"""

from __future__ import annotations

from model.config import Config
from model.state import (
    COMPLETED,
    ENDED,
    IN_PROGRESS,
    LIVE_TASK,
    SCHEDULED,
    Attempt,
    State,
    Task,
    slot_of,
    task_of,
)
from model.store import NO_REF

__all__ = [
    "extension_lands",
    "extension_reads",
    "is_current",
    "poll",
    "redeliver",
    "report",
    "timeout",
]


def is_current(cfg: Config, s: State, slot: int) -> bool:
    """The attempt fence's question: IN_PROGRESS, and this very delivery (poll count)."""
    task, poll_count = task_of(cfg, slot)
    t = s.tasks[task]
    return t.status == IN_PROGRESS and t.poll == poll_count


def _set(s: State, task: int, t: Task) -> tuple[Task, ...]:
    return (*s.tasks[:task], t, *s.tasks[task + 1 :])


def _deliver(cfg: Config, s: State, task: int, tasks: tuple[Task, ...]) -> State:
    t = tasks[task]
    t = t._replace(status=IN_PROGRESS, poll=t.poll + 1)
    slot = slot_of(cfg, task, t.poll)
    attempts = (*s.attempts[:slot], Attempt(), *s.attempts[slot + 1 :])
    return s._replace(tasks=_set(s, task, t), attempts=attempts)


def poll(cfg: Config, s: State, task: int) -> State | None:
    """A worker polls the SCHEDULED task: a new attempt starts."""
    if s.tasks[task].status != SCHEDULED:
        return None
    return _deliver(cfg, s, task, s.tasks)


def redeliver(cfg: Config, s: State, task: int) -> State | None:
    """The IN_PROGRESS task id is handed to another worker (requeue or lost ack)."""
    t = s.tasks[task]
    if s.redeliveries == 0 or t.status != IN_PROGRESS or t.poll >= cfg.polls:
        return None
    return _deliver(cfg, s, task, s.tasks)._replace(redeliveries=s.redeliveries - 1)


def _retry(cfg: Config, tasks: tuple[Task, ...], task: int) -> tuple[Task, ...]:
    if task + 1 < cfg.tasks:
        return (*tasks[: task + 1], Task(SCHEDULED), *tasks[task + 2 :])
    return tasks


def timeout(cfg: Config, s: State, task: int) -> State | None:
    """Response timeout: TIMED_OUT and the retry is scheduled (the worker may live on)."""
    t = s.tasks[task]
    if t.status != IN_PROGRESS:
        return None
    return s._replace(tasks=_retry(cfg, _set(s, task, t._replace(status=ENDED)), task))


def report(cfg: Config, s: State, slot: int, a: Attempt) -> tuple[State, bool]:
    """The attempt's update; (new state, whether Conductor took it as effective)."""
    task, _ = task_of(cfg, slot)
    t = s.tasks[task]
    if t.status not in LIVE_TASK:
        return s, False
    if a.status == COMPLETED:
        done = t._replace(status=COMPLETED, output=a.ref, input_ref=a.input_ref)
        return s._replace(tasks=_set(s, task, done)), True
    failed = _set(s, task, t._replace(status=ENDED))
    return s._replace(tasks=_retry(cfg, failed, task)), True


def extension_reads(cfg: Config, s: State, slot: int) -> State | None:
    """An extension (``extendLease``) of the attempt's task: the server reads the task."""
    task, _ = task_of(cfg, slot)
    if s.extensions == 0 or s.extending != NO_REF or s.tasks[task].status != IN_PROGRESS:
        return None
    return s._replace(extensions=s.extensions - 1, extending=slot)


def extension_lands(cfg: Config, s: State) -> State | None:
    """The extension's write: the task as it was read (IN_PROGRESS, fresh update time).

    An update accepted in between is undone: a COMPLETED goes back to IN_PROGRESS, its output
    forgotten, and the task will time out (issue 14, ``test_report.py`` on the real server).
    A task that ended otherwise in between is left alone (not modelled: a timed-out task
    revived next to its retry).
    """
    if s.extending == NO_REF:
        return None
    task, _ = task_of(cfg, s.extending)
    t = s.tasks[task]
    if t.status == COMPLETED:
        t = Task(IN_PROGRESS, poll=t.poll)
    return s._replace(tasks=_set(s, task, t), extending=NO_REF)
