"""The model check of the publication protocol (docs/model-check.md), and its step semantics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from model import MECHANISMS, Config, conductor, explore, lease, worker
from model.__main__ import main
from model.report import STEPS, steps_of, why_no_counterexample
from model.state import (
    COMPLETED,
    ENDED,
    IN_PROGRESS,
    Attempt,
    Lease,
    State,
    Task,
    initial_states,
    slot_of,
)
from model.store import (
    FOREIGN,
    NO_REF,
    ROOT,
    Commit,
    MergeOutcome,
    add_commit,
    merge,
    merge_base,
    merge_slot,
    staged_slot,
)

Commits = tuple[Commit | None, ...]

AS_CODED = Config()
#: Without overlapping extensions (a quarter of the states): for the checks that do not
#: concern the final report's race with them.
QUIET = Config(extensions=0)
#: The code before df3d7a7: COMPLETED reported after the lease was released (finding F3).
UNGUARDED = Config(drops=frozenset({"guarded-report"}), extensions=0)

#: What each mechanism protects in the protocol as coded (None: defence in depth under the
#: modelled assumptions, explained by the report).
PROTECTS = {
    "fence1": None,
    "fence2": "I2a",
    "marker": None,
    "hook": None,
    "postcheck": "I5",
    "lease": "I4",
    "merge-guard": "I2b",
    "identity": "I3a",
    "tag": "I3b",
    "noop-peek": None,
    "guarded-report": None,
    "serial-report": "I6",
    "report-window": None,  # when a grant ends, not what is safe (reports under the lease)
    "window-wait": None,  # with re-deliveries: I4 (see its test)
    "report-again": None,  # spares a retry, not what is safe (FAILED at once holds too)
    "again-fence": None,  # with fresh fences, a second window without it opens closed
    "fresh-fence": None,  # with re-deliveries: I4 (see its test)
}

#: One re-delivery of a task id, the smallest configuration that shows finding F3.
REDELIVERY = Config(redeliveries=1, foreign="off", hooks=(False,), pinned=(True,), extensions=0)


def _invariants(cfg: Config) -> set[str]:
    return {v.invariant for v in explore(cfg).violations}


# -- the full check ----------------------------------------------------------------------------


def test_a_small_configuration_holds_and_reaches_every_step() -> None:
    """The protocol as coded, without overlapping extensions and with the hook installed: a
    twentieth of the default's states, every step of the code reached."""
    result = explore(replace(QUIET, hooks=(True,)))
    assert result.ok, [v.message for v in result.violations]
    assert result.states > 20_000
    assert steps_of(result) == STEPS - {"noop_peek", "noop_head"}


@pytest.mark.exhaustive
def test_the_protocol_as_coded_holds_and_every_step_is_reached() -> None:
    """The default configuration (``make model-check``): F1 is fixed in 261b23b."""
    result = explore(AS_CODED)
    assert result.ok, [v.message for v in result.violations]
    assert result.states > 40_000 and result.transitions > 190_000
    assert result.depth >= 25
    # guarded-report (df3d7a7): the no-op path always takes the lease, never reads it first.
    assert steps_of(result) == STEPS - {"noop_peek", "noop_head"}


def test_without_the_lease_read_a_no_op_retry_completes_under_a_late_merge() -> None:
    """Finding F1 (the code before 261b23b), and with no lease backend at all."""
    for drops, length in ((("noop-peek", "guarded-report"), 14), (("lease",), 13)):
        found = explore(replace(QUIET, drops=frozenset(drops)), stop_at_first=True).violations
        assert [(v.invariant, len(v.steps)) for v in found] == [("I4", length)]
        assert "output r0 from r0, but the branch also carries" in found[0].message


def test_without_the_guarded_report_the_lease_read_still_holds_without_redeliveries() -> None:
    """The code between 261b23b and df3d7a7: the no-op lease read closes F1."""
    result = explore(UNGUARDED)
    assert result.ok, [v.message for v in result.violations]
    assert steps_of(result) == STEPS


