"""The fan-out model's global state: lakeFS, the lease(s), Conductor and every attempt.

An attempt is identified by its slot, ``step * max_tasks + retry``: the task id of retry
``retry`` of that step (one delivery each: re-deliveries are the serial model's subject).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from model.fanout.config import FanoutConfig
from model.fanout.tree import ABSENT, NO_REF, ROOT, Commit, merge_slot
from model.state import (
    COMPLETED,
    DONE,
    ENDED,
    FAILED,
    IN_PROGRESS,
    LIVE_TASK,
    NONE,
    SCHEDULED,
    Lease,
    Task,
)

__all__ = [
    "COMPLETED",
    "DONE",
    "ENDED",
    "FAILED",
    "IN_PROGRESS",
    "LIVE_TASK",
    "NONE",
    "SCHEDULED",
    "TERMINAL",
    "Attempt",
    "Lease",
    "State",
    "Task",
    "attempt_name",
    "initial_states",
    "marker_paths",
    "ref_name",
    "step_of",
]


#: A report of FAILED_WITH_TERMINAL_ERROR: the task ends and Conductor schedules no retry.
TERMINAL = "FAILED_WITH_TERMINAL_ERROR"


class Attempt(NamedTuple):
    #: A pinned attempt starts at the poll (materialize, body and diff are private); an
    #: unpinned one first reads the head (``start``).
    pc: str = "fence1"
    empty: bool = False  # the diff is empty: the no-op path
    seen: int = NO_REF  # the head its publish fence (or no-op decision) saw
    source: int = NO_REF  # what it merges: its staged commit, or its scoped-replacement branch
    current: bool = True  # Conductor's current attempt when its last fence ran
    leased: bool = False
    status: str = ""
    ref: int = NO_REF
    #: Where its staging branch starts (pinned: r0).
    input_ref: int = ROOT
    #: Where it read its inputs: the pinned ref r0, or the head it started from (unpinned;
    #: r0 for a step that reads nothing).
    read_at: int = ROOT
    #: The grant it holds or shares: the slot of the attempt that acquired it.
    grant: int = NO_REF
    #: Its report window is open: it left the lease with COMPLETED to send (issue 41).
    window: bool = False


class State(NamedTuple):
    hook: bool
    pinned: bool  # every step's input names r0; else each attempt starts from the head
    commits: tuple[Commit | None, ...]
    head: int
    tags: int
    heads: int  # every commit that ever was the head
    leases: tuple[Lease, ...]
    tasks: tuple[Task, ...]  # by slot; NONE where the step has fewer retries
    foreign: int  # foreign commits left
    attempts: tuple[Attempt | None, ...]


def step_of(cfg: FanoutConfig, slot: int) -> tuple[int, int]:
    """(step number, retry count) of an attempt slot."""
    return divmod(slot, cfg.max_tasks)


def attempt_name(cfg: FanoutConfig, slot: int) -> str:
    step, retry = step_of(cfg, slot)
    return f"{cfg.steps[step]}{retry}"


def ref_name(cfg: FanoutConfig, ref: int) -> str:
    """``r0``, ``F``, ``S[A0]`` (staged), ``P[A1]`` (scoped branch), ``M[A0]`` (merge)."""
    if ref == ROOT:
        return "r0"
    if ref == 1:
        return "F"
    if ref == NO_REF:
        return "-"
    slot, kind = divmod(ref - 2, 3)
    return f"{'SPM'[kind]}[{attempt_name(cfg, slot)}]"


def marker_paths(cfg: FanoutConfig) -> tuple[str, ...]:
    """Every scope-marker path the steps touch: each scope and each proper ancestor."""
    paths: set[str] = set()
    for step in range(len(cfg.steps)):
        segments = cfg.scope(step).strip("/").split("/")
        for n in range(len(segments) + 1):
            paths.add("/".join(segments[:n]))
    return tuple(sorted(paths))


def initial_states(cfg: FanoutConfig) -> Iterator[State]:
    """The fork schedules every step's first task; the branch head is r0."""
    root = Commit((), "root", NO_REF, (ABSENT,) * len(marker_paths(cfg)), 0, 0, 1, 1)
    commits: tuple[Commit | None, ...] = (root,) + (None,) * merge_slot(cfg.slots - 1)
    tasks = tuple(
        Task(SCHEDULED if retry == 0 else NONE) if retry < cfg.tasks_of(step) else Task()
        for step in range(len(cfg.steps))
        for retry in range(cfg.max_tasks)
    )
    for hook in cfg.hooks:
        for pinned in cfg.pinned:
            yield State(
                hook=hook and cfg.has("hook"),
                pinned=pinned,
                commits=commits,
                head=ROOT,
                tags=0,
                heads=1 << ROOT,
                leases=(Lease(),) * cfg.lease_keys,
                tasks=tasks,
                foreign=0 if cfg.foreign == "off" else 1,
                attempts=(None,) * cfg.slots,
            )
