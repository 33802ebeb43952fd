"""The global state: lakeFS, the branch lease, Conductor and every attempt's local variables.

States are nested NamedTuples of ints, bools and short interned strings: hashable, compared
by value, and cheap to copy with ``_replace`` (unchanged parts are shared, not copied).
An attempt is identified by its slot, ``task * polls + (poll - 1)``: task id ``t<task>``
with retry count ``task``, delivered for the ``poll``-th time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from model.config import Config
from model.store import NO_REF, ROOT, Commit, commit_name, merge_slot

__all__ = [
    "COMPLETED",
    "DONE",
    "ENDED",
    "FAILED",
    "LIVE_TASK",
    "Attempt",
    "Lease",
    "State",
    "Task",
    "attempt_name",
    "initial_states",
    "ref_name",
    "slot_of",
    "task_of",
]

#: Conductor task statuses; NONE: the retry does not exist (yet). FAILED and TIMED_OUT are
#: one value, ENDED: nothing tells them apart (terminal, not COMPLETED, retry scheduled), so
#: equal futures share one state. Attempts report FAILED (or COMPLETED).
NONE, SCHEDULED, IN_PROGRESS = "NONE", "SCHEDULED", "IN_PROGRESS"
COMPLETED, ENDED, FAILED = "COMPLETED", "FAILED/TIMED_OUT", "FAILED"
LIVE_TASK = (SCHEDULED, IN_PROGRESS)

#: An attempt that reported or died takes no further step; its lease, if it held one, stays
#: in ``State.lease`` until it expires.
DONE = ("done",)


class Task(NamedTuple):
    """One Conductor task id (one retry of the step) as Conductor stores it."""

    status: str = NONE
    poll: int = 0  # pollCount: deliveries so far
    output: int = NO_REF  # output ref of a COMPLETED task
    input_ref: int = NO_REF  # input ref the completing attempt worked from


class Lease(NamedTuple):
    """The target branch's lease record, abstracted to who holds the newest grant.

    ``expired``: the holder's own clock says the grant is over, so a taker may take it over
    and the holder may not start a guarded write until it renews. Fencing tokens are not
    kept: lakeFS never checks them and an attempt acquires at most once, so the holder's
    slot identifies the grant.
    """

    holder: int = NO_REF
    expired: bool = False
    #: Group commit (the fan-out model's ``--group``): the attempts sharing the grant, and
    #: the member whose turn it is from reading the head to the merge or reset.
    members: int = 0
    turn: int = NO_REF
    #: The head the last member's merge made, handed to the next member's turn, and the
    #: first parent that member believes it has (the head its fence saw).
    handed: int = NO_REF
    handed_parent: int = NO_REF


class Attempt(NamedTuple):
    """Local variables of one attempt (one delivery of one task id to one worker)."""

    pc: str = "polled"
    input_ref: int = NO_REF
    empty: bool = False  # the diff is empty: the no-op path
    seen: int = NO_REF  # the head the publish fence (or no-op decision) saw
    current: bool = True  # it was Conductor's current attempt when its last fence ran
    leased: bool = False  # it acquired the branch lease (released or lost since, maybe)
    status: str = ""  # what it will report: COMPLETED or FAILED
    ref: int = NO_REF  # the output ref it will report
    #: Its first report window closed: it took the lease again for a second one (issue 41).
    again: bool = False
    #: Its last attempt fence passed less than FENCE_FRESH_SECONDS ago: a report window may
    #: open (a clock step makes it stale at any moment; modelled with re-deliveries only).
    fresh: bool = False


class State(NamedTuple):
    hook: bool  # the expected-head pre-merge hook is in the target's history
    pinned: bool  # the workspace input names its ref; else the attempt reads the head
    diff: int  # same_diff runs: -1 not chosen yet, 0 non-empty, 1 empty; else -1
    commits: tuple[Commit | None, ...]
    head: int
    tags: int  # bitmask of tagged commits
    heads: int  # bitmask of every commit that ever was the head (for "nothing unreachable")
    lease: Lease
    tasks: tuple[Task, ...]
    redeliveries: int  # left
    extensions: int  # overlapping response-timeout extensions left
    #: The attempt whose extension read its task IN_PROGRESS and has not written it back yet.
    extending: int
    foreign: int  # foreign commits left
    attempts: tuple[Attempt | None, ...]
    #: Report windows (issue 41): attempts whose window is open (a bit per slot).
    windows: int = 0


def slot_of(cfg: Config, task: int, poll: int) -> int:
    return task * cfg.polls + poll - 1


def task_of(cfg: Config, slot: int) -> tuple[int, int]:
    """(task index = retry count, poll count) of an attempt slot."""
    return slot // cfg.polls, slot % cfg.polls + 1


def attempt_name(cfg: Config, slot: int) -> str:
    task, poll = task_of(cfg, slot)
    return f"t{task}" if cfg.polls == 1 else f"t{task}p{poll}"


def ref_name(cfg: Config, ref: int) -> str:
    if ref < 2:
        return commit_name(ref, "")
    slot = (ref - 2) // 2
    return commit_name(ref, attempt_name(cfg, slot))


def initial_states(cfg: Config) -> Iterator[State]:
    """The step's first task is scheduled; the branch head is the input ref r0."""
    empty: tuple[Commit | None, ...] = (None,) * (merge_slot(cfg.slots - 1) + 1)
    root = Commit((), "root", NO_REF, NO_REF, NO_REF, 1 << ROOT, 1 << ROOT)
    commits = (root, *empty[1:])
    tasks = (Task(SCHEDULED),) + (Task(),) * (cfg.tasks - 1)
    diffs = (0, 1) if cfg.same_diff and cfg.noop else (0,) if cfg.same_diff else (-1,)
    for hook in cfg.hooks:
        for pinned in cfg.pinned:
            for diff in diffs:
                yield State(
                    hook=hook and cfg.has("hook"),
                    pinned=pinned,
                    diff=diff,
                    commits=commits,
                    head=ROOT,
                    tags=0,
                    heads=1 << ROOT,
                    lease=Lease(),
                    tasks=tasks,
                    redeliveries=cfg.redeliveries,
                    extensions=cfg.extensions,
                    extending=NO_REF,
                    foreign=0 if cfg.foreign == "off" else 1,
                    attempts=(None,) * cfg.slots,
                )