@pytest.mark.exhaustive
def test_a_redelivered_task_id_needs_the_guarded_report() -> None:
    """Finding F3, fixed in df3d7a7: a stale delivery's COMPLETED counts while the task id is
    live, unless COMPLETED is reported under the branch lease."""
    deterministic = replace(REDELIVERY, same_diff=True, noop=False)
    assert explore(deterministic).ok
    assert explore(REDELIVERY).ok
    # ...with report windows (as coded) as with the report under the lease (df3d7a7).
    under_lease = frozenset({"report-window"})
    assert explore(replace(REDELIVERY, drops=under_lease)).ok
    assert explore(replace(deterministic, drops=under_lease)).ok
    unguarded = replace(deterministic, drops=frozenset({"guarded-report"}))
    found = explore(unguarded, stop_at_first=True).violations
    assert [v.invariant for v in found] == ["I4"]
    assert "not on the branch's first-parent history" in found[0].message
    # The no-op shortcut (lease free, head the input ref) reports without the lease.
    unguarded = replace(REDELIVERY, drops=frozenset({"guarded-report"}))
    found = explore(unguarded, stop_at_first=True).violations
    assert [(v.invariant, len(v.steps)) for v in found] == [("I4", 14)]
    assert "output r0 from r0, but the branch also carries its publication M[t0p2]" in (
        found[0].message
    )


def test_report_windows_keep_f3_fixed_only_with_the_redelivery_wait() -> None:
    """Issue 41: an attempt leaves the lease before its COMPLETED report and sends it inside
    a window that opens only under its grant and soon after its attempt fence; a re-delivery
    waits out the earlier deliveries' windows and fences before it takes the lease. Without
    that wait, F3 is back (the stale no-op delivery's COMPLETED lands while the re-delivery
    publishes). Reporting under the lease instead (the code from df3d7a7) holds too:
    ``test_a_redelivered_task_id_needs_the_guarded_report``."""
    unwaited = replace(REDELIVERY, drops=frozenset({"window-wait"}))
    found = explore(unwaited, stop_at_first=True).violations
    assert [(v.invariant, len(v.steps)) for v in found] == [("I4", 16)]
    assert "output r0 from r0, but the branch also carries its publication M[t0p2]" in (
        found[0].message
    )


@pytest.mark.exhaustive
def test_report_windows_with_a_redelivery_hold_and_reach_every_report_step() -> None:
    """The whole re-delivery configuration as coded (two minutes on two cores; `make
    model-check` also runs the larger one of docs/model-check.md): every invariant holds,
    and the waits, second windows and stale fences are all reached."""
    result = explore(REDELIVERY)
    assert result.ok, [v.message for v in result.violations]
    assert {"window_wait", "noop_window_wait", "again_lease", "again_fence"} <= set(result.pcs)


# -- each mechanism ----------------------------------------------------------------------------


def test_an_extension_overlapping_the_report_undoes_the_completion_without_serial_updates() -> None:
    """Issue 14: the lost COMPLETED, as the real server shows it (test_report.py)."""
    found = explore(Config(drops=frozenset({"serial-report"})), stop_at_first=True).violations
    assert [(v.invariant, len(v.steps)) for v in found] == [("I6", 10)]
    assert "was COMPLETED and is IN_PROGRESS again" in found[0].message
    assert explore(replace(QUIET, drops=frozenset({"serial-report"}))).ok  # nothing overlaps


def test_a_redelivery_waiting_off_the_lease_needs_windows_that_open_only_after_fresh_fences() -> (
    None
):
    """The re-delivery's wait holds no lease (2026-11-29): it relies on every earlier
    delivery's window opening soon after a fence that passed before the re-delivery's poll.
    Without that (a window opens however old its fence), the earlier delivery's window may
    open after the wait, and its COMPLETED and the re-delivery's publication both stand
    (I4)."""
    stale = replace(REDELIVERY, drops=frozenset({"fresh-fence"}))
    found = explore(stale, stop_at_first=True).violations
    assert [v.invariant for v in found] == ["I4"]
    assert "output r0 from r0, but the branch also carries its publication M[t0p2]" in (
        found[0].message
    )


def test_a_second_report_window_without_its_fence_or_fresh_fences_shows_f3() -> None:
    """A reporter whose window closed takes the lease again for a second one and re-runs
    the attempt fence under it, which makes its fence fresh again. Without both that fence
    and fresh fences, I4 (F3)."""
    neither = replace(REDELIVERY, drops=frozenset({"again-fence", "fresh-fence"}))
    found = explore(neither, stop_at_first=True).violations
    assert [v.invariant for v in found] == ["I4"]


