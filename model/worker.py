"""One attempt's program: the steps perago/worker/runtime.py and perago/publish/transaction.py take.

Each step is one atomic action against one shared object (lakeFS, the lease record or
Conductor), so the explorer interleaves every other actor between any two of them: that is
where a worker pauses. Purely private work is folded into the shared step next to it
(materialize, body and diff into the start; staging branch, uploads, marker and the staged
commit into the lease acquisition), which removes states without removing behaviours: no
other actor can observe the difference.

Where the code and the issue's description differ, the model follows the code:
- the marker is uploaded after the lease is acquired (``_commit_staging``), not before;
  both are writes to the attempt's private staging branch, so the order is invisible;
- the no-op relocation is not verified after the reset (only the replacement is);
- ``refresh`` (renew only if less than half the ttl is left) is modelled as ``renew``: with
  abstract time both end in the same lease state, and both fail once the lease was taken;
- a merge whose answer is lost is looked up in the log (``find_own_publication``) and gets
  the post-publish check, but no lease re-check (the exception skips ``guarded``'s).

The no-op path (``Publisher._confirm_noop``, 261b23b), with a lease backend: read the lease
record (``BranchLeases.held``, one read: held iff it names an owner, run out or not); free,
then read the head, and the head is the input ref: complete, without the lease. Held, or
another head: acquire the lease (waiting; a run-out grant is taken over), re-run the attempt
fence (fence #2) and decide on the head under it. The lease read and the head read are two
steps, so everything can happen between them. ``--drop noop-peek`` gives the code before
261b23b (decide on the head without reading the lease, take it only to relocate): F1.
The report (issue 41): a COMPLETED attempt leaves the lease before its report, opening a
report window if its grant is still on; the report is refused once the window has closed,
which a clock step may do at any moment (the reporter paused past its end); a re-delivery
(poll count > 1) waits, after taking the lease, until no other delivery of its task id has
a window open. A reporter whose window closed takes the lease again, re-runs the attempt
fence under it and reports in a second window (FAILED if that one closes too, or if the
fence fails; ``--drop report-again``: FAILED at once). ``--drop report-window`` gives the
code from df3d7a7: COMPLETED reported under
the lease, released after it. Proposed fixes (``Config.fixes``) change exactly the steps
they name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from model import conductor, lease
from model.config import Config
from model.state import COMPLETED, FAILED, Attempt, Lease, State, attempt_name, ref_name, task_of
from model.store import NO_REF, ROOT, add_commit, merge, merge_slot, staged_slot

__all__ = ["REPORTING", "RESET_WINDOW", "Transition", "decide", "steps"]

#: (actor: attempt slot, or < 0 for the environment; what happened; next state; whether the
#: step moved the target branch, which I2a/I2b check)
Transition = tuple[int, str, State, bool]

#: Steps between the last head validation of a hard reset and the reset itself.
RESET_WINDOW = frozenset({"tag", "refresh", "reset"})

REPORTED = "REPORTED"  # guarded-report: reported under the lease, release next
#: Steps at or after the final report: the extension thread has stopped.
REPORTING = frozenset({"report"})
FIRST, LANDED, REPLACE, REFUSE = "FIRST", "LANDED", "REPLACE", "refused"


def _put(s: State, slot: int, a: Attempt, **changes: Any) -> State:
    attempts = (*s.attempts[:slot], a, *s.attempts[slot + 1 :])
    return s._replace(attempts=attempts, **changes)


def _finish(cfg: Config, a: Attempt, status: str, ref: int = NO_REF) -> Attempt:
    """Leave the protocol: release the lease if it was acquired, then report.

    With guarded-report (as coded), a COMPLETED report goes first, under the lease.
    """
    report_first = not a.leased or (
        status == COMPLETED and cfg.guarded_report and not cfg.report_window
    )
    pc = "report" if report_first else "release"
    # Only what reporting needs survives, so equal futures share one state.
    fresh = a.fresh and status == COMPLETED
    return Attempt(
        pc,
        input_ref=a.input_ref,
        leased=a.leased,
        status=status,
        ref=ref,
        again=a.again,
        fresh=fresh,
    )


def _earlier(cfg: Config, owner: int, me: int) -> bool:
    """``is_earlier_attempt_of_same_step``: a lower (retry count, poll count), not itself."""
    return owner != me and task_of(cfg, owner) < task_of(cfg, me)


def _owner(cfg: Config, s: State, ref: int) -> int:
    """The attempt named in a commit's metadata (NO_REF if none, or identity is dropped)."""
    commit = s.commits[ref]
    assert commit is not None
    return commit.owner if cfg.has("identity") else NO_REF


