"""The fan-out invariants, checked in every reachable state (and on every branch move).

F1  at most one publication per step in effect: the head's tree holds the data of at most
    one attempt of each step, and on the first-parent history at most one publication of
    the step is not superseded (named by a later scoped replacement);
F2  no COMPLETED step's publication is ever lost from the head: the head holds exactly what
    the completing attempt's output holds of that step (its own data, or none for a no-op),
    and the output is on the first-parent history;
F3  no lost update inside a scope: the head never holds the data of two steps whose scopes
    overlap (both published from the one input ref, neither saw the other);
F4  a foreign commit is never replaced: once on the branch it stays on the first-parent
    history and its data stays in the head;
F5  every commit that was ever the head stays reachable (branch or tag);
F6  fail closed: a COMPLETED output holds of its step only the completing attempt's data
    (or none) and no foreign data its input ref did not hold: it never published over a
    foreign commit;
R1  serializable reads: a step with serializable inputs publishes (its merge lands, its
    hard reset moves the branch, or its no-op completes) only where every folder it read
    holds what it held at the commit it was read at: at the merge's first parent, at the
    commit reset to, at the head of the no-op decision (checked on the step);
R2  a retryable refusal can be retried: when an unpinned serializable attempt fails at a
    read-set check point over a changed folder, a retry starting on that head would read
    the folder as the head holds it (else every retry is refused again: F7; on the step);
I2a only an attempt current in Conductor at its last fence moves the branch;
I2b an attempt moves the branch only while it holds the lease it takes.
"""

from __future__ import annotations

from model.fanout import reads
from model.fanout.config import FanoutConfig, overlaps
from model.fanout.state import COMPLETED, FAILED, State, attempt_name, ref_name, step_of
from model.fanout.tree import FOREIGN, FOREIGN_DATA, NO_REF, ROOT, first_parent_history, reachable
from model.fanout.worker import READ_SET_PCS, Transition, start_refs

__all__ = ["INVARIANTS", "check_state", "check_transition"]

INVARIANTS = {
    "F1": "at most one publication per step in effect (head data, first-parent history)",
    "F2": "a COMPLETED step's publication is never lost from the head",
    "F3": "no lost update inside a scope: never two overlapping steps' data in the head",
    "F4": "a foreign commit is never replaced",
    "F5": "nothing that was on the branch becomes unreachable (branch or tag)",
    "F6": "fail closed: a COMPLETED output holds only its own step data, no foreign data",
    "R1": "a serializable step publishes only over the folder content it read",
    "R2": "a serializable step refused for a changed input can pass on a retry (reads anew)",
    "I2a": "only an attempt current in Conductor at its last fence moves the branch",
    "I2b": "an attempt moves the branch only while it holds its lease",
}


def _step_data(cfg: FanoutConfig, data: int, step: int) -> list[int]:
    first = step * cfg.max_tasks
    return [slot for slot in range(first, first + cfg.tasks_of(step)) if data >> slot & 1]


def check_state(cfg: FanoutConfig, s: State) -> tuple[str, str] | None:
    head = s.commits[s.head]
    assert head is not None
    steps = range(len(cfg.steps))
    history = first_parent_history(s.commits, s.head)
    superseded = 0
    for ref in history:
        commit = s.commits[ref]
        assert commit is not None
        superseded |= commit.replaces
    for step in steps:
        held = _step_data(cfg, head.data, step)
        if len(held) > 1:
            names = ", ".join(attempt_name(cfg, slot) for slot in held)
            return "F1", f"the head holds the data of {names}: two publications of one step"
        pubs = [
            ref
            for ref in history
            if ref != ROOT
            and s.commits[ref].owner != NO_REF  # type: ignore[union-attr]
            and step_of(cfg, s.commits[ref].owner)[0] == step  # type: ignore[union-attr]
            and not superseded >> ref & 1
        ]
        if len(pubs) > 1:
            names = ", ".join(ref_name(cfg, r) for r in pubs)
            return "F1", f"{names}: two publications of step {cfg.steps[step]} in effect"
    for a in steps:
        for b in steps:
            both = _step_data(cfg, head.data, a) and _step_data(cfg, head.data, b)
            if a < b and overlaps(cfg.scope(a), cfg.scope(b)) and both:
                return "F3", (
                    f"the head holds both {cfg.steps[a]} ({cfg.scope(a)}) and "
                    f"{cfg.steps[b]} ({cfg.scope(b)}), published from r0 without seeing "
                    "each other: a lost update"
                )
    if s.heads >> FOREIGN & 1 and not (
        head.first_parents >> FOREIGN & 1 and head.data & FOREIGN_DATA
    ):
        return "F4", "the foreign commit F is no longer on the branch (or its data is gone)"
    lost = s.heads & ~reachable(s.commits, 1 << s.head | s.tags)
    if lost:
        names = ", ".join(ref_name(cfg, r) for r in range(len(s.commits)) if lost >> r & 1)
        return "F5", f"{names} was on the branch and is now unreachable (no branch, no tag)"
    for slot, task in enumerate(s.tasks):
        if task.status != COMPLETED:
            continue
        step = step_of(cfg, slot)[0]
        o = task.output
        what = f"{attempt_name(cfg, slot)} COMPLETED with output {ref_name(cfg, o)}"
        out = s.commits[o]
        assert out is not None
        published = _step_data(cfg, out.data, step)  # [] for a no-op
        held = _step_data(cfg, head.data, step)
        if held != published:
            have = ", ".join(attempt_name(cfg, x) for x in held) or "no data"
            return "F2", f"{what}, but the head holds {have} of step {cfg.steps[step]}"
        if not head.first_parents >> o & 1:
            return "F2", f"{what}, which is not on the branch's first-parent history"
        read_at = s.commits[task.input_ref]
        assert read_at is not None
        if published not in ([], [slot]) or out.data & ~read_at.data & FOREIGN_DATA:
            return "F6", f"{what}, which is not its input plus siblings plus its own change"
    return None