@pytest.mark.exhaustive
def test_a_second_report_window_without_its_fence_opens_closed_under_fresh_fences() -> None:
    """Without the fence before a second window, that window opens closed (its fence is
    stale) and the delivery reports FAILED: F3 stays fixed (until fresh fences, dropping
    it showed I4)."""
    unfenced = replace(REDELIVERY, drops=frozenset({"again-fence"}))
    assert explore(unfenced).ok
    assert "fresh" in why_no_counterexample(unfenced, "again-fence")


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_dropping_a_mechanism_breaks_what_it_protects(mechanism: str) -> None:
    base = AS_CODED if mechanism == "serial-report" else QUIET
    cfg = replace(base, drops=frozenset({mechanism}))
    expected = PROTECTS[mechanism]
    if expected is None:
        assert explore(cfg).ok
        assert (
            why_no_counterexample(cfg, mechanism) != "nothing in this configuration depends on it"
        )
    else:
        first = explore(cfg, stop_at_first=True).violations
        assert [v.invariant for v in first] == [expected]


def test_defence_in_depth_the_marker_protects_once_without_the_lease_or_merge_guard() -> None:
    for drops in ({"marker", "lease"}, {"marker", "merge-guard"}):
        assert "I1" in _invariants(replace(QUIET, drops=frozenset(drops)))


def test_a_foreign_commit_inside_a_reset_window_is_lost() -> None:
    """The documented limitation: lakeFS OSS has no compare-and-swap for a hard reset."""
    cfg = Config(foreign="anytime", pinned=(True,), hooks=(True,), extensions=0)
    assert _invariants(cfg) == {"I3a"}


# -- step semantics ----------------------------------------------------------------------------


def _start(cfg: Config = AS_CODED) -> State:
    return next(initial_states(cfg))


def _staged(commits: Commits, slot: int, *, marker: bool = True) -> Commits:
    ref = staged_slot(slot)
    return add_commit(
        commits,
        ref,
        (ROOT,),
        kind="staged",
        owner=slot,
        input_ref=ROOT,
        marker=slot if marker else NO_REF,
    )


def _parents(out: MergeOutcome) -> tuple[int, ...]:
    commit = out.commits[out.head]
    assert commit is not None
    return commit.parents


def _merge(commits: Commits, head: int, slot: int, *, hook: bool = False) -> MergeOutcome:
    return merge(
        commits,
        head,
        staged_slot(slot),
        merge_slot(slot),
        owner=slot,
        input_ref=ROOT,
        expected_head=ROOT,
        hook=hook,
    )


def test_merge_never_fast_forwards() -> None:
    commits = _staged(_start().commits, 0)
    out = _merge(commits, ROOT, 0)
    assert out.error == "" and out.head == merge_slot(0)
    assert _parents(out) == (ROOT, staged_slot(0))


def test_a_second_publication_from_one_input_ref_conflicts_on_the_marker() -> None:
    commits = _staged(_staged(_start().commits, 0), 1)
    first = _merge(commits, ROOT, 1)
    assert merge_base(first.commits, first.head, staged_slot(0)) == ROOT
    second = _merge(first.commits, first.head, 0)
    assert second.head == NO_REF and second.error.startswith("409")


def test_without_the_marker_the_second_publication_lands_on_the_first() -> None:
    commits = _staged(_staged(_start().commits, 0, marker=False), 1, marker=False)
    first = _merge(commits, ROOT, 1)
    second = _merge(first.commits, first.head, 0)
    assert _parents(second)[0] == merge_slot(1)


def test_the_hook_rejects_a_merge_onto_a_head_the_fence_did_not_see() -> None:
    commits = add_commit(
        _staged(_start().commits, 0), FOREIGN, (ROOT,), kind="foreign", marker=NO_REF
    )
    assert _merge(commits, FOREIGN, 0, hook=True).error.startswith("412")
    landed = _merge(commits, FOREIGN, 0, hook=False)
    assert _parents(landed)[0] == FOREIGN  # what the post-publish check sees


def test_a_lease_is_taken_over_only_after_it_ran_out() -> None:
    held = Lease(holder=0)
    assert lease.acquire(held, 1) is None
    expired = lease.expire(held)
    assert expired is not None and lease.guard(expired, 0) == "LeaseExpiringError"
    assert lease.renew(expired, 0) == Lease(0)  # nobody took it: renewing is fine
    taken = lease.acquire(expired, 1)
    assert taken == Lease(1)
    assert lease.guard(taken, 0) == "LeaseLostError" and lease.renew(taken, 0) is None
    assert lease.release(taken, 0) == taken  # releasing a lost lease changes nothing
    assert lease.delete(held) is None  # the janitor deletes only a run-out record
    assert lease.delete(expired) == Lease() and lease.renew(Lease(), 0) is None