def decide(cfg: Config, s: State, slot: int, input_ref: int) -> str:
    """``decide_publication`` on the current head."""
    head = s.commits[s.head]
    assert head is not None
    if s.head == input_ref:
        return FIRST
    owner = _owner(cfg, s, s.head)
    if owner != NO_REF and owner == slot:
        return LANDED
    if head.parents[:1] == (input_ref,):
        if not cfg.has("identity"):
            return REPLACE
        if owner != NO_REF and _earlier(cfg, owner, slot):
            return REPLACE
    return REFUSE


def _reset_entry(cfg: Config) -> str:
    """First step of ``_reset`` after the decision (the lease path re-reads the head first)."""
    if cfg.leases:
        return "reread"
    return "tag" if cfg.has("tag") else "reset"


def _noop_under_lease(cfg: Config) -> bool:
    """The no-op path decides under the branch lease (unless the lease read allows a shortcut).

    As coded (261b23b) when the lease read finds it held or the head is not the input ref;
    always with the fix guarded-report. Without ``noop-peek`` (the code before 261b23b) the
    decision is taken without the lease, which is acquired only to relocate.
    """
    return cfg.leases and (cfg.has("noop-peek") or cfg.guarded_report)


def _noop_entry(cfg: Config) -> str:
    """The no-op path's first step after fence #1."""
    if not _noop_under_lease(cfg):
        return "noop_decide"
    return "noop_lease" if cfg.guarded_report else "noop_peek"


