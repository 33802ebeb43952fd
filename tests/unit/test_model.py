"""The model check of the publication protocol (docs/model-check.md), and its step semantics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from model import FIXES, MECHANISMS, Config, conductor, explore, lease, worker
from model.__main__ import main
from model.report import STEPS, steps_of, why_no_counterexample
from model.state import COMPLETED, Lease, State, initial_states, slot_of
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
FIXED = Config(fixes=frozenset(FIXES))

#: What each mechanism protects in the protocol with the proposed fixes (None: defence in
#: depth under the modelled assumptions, explained by the report).
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
}


def _invariants(cfg: Config) -> set[str]:
    return {v.invariant for v in explore(cfg).violations}


# -- the full check ----------------------------------------------------------------------------


def test_protocol_as_coded_lets_a_no_op_retry_complete_under_a_late_merge() -> None:
    """Finding F1 (docs/model-check.md): the no-op decision is not taken under the lease."""
    result = explore(AS_CODED)
    assert [v.invariant for v in result.violations] == ["I4"]
    assert "output r0 from r0, but the branch also carries" in result.violations[0].message
    assert result.states > 20_000
    assert steps_of(result) == STEPS - {"noop_fence"}


def test_with_the_proposed_fixes_every_invariant_holds_and_every_step_is_reached() -> None:
    result = explore(FIXED)
    assert result.ok, [v.message for v in result.violations]
    assert result.states > 30_000 and result.transitions > 150_000
    assert result.depth >= 25
    assert steps_of(result) == STEPS


def test_a_redelivered_task_id_needs_the_guarded_report() -> None:
    small = Config(
        redeliveries=1, foreign="off", hooks=(False,), pinned=(True,), same_diff=True, noop=False
    )
    without = replace(small, fixes=frozenset(FIXES) - {"guarded-report"})
    found = explore(without, stop_at_first=True).violations
    assert [v.invariant for v in found] == ["I4"]
    assert "not on the branch's first-parent history" in found[0].message
    assert explore(replace(small, fixes=frozenset(FIXES))).ok


# -- each mechanism ----------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_dropping_a_mechanism_breaks_what_it_protects(mechanism: str) -> None:
    cfg = Config(fixes=frozenset(FIXES), drops=frozenset({mechanism}))
    expected = PROTECTS[mechanism]
    if expected is None:
        assert explore(cfg).ok
        assert (
            why_no_counterexample(cfg, mechanism) != "nothing in this configuration depends on it"
        )
    else:
        first = explore(cfg, stop_at_first=True).violations
        assert [v.invariant for v in first] == [expected]


def test_defence_in_depth_marker_and_lease_together_protect_once() -> None:
    cfg = Config(fixes=frozenset(FIXES), drops=frozenset({"marker", "lease"}))
    assert "I1" in _invariants(cfg)


def test_as_coded_both_fences_matter_and_the_marker_without_the_merge_guard() -> None:
    for drops, invariant in (
        ({"fence1"}, "I2a"),
        ({"fence2"}, "I2a"),
        ({"marker", "merge-guard"}, "I1"),
    ):
        assert invariant in _invariants(Config(drops=frozenset(drops)))


def test_a_foreign_commit_inside_a_reset_window_is_lost() -> None:
    """The documented limitation: lakeFS OSS has no compare-and-swap for a hard reset."""
    cfg = Config(fixes=frozenset(FIXES), foreign="anytime", pinned=(True,), hooks=(True,))
    assert _invariants(cfg) == {"I3a"}


# -- step semantics ----------------------------------------------------------------------------


def _start(cfg: Config = FIXED) -> State:
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


def test_the_publish_fence_never_replaces_a_foreign_head_unless_identity_is_dropped() -> None:
    s = _start()
    commits = add_commit(s.commits, FOREIGN, (ROOT,), kind="foreign", marker=NO_REF)
    s = s._replace(commits=commits, head=FOREIGN)
    assert worker.decide(FIXED, s, 1, ROOT) == "refused"
    blind = Config(drops=frozenset({"identity"}))
    assert worker.decide(blind, s, 1, ROOT) == "REPLACE"


def test_an_earlier_attempts_publication_is_replaced_a_later_ones_is_not() -> None:
    s = _start()
    commits = _merge(_staged(s.commits, 0), ROOT, 0).commits
    s = s._replace(commits=commits, head=merge_slot(0))
    assert worker.decide(FIXED, s, 1, ROOT) == "REPLACE"
    assert worker.decide(FIXED, s, 0, ROOT) == "LANDED"


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


def test_cli_exits_1_with_a_trace_as_coded_and_0_with_the_fixes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--pinned", "--no-hook"]) == 1
    out = capsys.readouterr().out
    assert "Counterexample to I4" in out and "reports COMPLETED with output r0" in out
    assert main(["--fix", "all", "--drop", "hook", "--no-traces"]) == 0
    assert "defence in depth" in capsys.readouterr().out