def _published_over_changed_reads(
    cfg: FanoutConfig, before: State, tr: Transition
) -> tuple[str, str] | None:
    """R1 on a serializable step's merge (it lands on ``before.head``), no-op completion
    (decided on ``before.head``) or hard reset (to ``after.head``: its staged commit, or
    its input ref for a no-op), against the commit the attempt read its inputs at."""
    actor, _, after, moved = tr
    a, step = before.attempts[actor], step_of(cfg, actor)[0]
    assert a is not None
    if not cfg.checks_reads(step):
        return None
    done = after.attempts[actor]
    noop = a.pc == "noop_decide" and done is not None and done.status == COMPLETED
    how = {"merge": "its merge lands on", "reset": "its hard reset lands on"}.get(a.pc)
    how = "it completes as a no-op on" if noop else how if moved else None
    if how is None:
        return None
    on = after if a.pc == "reset" else before
    changed = reads.changed_read(cfg, on, step, a.read_at, on.head)
    if changed is None:
        return None
    return "R1", (
        f"{attempt_name(cfg, actor)} read {changed[0]} at {ref_name(cfg, a.read_at)}, but "
        f"{how} {ref_name(cfg, on.head)}, where {ref_name(cfg, changed[1])} changed it"
    )


def _refused_for_good(cfg: FanoutConfig, before: State, tr: Transition) -> tuple[str, str] | None:
    """R2 on an unpinned serializable attempt failing (retryable) where it checks its reads,
    over a folder changed since it read it: the next retry, starting on this head, must read
    that folder as the head holds it."""
    actor, _, after, _ = tr
    a, done = before.attempts[actor], after.attempts[actor]
    (step, retry), head = step_of(cfg, actor), before.head
    assert a is not None and done is not None
    if before.pinned or not cfg.checks_reads(step) or a.pc not in READ_SET_PCS:
        return None
    if done.status != FAILED or reads.changed_read(cfg, before, step, a.read_at, head) is None:
        return None
    read_at = start_refs(cfg, before, step, retry + 1)[1]
    changed = reads.changed_read(cfg, before, step, read_at, head)
    if changed is None:
        return None
    return "R2", (
        f"{attempt_name(cfg, actor)} is refused ({changed[0]} changed by "
        f"{ref_name(cfg, changed[1])}), retryable, but a retry starting on the head "
        f"{ref_name(cfg, head)} would read {changed[0]} at {ref_name(cfg, read_at)} again"
    )


def check_transition(cfg: FanoutConfig, before: State, tr: Transition) -> tuple[str, str] | None:
    actor, _, _after, moved = tr
    if actor < 0:
        return None
    if cfg.reads:
        bad = _published_over_changed_reads(cfg, before, tr) or _refused_for_good(cfg, before, tr)
        if bad is not None:
            return bad
    if not moved:
        return None
    a = before.attempts[actor]
    assert a is not None
    who = attempt_name(cfg, actor)
    if not a.current:
        return "I2a", f"{who} moved the branch though it was not current at its fence"
    if cfg.leases:
        held = before.leases[cfg.lease_key(step_of(cfg, actor)[0])]
        if held.holder != a.grant or not held.members >> actor & 1:
            by = "nobody" if held.holder == NO_REF else attempt_name(cfg, held.holder)
            return "I2b", f"{who} moved the branch without holding its lease (held by {by})"
    return None
