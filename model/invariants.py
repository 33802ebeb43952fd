"""The properties checked in every reachable state (and on every step that moves the branch).

I1  at most one publication of the step per input ref on the branch's first-parent history
    (``once_per_step``: at most one at all, whatever its input ref);
I2a only an attempt that was Conductor's current one at its last attempt fence moves the
    branch (merge or reset);
I2b with a lease backend, an attempt moves the branch only while it holds the lease;
I3a a foreign commit, once on the branch, stays in the branch's history (never replaced);
I3b no commit that ever was on the branch becomes unreachable from the branch or a tag;
I4  from the moment Conductor records the step COMPLETED with output ref o from input ref i,
    in every later state: o is on the first-parent history, and the only publication of the
    step from i on it is o (none for a no-op): the branch says what Conductor says;
I5  fail closed: a COMPLETED output is exactly the input plus this step's change: o == i
    (no-op), or a publication of the step whose first parent is i;
I6  a task Conductor recorded COMPLETED stays COMPLETED (an overlapping extension must not
    undo it, or the finished attempt times out and its step runs again: issue 14).
A foreign commit on top of o after completion is fine: I4 asks for o in the history, not
at the head. Deadlock (no enabled action, yet something is not terminal) is checked by the
explorer.
"""

from __future__ import annotations

from model.config import Config
from model.state import COMPLETED, State, attempt_name, ref_name
from model.store import FOREIGN, NO_REF, first_parent_history, reachable
from model.worker import Transition

__all__ = ["INVARIANTS", "check_state", "check_transition"]

INVARIANTS = {
    "I1": "at most one publication per step and input ref on the first-parent history",
    "I2a": "only an attempt current in Conductor at its last fence moves the branch",
    "I2b": "an attempt moves the branch only while it holds the branch lease",
    "I3a": "a foreign commit is never removed from the branch's history",
    "I3b": "nothing that was on the branch becomes unreachable (branch or tag)",
    "I4": "a COMPLETED step's output is on the branch, and no other publication of it",
    "I5": "fail closed: a COMPLETED output is the input ref plus exactly this step's change",
    "I6": "a COMPLETED that Conductor accepted stays: the finished attempt never re-runs",
}


def _publications(s: State) -> list[tuple[int, int]]:
    """(commit, input ref) of every publication of the step on the first-parent history."""
    out = []
    for ref in first_parent_history(s.commits, s.head):
        commit = s.commits[ref]
        assert commit is not None
        if commit.kind in ("staged", "merge"):
            out.append((ref, commit.input_ref))
    return out


def check_state(cfg: Config, s: State) -> tuple[str, str] | None:
    """(invariant, explanation) of the first violated invariant, or None."""
    pubs = _publications(s)
    inputs = [i for _, i in pubs]
    if cfg.once_per_step and len(pubs) > 1:
        names = ", ".join(ref_name(cfg, p) for p, _ in pubs)
        return "I1", f"{names}: two publications of the step on the first-parent history"
    for i in set(inputs):
        if inputs.count(i) > 1:
            names = ", ".join(ref_name(cfg, p) for p, pi in pubs if pi == i)
            return "I1", f"{names}: two publications from input ref {ref_name(cfg, i)}"
    head = s.commits[s.head]
    assert head is not None
    if s.commits[FOREIGN] is not None and not head.ancestors >> FOREIGN & 1:
        return "I3a", "the foreign commit F is no longer in the history of the branch"
    lost = s.heads & ~reachable(s.commits, 1 << s.head | s.tags)
    if lost:
        names = ", ".join(ref_name(cfg, r) for r in range(len(s.commits)) if lost >> r & 1)
        return "I3b", f"{names} was on the branch and is now unreachable (no branch, no tag)"
    for t, task in enumerate(s.tasks):
        if task.status != COMPLETED:
            continue
        o, i = task.output, task.input_ref
        what = f"t{t} COMPLETED with output {ref_name(cfg, o)} from {ref_name(cfg, i)}"
        if not head.first_parents >> o & 1:
            return "I4", f"{what}, which is not on the branch's first-parent history"
        others = [p for p, pi in pubs if pi == i and p != o]
        if others:
            names = ", ".join(ref_name(cfg, p) for p in others)
            return "I4", f"{what}, but the branch also carries its publication {names}"
        out = s.commits[o]
        assert out is not None
        if o != i and not (out.kind in ("staged", "merge") and out.parents[0] == i):
            first = ref_name(cfg, out.parents[0]) if out.parents else "-"
            return "I5", f"{what}, but the output's first parent is {first}, not the input"
    return None


def check_transition(cfg: Config, before: State, tr: Transition) -> tuple[str, str] | None:
    """I6 on every step; I2a and I2b on a step of an attempt that moved the branch (a merge
    that landed, a reset)."""
    actor, _, after, moved = tr
    for t, (was, now) in enumerate(zip(before.tasks, after.tasks, strict=True)):
        if was.status == COMPLETED and now.status != COMPLETED:
            return "I6", f"t{t} was COMPLETED and is {now.status} again: its completion is lost"
    if not moved:
        return None
    a = before.attempts[actor]
    assert a is not None
    who = attempt_name(cfg, actor)
    if not a.current:
        return "I2a", f"{who} moved the branch though it was not current at its fence"
    if cfg.leases and before.lease.holder != actor:
        holder = before.lease.holder
        by = "nobody" if holder == NO_REF else attempt_name(cfg, holder)
        return "I2b", f"{who} moved the branch without holding the lease (held by {by})"
    return None