def test_the_publish_fence_never_replaces_a_foreign_head_unless_identity_is_dropped() -> None:
    s = _start()
    commits = add_commit(s.commits, FOREIGN, (ROOT,), kind="foreign", marker=NO_REF)
    s = s._replace(commits=commits, head=FOREIGN)
    assert worker.decide(AS_CODED, s, 1, ROOT) == "refused"
    blind = Config(drops=frozenset({"identity"}))
    assert worker.decide(blind, s, 1, ROOT) == "REPLACE"


def test_an_earlier_attempts_publication_is_replaced_a_later_ones_is_not() -> None:
    s = _start()
    commits = _merge(_staged(s.commits, 0), ROOT, 0).commits
    s = s._replace(commits=commits, head=merge_slot(0))
    assert worker.decide(AS_CODED, s, 1, ROOT) == "REPLACE"
    assert worker.decide(AS_CODED, s, 0, ROOT) == "LANDED"


def test_conductor_takes_a_stale_deliverys_update_of_a_live_task_id() -> None:
    cfg = Config(redeliveries=1)
    s = conductor.poll(cfg, _start(cfg), 0)
    assert s is not None
    s = conductor.redeliver(cfg, s, 0)
    assert s is not None
    stale = slot_of(cfg, 0, 1)
    assert not conductor.is_current(cfg, s, stale)
    a = s.attempts[stale]
    assert a is not None
    done, effective = conductor.report(cfg, s, stale, a._replace(status=COMPLETED, ref=ROOT))
    assert effective and done.tasks[0].status == COMPLETED
    _, again = conductor.report(cfg, done, slot_of(cfg, 0, 2), a._replace(status=COMPLETED))
    assert not again  # terminal: ignored


def _at(cfg: Config, s: State, pc: str) -> State:
    """``s`` with t1 (pinned input, empty diff, past fence #1) at step ``pc``."""
    slot = slot_of(cfg, 1, 1)
    a = Attempt(pc, input_ref=ROOT, empty=True)
    return s._replace(attempts=(*s.attempts[:slot], a, *s.attempts[slot + 1 :]))


def _step(cfg: Config, s: State, slot: int) -> State:
    [(_, _, nxt, moved)] = worker.steps(cfg, s, slot)
    assert not moved
    return nxt


def _pc(s: State, slot: int) -> str:
    a = s.attempts[slot]
    assert a is not None
    return a.pc


def test_the_no_op_path_reads_the_lease_then_the_head_in_two_steps() -> None:
    """Without guarded-report (261b23b to df3d7a7); with it, fence #1 leads to the lease."""
    cfg, t1 = UNGUARDED, slot_of(UNGUARDED, 1, 1)
    s = _start(cfg)
    assert _pc(_step(cfg, _at(cfg, s, "noop_peek"), t1), t1) == "noop_head"
    held = s._replace(lease=Lease(0, expired=True))  # a dead holder's record: still held
    assert _pc(_step(cfg, _at(cfg, held, "noop_peek"), t1), t1) == "noop_lease"
    done = _step(cfg, _at(cfg, s, "noop_head"), t1)
    assert done.attempts[t1] == Attempt("report", ROOT, status=COMPLETED, ref=ROOT)
    assert done.lease == Lease()  # completed without ever taking the lease
    take = _step(cfg, _at(cfg, s._replace(head=FOREIGN), "noop_head"), t1)
    assert _pc(take, t1) == "noop_lease"
    got = _step(cfg, take, t1)
    assert _pc(got, t1) == "noop_fence" and got.lease == Lease(t1)
    # t1 current: fence #1 leads to the lease read, or (guarded-report) the acquisition.
    current = s._replace(tasks=(Task(ENDED, 1), Task(IN_PROGRESS, 1)))
    assert _pc(_step(cfg, _at(cfg, current, "fence1"), t1), t1) == "noop_peek"
    assert _pc(_step(AS_CODED, _at(AS_CODED, current, "fence1"), t1), t1) == "noop_lease"


def test_cli_exits_0_as_coded_and_1_with_a_trace_without_the_lease_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--pinned", "--no-hook", "--extensions", "0"]) == 0
    assert "no violation" in capsys.readouterr().out
    drops = ["--drop", "noop-peek", "--drop", "guarded-report"]
    assert main(["--pinned", "--no-hook", "--extensions", "0", *drops]) == 1
    out = capsys.readouterr().out
    assert "Counterexample to I4" in out and "reports COMPLETED with output r0" in out
    assert main(["--drop", "hook", "--no-traces", "--extensions", "0"]) == 0
    assert "defence in depth" in capsys.readouterr().out