def _start(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    """Pre-guardrails (pin the input ref), materialize, body, diff."""
    if s.pinned:
        input_ref, how = ROOT, "input ref r0 from the task input"
    else:
        owner = _owner(cfg, s, s.head)
        head = s.commits[s.head]
        assert head is not None
        if owner != NO_REF and _earlier(cfg, owner, slot) and head.input_ref != NO_REF:
            input_ref = head.input_ref
            how = f"unpinned: head {ref_name(cfg, s.head)} is an earlier attempt's, pin its input"
        else:
            input_ref, how = s.head, "unpinned: pin the head"
    if s.diff != -1:
        choices: tuple[bool, ...] = (s.diff == 1,)
    else:
        choices = (False, True) if cfg.noop else (False,)
    out = []
    for empty in choices:
        body = "empty diff" if empty else "non-empty diff"
        label = f"start: {how} ({ref_name(cfg, input_ref)}); body -> {body}"
        nxt = a._replace(pc="fence1", input_ref=input_ref, empty=empty)
        out.append((slot, label, _put(s, slot, nxt), False))
    return out


def _fence(cfg: Config, s: State, slot: int, a: Attempt, n: int) -> list[Transition]:
    current = conductor.is_current(cfg, s, slot)
    if not current and cfg.has(f"fence{n}"):
        label = f"attempt fence #{n} fails: Conductor moved on"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    if n == 1 and a.empty:
        pc = _noop_entry(cfg)
        if pc == "noop_lease" and _waits_for_windows(cfg, slot):
            pc = "noop_window_wait"
    elif n == 1:
        pc = "window_wait" if cfg.leases and _waits_for_windows(cfg, slot) else "stage"
    else:
        pc = "noop_decide" if a.empty else "publish_fence"
    verdict = "passes" if current else "is skipped (dropped) for a stale attempt"
    label = f"attempt fence #{n} {verdict}"
    fresh = n == 2 and cfg.fresh_fences
    nxt = a._replace(pc=pc, current=current, fresh=fresh)
    return [(slot, label, _put(s, slot, nxt), False)]


def _fence1(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    return _fence(cfg, s, slot, a, 1)


def _fence2(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    return _fence(cfg, s, slot, a, 2)


def _noop_decide(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    d = decide(cfg, s, slot, a.input_ref)
    head = ref_name(cfg, s.head)
    if d == FIRST:
        nxt = _finish(cfg, a, COMPLETED, a.input_ref)
        how = " (under the lease)" if a.leased else ""
        label = f"no-op: head {head} is the input ref{how}: completes with it"
        return [(slot, label, _put(s, slot, nxt), False)]
    if d == REPLACE:
        lease_next = cfg.leases and not _noop_under_lease(cfg)
        pc = "noop_lease" if lease_next else _reset_entry(cfg)
        nxt = a._replace(pc=pc, seen=s.head)
        label = f"no-op: head {head} is an abandoned publication: relocate to the input ref"
        return [(slot, label, _put(s, slot, nxt), False)]
    why = "its own publication" if d == LANDED else "unexplained"
    label = f"no-op: head {head} is {why}: PublishFenceError"
    return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]


def _noop_peek(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    """``BranchLeases.held``: one read of the lease record, no acquisition."""
    if s.lease.holder == NO_REF:
        label = "no-op: reads the branch lease: free"
        return [(slot, label, _put(s, slot, a._replace(pc="noop_head")), False)]
    holder = attempt_name(cfg, s.lease.holder)
    label = (
        f"no-op: reads the branch lease: held by {holder}: takes it (waits) and decides under it"
    )
    return [(slot, label, _put(s, slot, a._replace(pc="noop_lease")), False)]


def _noop_head(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    """The lease was free: read the head; the input ref completes without the lease."""
    head = ref_name(cfg, s.head)
    if s.head == a.input_ref:
        nxt = _finish(cfg, a, COMPLETED, a.input_ref)
        label = f"no-op: head {head} is the input ref (the lease was free): completes with it"
        return [(slot, label, _put(s, slot, nxt), False)]
    label = f"no-op: head {head} is not the input ref: takes the lease and decides under it"
    return [(slot, label, _put(s, slot, a._replace(pc="noop_lease")), False)]


def _acquire(s: State, slot: int, label: str) -> tuple[Lease, str] | None:
    """``lease.acquire`` and the step's label (marked when it took a run-out grant over);
    None while a live grant blocks it: the attempt waits for the holder to release it or to
    go silent."""
    granted = lease.acquire(s.lease, slot)
    if granted is None:
        return None
    takeover = s.lease.holder not in (NO_REF, slot)
    return granted, label + (" (takeover)" if takeover else "")


def _noop_lease(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    acquired = _acquire(s, slot, "acquires the branch lease")
    if acquired is None:
        return []
    granted, label = acquired
    pc = "noop_fence" if _noop_under_lease(cfg) else "reread"
    nxt = a._replace(pc=pc, leased=True)
    return [(slot, label, _put(s, slot, nxt, lease=granted), False)]


def _waits_for_windows(cfg: Config, slot: int) -> bool:
    """Report windows (issue 41): a re-delivery waits out its task id's other report windows."""
    return cfg.report_window and cfg.has("window-wait") and task_of(cfg, slot)[1] > 1


def _window_wait(then: str) -> Step:
    """Wait, before taking the branch lease, until no earlier delivery of this task id may
    still report COMPLETED: their windows closed (by their report or their deadline), and,
    as coded, their attempt fences are stale, so none opens a window without a fence read
    that now fails. The code waits ``(FENCE_FRESH_SECONDS + REPORT_WINDOW_SECONDS)`` times
    the clock-skew rate from its poll: every earlier delivery's passing fence read was sent
    before that poll (Conductor counted it), so its window opened within the first part and
    closed within the second."""

    def step(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
        task, poll = task_of(cfg, slot)
        for other in range(cfg.slots):
            other_task, other_poll = task_of(cfg, other)
            if other_task != task or other_poll >= poll:
                continue
            if s.windows >> other & 1:
                return []
            theirs = s.attempts[other]
            if cfg.fresh_fences and theirs is not None and theirs.fresh:
                return []
        label = "re-delivery: no earlier delivery of its task id can still report COMPLETED"
        return [(slot, label, _put(s, slot, a._replace(pc=then)), False)]

    return step


def _stage(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    """Staging branch + uploads (private), branch lease, marker + staged commit (private)."""
    granted = s.lease
    label = "stages"
    if cfg.leases:
        acquired = _acquire(s, slot, "acquires the branch lease")
        if acquired is None:
            return []
        granted, label = acquired
        label += "; stages"
    parent = s.commits[a.input_ref]
    assert parent is not None
    marker = slot if cfg.has("marker") else parent.marker
    commits = add_commit(
        s.commits,
        staged_slot(slot),
        (a.input_ref,),
        kind="staged",
        owner=slot,
        input_ref=a.input_ref,
        marker=marker,
    )
    label += f"; commits {ref_name(cfg, staged_slot(slot))} on {ref_name(cfg, a.input_ref)}"
    nxt = a._replace(pc="fence2", leased=cfg.leases)
    return [(slot, label, _put(s, slot, nxt, commits=commits, lease=granted), False)]


def _publish_fence(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    d = decide(cfg, s, slot, a.input_ref)
    label = f"publish fence: head {ref_name(cfg, s.head)} -> {d}"
    if d == FIRST:
        nxt = a._replace(pc="merge_refresh" if _merge_guarded(cfg) else "merge", seen=s.head)
    elif d == REPLACE:
        nxt = a._replace(pc=_reset_entry(cfg), seen=s.head)
    elif d == LANDED:
        nxt = _finish(cfg, a, COMPLETED, s.head)
    else:
        nxt = _finish(cfg, a, FAILED)
        label += " (PublishFenceError)"
    return [(slot, label, _put(s, slot, nxt), False)]


def _merge_guarded(cfg: Config) -> bool:
    return cfg.leases and cfg.has("merge-guard")


def _merge_refresh(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    renewed = lease.renew(s.lease, slot)
    if renewed is None:
        label = "refreshes the lease before merging: taken over (LeaseLostError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    label = "refreshes the lease before merging"
    return [(slot, label, _put(s, slot, a._replace(pc="merge"), lease=renewed), False)]


def _merge(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    staged, into = staged_slot(slot), merge_slot(slot)
    guarded = _merge_guarded(cfg)
    why = lease.guard(s.lease, slot) if guarded else ""
    if why:
        label = f"guarded merge refused: {why}"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    out = merge(
        s.commits,
        s.head,
        staged,
        into,
        owner=slot,
        input_ref=a.input_ref,
        expected_head=a.seen,
        hook=s.hook,
    )
    if out.head == NO_REF:
        label = f"merge rejected by lakeFS: {out.error}"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    on = ref_name(cfg, s.head)
    moved = s._replace(commits=out.commits, head=into, heads=s.heads | 1 << into)
    landed = f"merges {ref_name(cfg, staged)} into the branch on {on}: head {ref_name(cfg, into)}"
    out_steps = []
    for lost in (False, True):
        # A lost answer (StoreError): find_own_publication finds the merge commit in the log;
        # the post-publish check runs on it, guarded's re-check does not (the error skips it).
        label = landed + ("; the answer is lost, the log shows its publication" if lost else "")
        if cfg.has("postcheck") and s.head != a.seen:
            label += f"; post-publish check: first parent {on} is not {ref_name(cfg, a.seen)}"
            nxt = _finish(cfg, a, FAILED)
        else:
            nxt = _finish(cfg, a, COMPLETED, into)
        if guarded and not lost:  # the verdict waits for the lease re-check
            nxt = nxt._replace(pc="merge_recheck")
        out_steps.append((slot, label, _put(moved, slot, nxt), True))
    return out_steps


def _merge_recheck(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    if not lease.holds(s.lease, slot):
        label = "re-checks the lease after the merge: lost (LeaseLostError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _finish(cfg, a, a.status, a.ref)
    return [(slot, "re-checks the lease after the merge: held", _put(s, slot, nxt), False)]


def _reread(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    if s.head != a.seen:
        label = f"re-reads the head under the lease: {ref_name(cfg, s.head)} moved: fails"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    pc = "tag" if cfg.has("tag") else "refresh"
    label = f"re-reads the head under the lease: still {ref_name(cfg, s.head)}"
    return [(slot, label, _put(s, slot, a._replace(pc=pc)), False)]


def _tag(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    pc = "refresh" if cfg.leases else "reset"
    label = f"tags {ref_name(cfg, a.seen)} (perago-replaced-...)"
    return [(slot, label, _put(s, slot, a._replace(pc=pc), tags=s.tags | 1 << a.seen), False)]


def _refresh(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    renewed = lease.renew(s.lease, slot)
    if renewed is None:
        label = "refreshes the lease: taken over (LeaseLostError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _put(s, slot, a._replace(pc="reset"), lease=renewed)
    return [(slot, "refreshes the lease", nxt, False)]


def _reset(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    to = a.input_ref if a.empty else staged_slot(slot)
    if cfg.leases:
        why = lease.guard(s.lease, slot)
        if why:
            label = f"guarded hard reset refused: {why}"
            return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
        nxt = a._replace(pc="recheck", seen=NO_REF)
    elif a.empty:
        nxt = _finish(cfg, a, COMPLETED, a.input_ref)
    else:
        nxt = a._replace(pc="verify", seen=NO_REF)
    label = f"hard-resets the branch from {ref_name(cfg, s.head)} to {ref_name(cfg, to)}"
    moved = _put(s, slot, nxt, head=to, heads=s.heads | 1 << to)
    return [(slot, label, moved, True)]


def _recheck(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    if not lease.holds(s.lease, slot):
        label = "re-checks the lease after the reset: lost (LeaseLostError)"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _finish(cfg, a, COMPLETED, a.input_ref) if a.empty else a._replace(pc="verify")
    return [(slot, "re-checks the lease after the reset: held", _put(s, slot, nxt), False)]


def _verify(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    staged = staged_slot(slot)
    if s.head != staged:
        label = f"verifies the head: {ref_name(cfg, s.head)}, not its staged commit: fails"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    nxt = _finish(cfg, a, COMPLETED, staged)
    return [(slot, "verifies the head: its staged commit", _put(s, slot, nxt), False)]


def _release(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    released = lease.release(s.lease, slot)
    label = "releases the lease" if released != s.lease else "releases the lease (no longer its)"
    nxt = Attempt("done") if a.status == REPORTED else a._replace(pc="report")
    windows = s.windows
    if cfg.report_window and a.status == COMPLETED:
        # A window opens only under the grant (the code renews it first): closed already
        # if the attempt's clock says the grant is over, or it was taken over; and, as
        # coded, only while its attempt fence is fresh. Its length is the clock's: a clock
        # step may close it at any time.
        if lease.guard(s.lease, slot):
            label += "; its report window is closed already (the grant was over)"
        elif cfg.fresh_fences and not a.fresh:
            label += "; its report window is closed already (its attempt fence is stale)"
        else:
            windows |= 1 << slot
            label += "; its report window opens"
        if nxt.pc == "report":
            nxt = nxt._replace(fresh=False)
    return [(slot, label, _put(s, slot, nxt, lease=released, windows=windows), False)]


def _report(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    if s.extending == slot and cfg.has("serial-report"):
        return []  # waits for its extension in flight (report.TaskUpdates)
    label = ""
    under_lease = a.leased and a.status == COMPLETED and cfg.guarded_report
    windowed = under_lease and cfg.report_window
    under_lease = under_lease and not windowed
    if under_lease and lease.guard(s.lease, slot):
        label = f"guarded report refused ({lease.guard(s.lease, slot)}); "
        a = a._replace(status=FAILED, ref=NO_REF)
    if windowed and not s.windows >> slot & 1:
        if cfg.has("report-again") and not a.again:
            label = "report window closed: takes the branch lease again for a second window"
            nxt = a._replace(pc="again_lease", again=True)
            return [(slot, label, _put(s, slot, nxt), False)]
        label = "report window closed: COMPLETED refused; "
        a = a._replace(status=FAILED, ref=NO_REF)
    if windowed:
        s = s._replace(windows=s.windows & ~(1 << slot))
    reported, effective = conductor.report(cfg, s, slot, a)
    what = a.status + (f" with output {ref_name(cfg, a.ref)}" if a.status == COMPLETED else "")
    verdict = "effective" if effective else "ignored: the task id is terminal"
    label += f"reports {what} ({verdict})"
    nxt = a._replace(pc="release", status=REPORTED) if under_lease else Attempt("done")
    return [(slot, label, _put(reported, slot, nxt), False)]


def _again_lease(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    """Report windows, a second one (``Worker._report``): take the branch lease again."""
    acquired = _acquire(s, slot, "acquires the branch lease again")
    if acquired is None:
        return []
    granted, label = acquired
    pc = "again_fence" if cfg.has("again-fence") else "release"
    return [(slot, label, _put(s, slot, a._replace(pc=pc), lease=granted), False)]


def _again_fence(cfg: Config, s: State, slot: int, a: Attempt) -> list[Transition]:
    """The attempt fence under the lease taken again: still this delivery, in progress."""
    if not conductor.is_current(cfg, s, slot):
        label = "attempt fence before a second window fails: Conductor moved on"
        return [(slot, label, _put(s, slot, _finish(cfg, a, FAILED)), False)]
    label = "attempt fence before a second window passes"
    nxt = a._replace(pc="release", fresh=cfg.fresh_fences)
    return [(slot, label, _put(s, slot, nxt), False)]


Step = Callable[[Config, State, int, Attempt], list[Transition]]

_STEPS: dict[str, Step] = {
    "polled": _start,
    "fence1": _fence1,
    "noop_peek": _noop_peek,
    "noop_head": _noop_head,
    "noop_decide": _noop_decide,
    "noop_lease": _noop_lease,
    "stage": _stage,
    "fence2": _fence2,
    "noop_fence": _fence2,
    "publish_fence": _publish_fence,
    "merge_refresh": _merge_refresh,
    "merge": _merge,
    "merge_recheck": _merge_recheck,
    "reread": _reread,
    "tag": _tag,
    "refresh": _refresh,
    "reset": _reset,
    "recheck": _recheck,
    "verify": _verify,
    "release": _release,
    "report": _report,
    "window_wait": _window_wait("stage"),
    "noop_window_wait": _window_wait("noop_lease"),
    "again_lease": _again_lease,
    "again_fence": _again_fence,
}


def steps(cfg: Config, s: State, slot: int) -> list[Transition]:
    """The next step of attempt ``slot`` (several if the body's diff is still to be chosen)."""
    a = s.attempts[slot]
    assert a is not None
    return _STEPS[a.pc](cfg, s, slot, a)
