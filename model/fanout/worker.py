"""One fan-out attempt's program: the steps ``perago/publish/transaction.py`` takes, with
the fan-out rules (``decide_publication`` over the head's first-parent history, merges
beside disjoint siblings, the hook's re-fence, scoped replacement, post-publish check).

As in the serial model, each step is one atomic action on one shared object and private
work is folded into the shared step next to it (staging, uploads and markers into the
lease acquisition; the scoped replacement's private branch, reverts and merge into one
step). As coded: a COMPLETED attempt leaves the lease, then reports inside the report window
that opens (closed at once if its grant is over; closed by the clock while the reporter
pauses: FAILED; issue 41, ``--drop report-window`` reports under the lease as df3d7a7 did),
the no-op path always takes the lease (guarded-report), merges are guarded writes, a lost
merge answer is looked up in the history and gets the post-publish check but no lease
re-check. The hook's re-fence is not bounded to 4 tries (the head moves finitely often in
the model anyway).

Named inputs (issue 25): an unpinned attempt first reads the head (``start``): it reads its
input folders there, and its input ref, where it stages, is that head or an earlier
attempt's input ref (``start_refs``). A serializable step runs the read-set check wherever
it has just read the head it would publish over: the publish fence, the no-op decision and
the hook's re-fence (``model.fanout.reads``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from model import lease
from model.fanout import reads
from model.fanout.config import FanoutConfig, overlaps
from model.fanout.state import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    TERMINAL,
    Attempt,
    State,
    attempt_name,
    marker_paths,
    ref_name,
    step_of,
)
from model.fanout.tree import (
    INTENT,
    NO_REF,
    ROOT,
    add_commit,
    claim,
    first_parent_history,
    merge_into,
    merge_slot,
    private_slot,
    revert,
    staged_slot,
    tree_of,
)

__all__ = ["READ_SET_PCS", "RESET_WINDOW", "Transition", "decide", "start_refs", "steps"]

Transition = tuple[int, str, State, bool]

RESET_WINDOW = frozenset({"tag", "refresh", "reset"})
#: Where a serializable attempt runs the read-set check on the head it just read.
READ_SET_PCS = frozenset({"publish_fence", "noop_decide", "refence"})
REPORTED = "REPORTED"
FIRST, BESIDE, REPLACE, SCOPED, LANDED, REFUSE = (
    "first publication",
    "disjoint publication",
    "replacement publication",
    "scoped replacement",
    "already landed",
    "refused",
)


def _put(s: State, slot: int, a: Attempt, **changes: Any) -> State:
    return s._replace(attempts=(*s.attempts[:slot], a, *s.attempts[slot + 1 :]), **changes)


def _finish(cfg: FanoutConfig, a: Attempt, status: str, ref: int = NO_REF) -> Attempt:
    """Leave the lease, then report (COMPLETED inside the report window that opens); with
    ``--drop report-window``, COMPLETED is reported under the lease and released after."""
    report_first = not a.leased or (status == COMPLETED and not cfg.report_window)
    pc = "report" if report_first else "release"
    return Attempt(
        pc, leased=a.leased, status=status, ref=ref, input_ref=a.input_ref, grant=a.grant
    )


def _same_step(cfg: FanoutConfig, a: int, b: int) -> bool:
    return step_of(cfg, a)[0] == step_of(cfg, b)[0]


def _earlier(cfg: FanoutConfig, owner: int, me: int) -> bool:
    return _same_step(cfg, owner, me) and step_of(cfg, owner)[1] < step_of(cfg, me)[1]


def _overlap(cfg: FanoutConfig, owner: int, me: int) -> bool:
    if not cfg.has("scope-fence"):
        return False
    return overlaps(cfg.scope(step_of(cfg, owner)[0]), cfg.scope(step_of(cfg, me)[0]))


def decide(cfg: FanoutConfig, s: State, slot: int, head: int, input_ref: int = ROOT) -> str:
    """``decide_publication`` on ``head`` (its first-parent history read with it)."""
    if head == input_ref:
        return FIRST
    hc = s.commits[head]
    assert hc is not None
    if hc.owner == slot:
        return LANDED
    if hc.parents[:1] == (input_ref,) and hc.owner != NO_REF and _earlier(cfg, hc.owner, slot):
        return REPLACE
    earlier = False
    for ref in first_parent_history(s.commits, head):
        if ref == input_ref:
            return SCOPED if earlier else BESIDE
        commit = s.commits[ref]
        assert commit is not None
        owner = commit.owner
        if owner == slot:
            return LANDED
        if owner != NO_REF and _earlier(cfg, owner, slot) and commit.kind == "merge":
            if cfg.has("scoped-replace"):
                earlier = True
            continue
        if owner == NO_REF or _overlap(cfg, owner, slot) or _same_step(cfg, owner, slot):
            return REFUSE
    return REFUSE  # the input ref is not on the history: the branch was reset or rewritten


def _who(cfg: FanoutConfig, s: State, head: int) -> str:
    return ref_name(cfg, head)


def start_refs(cfg: FanoutConfig, s: State, step: int, retry: int) -> tuple[int, int, int]:
    """``_pre_guardrails`` for retry ``retry`` of step number ``step``, unpinned, starting
    on the head: (its input ref, where it reads its inputs, the publication the input ref
    came from or NO_REF). ``unpinned_input_ref``: the head; for a retry, the input ref of
    an earlier attempt of the step published on the head's first-parent history, so that it
    replaces that publication instead of stacking a second one on it. It reads its inputs
    at the head (Fix F7), at its input ref with ``fresh-reads`` dropped."""
    input_ref, came_from = s.head, NO_REF
    if retry > 0:
        for ref in first_parent_history(s.commits, s.head):
            commit = s.commits[ref]
            assert commit is not None
            if commit.owner == NO_REF:
                continue
            owner_step, owner_retry = step_of(cfg, commit.owner)
            if owner_step == step and owner_retry < retry:
                input_ref, came_from = commit.input_ref, ref
                break
    return input_ref, s.head if cfg.has("fresh-reads") else input_ref, came_from


def _start(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    step, retry = step_of(cfg, slot)
    input_ref, read_at, came_from = start_refs(cfg, s, step, retry)
    how = f"no ref: the head {ref_name(cfg, s.head)} is its input ref"
    if came_from != NO_REF:
        how = (
            f"no ref: {ref_name(cfg, came_from)} is an earlier attempt's, its input ref "
            f"{ref_name(cfg, input_ref)} is this one's"
        )
    folders = cfg.reads_of(step)
    if folders:
        where = "there" if read_at == input_ref else f"at the head {ref_name(cfg, read_at)}"
        how += f"; reads {', '.join(folders)} {where}"
    nxt = a._replace(pc="fence1", input_ref=input_ref, read_at=read_at if folders else ROOT)
    return [(slot, how, _put(s, slot, nxt), False)]


def _read_set(
    cfg: FanoutConfig, s: State, slot: int, a: Attempt, head: int | None = None
) -> Transition | None:
    """Serializable isolation, under the lease, on the head just read (``head``: the one
    handed over, else ``s.head``): refuse if a folder the attempt read changed since the
    commit it read it at. Terminal when pinned (every retry would read the same commit),
    else retryable (``hopeless``)."""
    step = step_of(cfg, slot)[0]
    if not cfg.checks_reads(step) or not cfg.has("read-set"):
        return None
    head = s.head if head is None else head
    changed = reads.changed_read(cfg, s, step, a.read_at, head)
    if changed is None:
        return None
    folder, by = changed
    status = TERMINAL if s.pinned else FAILED
    label = (
        f"read-set check: {folder} changed between {ref_name(cfg, a.read_at)} and the head "
        f"{ref_name(cfg, head)} (by {ref_name(cfg, by)}): PublishFenceError, "
        + ("terminal (pinned input)" if s.pinned else "retryable")
    )
    return slot, label, _put(s, slot, _finish(cfg, a, status)), False


def _current(cfg: FanoutConfig, s: State, slot: int) -> bool:
    return s.tasks[slot].status == IN_PROGRESS


def _fence(cfg: FanoutConfig, s: State, slot: int, a: Attempt, n: int) -> list[Transition]:
    current = _current(cfg, s, slot)
    if not current and cfg.has(f"fence{n}"):
        nxt = _finish(cfg, a, FAILED)
        return [(slot, f"attempt fence #{n} fails: Conductor moved on", _put(s, slot, nxt), False)]
    if n == 1:
        pc = "noop_lease" if a.empty and cfg.leases else "noop_decide" if a.empty else "stage"
    else:
        pc = "noop_decide" if a.empty else "publish_fence"
    verdict = "passes" if current else "is skipped (dropped) for a stale attempt"
    nxt = a._replace(pc=pc, current=current)
    return [(slot, f"attempt fence #{n} {verdict}", _put(s, slot, nxt), False)]


def _key(cfg: FanoutConfig, slot: int) -> int:
    return cfg.lease_key(step_of(cfg, slot)[0])


def _acquire(cfg: FanoutConfig, s: State, slot: int) -> tuple[tuple[Any, ...], str, int] | None:
    """Take the lease (free or run out), or join the group holding it: (leases, what
    happened, the grant now held), or None while it must wait."""
    key = _key(cfg, slot)
    held = s.leases[key]
    if cfg.group and _admits(cfg, held, slot):
        joined = held._replace(members=held.members | 1 << slot)
        leases = (*s.leases[:key], joined, *s.leases[key + 1 :])
        return (
            leases,
            f"joins {attempt_name(cfg, held.holder)}'s branch lease (group commit)",
            held.holder,
        )
    got = lease.acquire(held, slot)
    if got is None:
        return None
    takeover = held.holder not in (NO_REF, slot)
    leases = (*s.leases[:key], got._replace(members=1 << slot), *s.leases[key + 1 :])
    return leases, "acquires the branch lease" + (" (takeover)" if takeover else ""), slot


def _admits(cfg: FanoutConfig, held: Any, slot: int) -> bool:
    """``LeaseGroups._admits``: a live grant whose members are all disjoint other steps."""
    if held.holder == NO_REF or held.expired or not held.members:
        return False
    if not cfg.has("group-scope"):
        return True
    scope = cfg.scope(step_of(cfg, slot)[0])
    for member in range(cfg.slots):
        if held.members >> member & 1:
            if _same_step(cfg, member, slot):
                return False
            if overlaps(cfg.scope(step_of(cfg, member)[0]), scope):
                return False
    return True


def _set_lease(cfg: FanoutConfig, s: State, slot: int, value: Any) -> tuple[Any, ...]:
    key = _key(cfg, slot)
    return (*s.leases[:key], value, *s.leases[key + 1 :])


def _stage(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    """Staging branch from the input ref, uploads, scope markers, the lease, the staged
    commit (the input ref's tree with the step's scope replaced by this attempt's files)."""
    leases, label, grant = s.leases, "stages", NO_REF
    if cfg.leases:
        got = _acquire(cfg, s, slot)
        if got is None:
            return []
        leases, label, grant = got[0], got[1] + "; stages", got[2]
    base = s.commits[a.input_ref]
    assert base is not None
    markers = list(base.markers)
    if cfg.has("marker"):
        own = cfg.scope(step_of(cfg, slot)[0]).strip("/")
        for i, path in enumerate(marker_paths(cfg)):
            if path == own:
                markers[i] = claim(slot)
            elif own.startswith(path + "/") or path == "":
                markers[i] = INTENT
    staged = staged_slot(slot)
    first = step_of(cfg, slot)[0] * cfg.max_tasks
    scope = ((1 << cfg.max_tasks) - 1) << first
    commits = add_commit(
        s.commits,
        staged,
        (a.input_ref,),
        kind="staged",
        owner=slot,
        markers=tuple(markers),
        data=base.data & ~scope | 1 << slot,
        input_ref=a.input_ref,
    )
    label += f"; commits {ref_name(cfg, staged)} on {ref_name(cfg, a.input_ref)}"
    nxt = a._replace(pc="fence2", leased=cfg.leases, source=staged, grant=grant)
    return [(slot, label, _put(s, slot, nxt, commits=commits, leases=leases), False)]


def _publish_fence(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    taken = _take_turn(cfg, s, slot, a)
    if taken is None:
        return []
    s, handed, parent = taken
    # The head this fence decides on: the one the previous member handed over (as that
    # member built it: its first parent is the head that member's fence saw), else read.
    head, view, how = s.head, s, ""
    if handed != NO_REF:
        head, view, how = handed, _as_built(s, handed, parent), " (handed over)"
    d = decide(cfg, view, slot, head, a.input_ref)
    label = f"publish fence: head {ref_name(cfg, head)}{how} -> {d}"
    refused = _read_set(cfg, view, slot, a, head) if d in (FIRST, BESIDE, REPLACE, SCOPED) else None
    if refused is not None:  # its state is the view's: keep only the attempt's end
        ended = refused[2].attempts[slot]
        assert ended is not None
        return [(slot, f"{label}; {refused[1]}", _put(s, slot, ended), False)]
    if d in (FIRST, BESIDE):
        nxt = a._replace(pc="merge_refresh" if cfg.leases else "merge", seen=head)
    elif d == REPLACE:
        nxt = a._replace(pc="reread" if cfg.leases else _tag_or_reset(cfg), seen=head)
    elif d == SCOPED:
        nxt = a._replace(pc="scoped", seen=head)
    elif d == LANDED:
        nxt = _finish(cfg, a, COMPLETED, _own(view, slot, head))
    else:
        nxt = _finish(cfg, a, FAILED)
        label += " (PublishFenceError)"
    return [(slot, label, _put(s, slot, nxt), False)]


def _as_built(s: State, handed: int, parent: int) -> State:
    """``s`` with the handed-over commit as its member built it: its first parent the head
    that member's fence saw (lakeFS's own has that parent only when the hook guarded it)."""
    real = s.commits[handed]
    assert real is not None
    if real.parents[:1] == (parent,):
        return s
    commits = add_commit(
        s.commits,
        handed,
        (parent, *real.parents[1:]),
        kind=real.kind,
        markers=real.markers,
        data=real.data,
        owner=real.owner,
        replaces=real.replaces,
        input_ref=real.input_ref,
    )
    return s._replace(commits=commits)


def _own(s: State, slot: int, head: int | None = None) -> int:
    for ref in first_parent_history(s.commits, s.head if head is None else head):
        commit = s.commits[ref]
        assert commit is not None
        if commit.owner == slot:
            return ref
    raise AssertionError("LANDED without the attempt's commit")


def _tag_or_reset(cfg: FanoutConfig) -> str:
    return "tag" if cfg.has("tag") else "refresh" if cfg.leases else "reset"


def _scoped(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    """Private branch from the head the fence saw; revert the earlier publication(s) of this
    step, newest first; merge the staged commit (none for a no-op)."""
    seen = s.commits[a.seen]
    assert seen is not None
    tree: tuple[tuple[int, ...], int] | None = (seen.markers, seen.data)
    undo = 0
    for ref in first_parent_history(s.commits, a.seen):
        if ref == a.input_ref:
            break
        commit = s.commits[ref]
        assert commit is not None
        if commit.owner != NO_REF and _earlier(cfg, commit.owner, slot) and tree is not None:
            parent = s.commits[commit.parents[0]]
            assert parent is not None
            tree = revert(tree, commit, parent)
            undo |= 1 << ref
    parents: tuple[int, ...] = (a.seen,)
    if tree is not None and not a.empty:
        tree = merge_into(s.commits, tree, a.seen, a.source)
        parents = (a.seen, a.source)
    if tree is None:
        label = "scoped replacement: a revert or the merge conflicts (PublishFenceError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    private = private_slot(slot)
    commits = add_commit(
        s.commits,
        private,
        parents,
        kind="private",
        markers=tree[0],
        data=tree[1],
        replaces=undo,
        input_ref=a.input_ref,
    )
    names = ", ".join(ref_name(cfg, r) for r in range(len(s.commits)) if undo >> r & 1)
    label = f"scoped replacement: {ref_name(cfg, private)} from the head reverts {names}"
    label += "" if a.empty else f", merges {ref_name(cfg, a.source)}"
    pc = "merge_refresh" if cfg.leases else "merge"
    nxt = a._replace(pc=pc, source=private)
    return [(slot, label, _put(s, slot, nxt, commits=commits), False)]


def _merge_refresh(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    renewed = lease.renew(s.leases[_key(cfg, slot)], a.grant)
    if renewed is None:
        label = "refreshes the lease before merging: taken over (LeaseLostError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _put(s, slot, a._replace(pc="merge"), leases=_set_lease(cfg, s, slot, renewed))
    return [(slot, "refreshes the lease before merging", nxt, False)]


def _post_check_passes(cfg: FanoutConfig, s: State, slot: int, under: int, seen: int) -> bool:
    """``_check_first_parent``: the merge sits on the head the fence saw, or on disjoint
    Perago publications that landed on it since."""
    if not cfg.has("postcheck") or under == seen:
        return True
    return decide(cfg, s, slot, under, seen) == BESIDE


def _merge(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    why = lease.guard(s.leases[_key(cfg, slot)], a.grant) if cfg.leases else ""
    if why:
        label = f"guarded merge refused: {why}"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    scoped = a.source == private_slot(slot)
    if s.hook and cfg.hooks_run and s.head != a.seen:
        label = "merge rejected by lakeFS: 412 expected-head hook: the head moved"
        if scoped:
            return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
        return [
            (slot, label + "; re-reads the head", _put(s, slot, a._replace(pc="refence")), False)
        ]
    source, head = s.commits[a.source], s.commits[s.head]
    assert source is not None and head is not None
    tree = merge_into(s.commits, tree_of(head), s.head, a.source)
    if tree is None:
        label = "merge rejected by lakeFS: 409 conflict on a scope marker"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    into = merge_slot(slot)
    commits = add_commit(
        s.commits,
        into,
        (s.head, a.source),
        kind="merge",
        owner=slot,
        markers=tree[0],
        data=tree[1],
        replaces=source.replaces,
        input_ref=a.input_ref,
    )
    moved = s._replace(commits=commits, head=into, heads=s.heads | 1 << into)
    handing = _handing(cfg, moved, slot, a, into, s.head) if not scoped else None
    landed = (
        f"merges {ref_name(cfg, a.source)} onto {ref_name(cfg, s.head)}: head {ref_name(cfg, into)}"
    )
    out = []
    for lost in (False, True):
        label = landed + ("; the answer is lost, the log shows it" if lost else "")
        if not _post_check_passes(cfg, moved, slot, s.head, a.seen):
            label += (
                f"; post-publish check fails: {ref_name(cfg, s.head)} is not what the fence saw"
            )
            nxt = _finish(cfg, a, FAILED)
        elif cfg.leases and not lost:
            nxt = a._replace(pc="merge_recheck", ref=into)
        else:
            nxt = _finish(cfg, a, COMPLETED, into)
        after = moved if lost or handing is None else handing  # a lost answer hands nothing
        out.append((slot, label, _put(after, slot, nxt), True))
    return out


def _handing(
    cfg: FanoutConfig, s: State, slot: int, a: Attempt, into: int, under: int
) -> State | None:
    """``Publisher._hand_on``: in its turn, a member hands the merge commit it read back to
    the next turn, only when its first parent (``under``, the head the merge landed on) is
    the head its fence saw; None when it does not. Without ``handoff-readback``, as the code
    before issue 38: it hands on the commit as it builds it (first parent: the head its
    fence saw) whenever the hook's file is in the tree, whether or not lakeFS runs it."""
    if not (cfg.group and cfg.leases and cfg.has("turnstile") and a.leased):
        return None
    if (under != a.seen) if cfg.has("handoff-readback") else not s.hook:
        return None
    held = s.leases[_key(cfg, slot)]
    if held.holder != a.grant or held.turn != slot:
        return None
    handed = held._replace(handed=into, handed_parent=a.seen)
    return s._replace(leases=_set_lease(cfg, s, slot, handed))


def _refence(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    d = decide(cfg, s, slot, s.head, a.input_ref)
    label = f"publish fence again: head {ref_name(cfg, s.head)} -> {d}"
    if d != BESIDE:
        return [(slot, label + ": fails", _put(s, slot, _finish(cfg, a, FAILED)), False)]
    refused = _read_set(cfg, s, slot, a)
    if refused is not None:
        return [(slot, f"{label}; {refused[1]}", *refused[2:])]
    nxt = a._replace(pc="merge_refresh" if cfg.leases else "merge", seen=s.head)
    return [(slot, label, _put(s, slot, nxt), False)]


def _merge_recheck(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    if not lease.holds(s.leases[_key(cfg, slot)], a.grant):
        label = "re-checks the lease after the merge: lost (LeaseLostError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _finish(cfg, a, COMPLETED, a.ref)
    return [(slot, "re-checks the lease after the merge: held", _put(s, slot, nxt), False)]


def _noop_lease(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    got = _acquire(cfg, s, slot)
    if got is None:
        return []
    nxt = a._replace(pc="noop_fence", leased=True, grant=got[2])
    return [(slot, "no-op: " + got[1], _put(s, slot, nxt, leases=got[0]), False)]


def _noop_decide(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    taken = _take_turn(cfg, s, slot, a)
    if taken is None:
        return []
    s = taken[0]  # a handed-over head is dropped: the no-op decision reads the head
    d = decide(cfg, s, slot, s.head, a.input_ref)
    head, input_ref = ref_name(cfg, s.head), ref_name(cfg, a.input_ref)
    refused = _read_set(cfg, s, slot, a) if d in (FIRST, BESIDE, REPLACE, SCOPED) else None
    if refused is not None:
        return [(slot, f"no-op: head {head} -> {d}; {refused[1]}", *refused[2:])]
    if d in (FIRST, BESIDE):
        nxt = _finish(cfg, a, COMPLETED, a.input_ref)
        label = f"no-op: head {head} -> {d}: completes with {input_ref}"
    elif d == SCOPED:
        nxt = a._replace(pc="scoped", seen=s.head)
        label = f"no-op: head {head} -> scoped replacement (revert only)"
    elif d == REPLACE:
        nxt = a._replace(pc="reread" if cfg.leases else _tag_or_reset(cfg), seen=s.head)
        label = f"no-op: head {head} is an abandoned publication: relocate to {input_ref}"
    else:
        nxt = _finish(cfg, a, FAILED)
        label = f"no-op: head {head} -> {d}: PublishFenceError"
    return [(slot, label, _put(s, slot, nxt), False)]


def _reread(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    if s.head != a.seen:
        label = f"re-reads the head under the lease: {ref_name(cfg, s.head)} moved: fails"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    label = f"re-reads the head under the lease: still {ref_name(cfg, s.head)}"
    return [(slot, label, _put(s, slot, a._replace(pc=_tag_or_reset(cfg))), False)]


def _tag(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    label = f"tags {ref_name(cfg, a.seen)} (perago-replaced-...)"
    nxt = a._replace(pc="refresh" if cfg.leases else "reset")
    return [(slot, label, _put(s, slot, nxt, tags=s.tags | 1 << a.seen), False)]


def _refresh(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    renewed = lease.renew(s.leases[_key(cfg, slot)], a.grant)
    if renewed is None:
        label = "refreshes the lease: taken over (LeaseLostError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _put(s, slot, a._replace(pc="reset"), leases=_set_lease(cfg, s, slot, renewed))
    return [(slot, "refreshes the lease", nxt, False)]


def _reset(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    to = a.input_ref if a.empty else a.source
    if cfg.leases:
        why = lease.guard(s.leases[_key(cfg, slot)], a.grant)
        if why:
            label = f"guarded hard reset refused: {why}"
            return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
        nxt = a._replace(pc="recheck")
    elif a.empty:
        nxt = _finish(cfg, a, COMPLETED, a.input_ref)
    else:
        nxt = a._replace(pc="verify")
    label = f"hard-resets the branch from {ref_name(cfg, s.head)} to {ref_name(cfg, to)}"
    return [(slot, label, _put(s, slot, nxt, head=to, heads=s.heads | 1 << to), True)]


def _recheck(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    if not lease.holds(s.leases[_key(cfg, slot)], a.grant):
        label = "re-checks the lease after the reset: lost (LeaseLostError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _finish(cfg, a, COMPLETED, a.input_ref) if a.empty else a._replace(pc="verify")
    return [(slot, "re-checks the lease after the reset: held", _put(s, slot, nxt), False)]


def _verify(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    if s.head != a.source:
        label = f"verifies the head: {ref_name(cfg, s.head)}, not its staged commit: fails"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _finish(cfg, a, COMPLETED, a.source)
    return [(slot, "verifies the head: its staged commit", _put(s, slot, nxt), False)]


def _release(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    """Release the lease; a group member leaves the group, and the last one releases it."""
    key = _key(cfg, slot)
    held = s.leases[key]
    if held.holder != a.grant:
        label = "releases the lease (no longer its)"
        released = held
    elif held.members & ~(1 << slot):
        label = "leaves the group (the lease stays with the other members)"
        released = held._replace(members=held.members & ~(1 << slot))
    else:
        label = "releases the lease"
        released = lease.release(held, a.grant)
    nxt = Attempt("done") if a.status == REPORTED else a._replace(pc="report")
    if cfg.report_window and a.status == COMPLETED:
        # The window ends when the grant would have: closed at once if it is over or taken.
        why = lease.guard(held, a.grant)
        if why:
            label += f"; its report window is closed already ({why})"
            nxt = a._replace(pc="report", leased=False, status=FAILED, ref=NO_REF)
        else:
            label += "; its report window opens"
            nxt = a._replace(pc="report", leased=False, window=True)
    return [(slot, label, _put(s, slot, nxt, leases=_set_lease(cfg, s, slot, released)), False)]


def _report(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> list[Transition]:
    """The final report; inside its window, COMPLETED or, the window having closed while the
    reporter paused, FAILED (the retry decides from the branch)."""
    if a.window:
        late = a._replace(window=False, status=FAILED, ref=NO_REF)
        return [
            *_report_as(cfg, s, slot, a._replace(window=False), ""),
            *_report_as(cfg, s, slot, late, "report window closed: COMPLETED refused; "),
        ]
    label = ""
    under_lease = cfg.leases and a.leased and a.status == COMPLETED
    why = lease.guard(s.leases[_key(cfg, slot)], a.grant) if under_lease else ""
    if why:
        label = f"guarded report refused ({why}); "
        a = a._replace(status=FAILED, ref=NO_REF)
    return _report_as(cfg, s, slot, a, label, under_lease=under_lease)


def _report_as(
    cfg: FanoutConfig, s: State, slot: int, a: Attempt, label: str, *, under_lease: bool = False
) -> list[Transition]:
    from model.fanout import conductor

    reported, effective = conductor.report(cfg, s, slot, a.status, a.ref, a.input_ref)
    what = a.status + (f" with output {ref_name(cfg, a.ref)}" if a.status == COMPLETED else "")
    label += f"reports {what} ({'effective' if effective else 'ignored: the task is terminal'})"
    nxt = a._replace(pc="release", status=REPORTED) if under_lease else Attempt("done")
    return [(slot, label, _put(reported, slot, nxt), False)]


#: Where a group member holds its turn (taken with the head read at the publish fence or
#: the no-op decision): until the merge returns, or through a reset and its checks.
TURN_PCS = frozenset(
    {"scoped", "merge_refresh", "merge", "refence", "reread", "tag", "refresh", "reset"}
    | {"recheck", "verify"}
)


def _take_turn(cfg: FanoutConfig, s: State, slot: int, a: Attempt) -> tuple[State, int, int] | None:
    """``GroupMember.turn``: wait while another member of the grant has its turn; then the
    turn takes the head the previous member handed over (dropped from the grant whatever
    this turn does): (state, handed head or NO_REF, its first parent as built). A member
    whose grant was taken over is not held back (its group's turnstile is not modelled:
    more interleavings, and its writes fail their lease guard anyway)."""
    if not (cfg.group and cfg.leases and cfg.has("turnstile") and a.leased):
        return s, NO_REF, NO_REF
    key = _key(cfg, slot)
    held = s.leases[key]
    if held.holder != a.grant:
        return s, NO_REF, NO_REF
    if held.turn not in (NO_REF, slot):
        return None
    taken = held._replace(turn=slot, handed=NO_REF, handed_parent=NO_REF)
    return (
        s._replace(leases=_set_lease(cfg, s, slot, taken)),
        held.handed,
        held.handed_parent,
    )


def _end_turn(cfg: FanoutConfig, slot: int, tr: Transition) -> Transition:
    actor, label, nxt, moved = tr
    after = nxt.attempts[slot]
    held = nxt.leases[_key(cfg, slot)]
    if held.turn != slot or (after is not None and after.pc in TURN_PCS):
        return tr
    return (
        actor,
        label,
        nxt._replace(leases=_set_lease(cfg, nxt, slot, held._replace(turn=NO_REF))),
        moved,
    )


Step = Callable[[FanoutConfig, State, int, Attempt], list[Transition]]

_STEPS: dict[str, Step] = {
    "start": _start,
    "fence1": lambda cfg, s, slot, a: _fence(cfg, s, slot, a, 1),
    "stage": _stage,
    "fence2": lambda cfg, s, slot, a: _fence(cfg, s, slot, a, 2),
    "noop_lease": _noop_lease,
    "noop_fence": lambda cfg, s, slot, a: _fence(cfg, s, slot, a, 2),
    "noop_decide": _noop_decide,
    "publish_fence": _publish_fence,
    "scoped": _scoped,
    "merge_refresh": _merge_refresh,
    "merge": _merge,
    "refence": _refence,
    "merge_recheck": _merge_recheck,
    "reread": _reread,
    "tag": _tag,
    "refresh": _refresh,
    "reset": _reset,
    "recheck": _recheck,
    "verify": _verify,
    "release": _release,
    "report": _report,
}

STEP_NAMES = frozenset(_STEPS) | {"done"}


def steps(cfg: FanoutConfig, s: State, slot: int) -> list[Transition]:
    a = s.attempts[slot]
    assert a is not None
    out = _STEPS[a.pc](cfg, s, slot, a)
    return [_end_turn(cfg, slot, tr) for tr in out] if cfg.group else out
