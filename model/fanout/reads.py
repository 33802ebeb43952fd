"""Named read-only inputs (issue 25): what a step reads of the target branch, and the read-set
check of serializable isolation.

A step reads a folder at the commit its attempt read its inputs at (``Attempt.read_at``: the
pinned ref, or the head an unpinned attempt started from). A folder's content in a tree is
its data files: one per attempt of a step whose scope overlaps the folder. The foreign
writer's file lies outside every read folder: a foreign commit after the input ref is
refused by the publish fence anyway, and one landing between fence and merge is the
expected-head hook's case, reads or not (without the hook nothing can stop it: lakeFS has
no compare-and-swap).
"""

from __future__ import annotations

from model.fanout.config import FanoutConfig, overlaps
from model.fanout.state import State
from model.fanout.tree import first_parent_history

__all__ = ["changed_read", "content"]


def _slots(cfg: FanoutConfig, folder: str) -> int:
    """Bitmask of the attempt slots whose data file lies under ``folder``."""
    mask = 0
    for step in range(len(cfg.steps)):
        if overlaps(cfg.scope(step), folder):
            for retry in range(cfg.tasks_of(step)):
                mask |= 1 << step * cfg.max_tasks + retry
    return mask


def content(cfg: FanoutConfig, s: State, ref: int, folder: str) -> int:
    """What commit ``ref`` holds under ``folder`` (its data files there, as a bitmask)."""
    commit = s.commits[ref]
    assert commit is not None
    return commit.data & _slots(cfg, folder)


def changed_read(
    cfg: FanoutConfig, s: State, step: int, read_at: int, head: int
) -> tuple[str, int] | None:
    """The first folder step number ``step`` reads whose content differs between ``read_at``
    and ``head``, with the newest commit of the head's first-parent history that changed it
    (what the code's PublishFenceError names); None when every folder is unchanged."""
    for folder in cfg.reads_of(step):
        if content(cfg, s, read_at, folder) == content(cfg, s, head, folder):
            continue
        for ref in first_parent_history(s.commits, head):
            commit = s.commits[ref]
            assert commit is not None
            if commit.parents and content(cfg, s, ref, folder) != content(
                cfg, s, commit.parents[0], folder
            ):
                return folder, ref
        return folder, head
    return None
