"""The fan-out model check (docs/model-check.md, "Fan-out"): small forks hold, and each
mechanism's drop shows the invariant it protects. The suite of ``make model-check`` is
larger; these runs take seconds."""

from __future__ import annotations

import pytest

from model.explore import explore
from model.fanout import FanoutConfig
from model.fanout.__main__ import main
from model.fanout.config import overlaps
from model.fanout.tree import ABSENT, INTENT, NO_REF, Commit, claim, revert, three_way

#: Two disjoint writers, A retried: the retry-under-a-sibling case, quick.
DISJOINT = FanoutConfig(steps="AB", retried="A", noop=False, foreign="off", hooks=(False,))
#: An overlapping pair: A (a/) and C (a/x/), A retried.
OVERLAPPING = FanoutConfig(steps="AC", retried="A", noop=False, foreign="off", hooks=(False,))
#: Group commit: the same pairs in one worker process, sharing lease grants.
GROUP_DISJOINT = FanoutConfig(**{**DISJOINT.__dict__, "group": True})
GROUP_OVERLAPPING = FanoutConfig(**{**OVERLAPPING.__dict__, "group": True, "noop": True})
#: The disjoint group with a foreign writer and no hook: what the head's handoff needs.
GROUP_FOREIGN = FanoutConfig(**{**GROUP_DISJOINT.__dict__, "foreign": "outside-reset"})
#: The hook's file in the tree, but lakeFS runs no hooks (``actions.enabled: false``).
GROUP_HOOK_NOT_RUN = FanoutConfig(
    **{**GROUP_FOREIGN.__dict__, "hooks": (True,), "hooks_run": False}
)


def _violated(cfg: FanoutConfig, *drops: str) -> set[str]:
    return {
        v.invariant
        for v in explore(FanoutConfig(**{**cfg.__dict__, "drops": frozenset(drops)})).violations
    }


def test_a_disjoint_fork_as_coded_holds_and_the_retry_reaches_the_scoped_replacement() -> None:
    result = explore(DISJOINT)
    assert result.ok, [v.message for v in result.violations]
    assert result.states > 20_000 and result.terminal > 0
    assert {"scoped", "merge", "reset", "tag"} <= result.pcs


def test_reporting_under_the_lease_instead_of_in_a_window_holds_too() -> None:
    """Issue 41: leaving the lease before the report (a window the clock may close, then
    FAILED and a retry) is as safe as the code from df3d7a7 that reported under the lease."""
    result = explore(FanoutConfig(**{**DISJOINT.__dict__, "drops": frozenset({"report-window"})}))
    assert result.ok, [v.message for v in result.violations]


def test_an_overlapping_fork_as_coded_holds() -> None:
    result = explore(OVERLAPPING)
    assert result.ok, [v.message for v in result.violations]
    assert result.states > 20_000 and result.terminal > 0


@pytest.mark.exhaustive
def test_group_commit_as_coded_holds() -> None:
    """(That members do join is shown by the group's drops below: their traces join.) In
    `make model-check`, beside the larger runs of `python -m model.fanout`'s suite."""
    for cfg in (GROUP_DISJOINT, GROUP_OVERLAPPING):
        result = explore(cfg)
        assert result.ok, [v.message for v in result.violations]
        assert result.terminal > 0 and {"reset", "merge", "verify"} <= result.pcs
    # With the hook the members hand the head on; a foreign commit meanwhile makes the next
    # member's merge refused and fenced again (``refence``).
    result = explore(FanoutConfig(**{**GROUP_FOREIGN.__dict__, "hooks": (True,)}))
    assert result.ok, [v.message for v in result.violations]
    assert {"refence", "merge", "reset"} <= result.pcs


@pytest.mark.exhaustive
@pytest.mark.parametrize("cfg", [GROUP_FOREIGN, GROUP_HOOK_NOT_RUN], ids=["no-hook", "not-run"])
def test_group_commit_hands_the_head_on_safely_without_a_hook(cfg: FanoutConfig) -> None:
    """The head is handed on from the merge commit read back, hook or not (594k states)."""
    result = explore(cfg)
    assert result.ok, [v.message for v in result.violations]
    assert {"merge", "reset"} <= result.pcs


@pytest.mark.parametrize(
    ("cfg", "drops", "invariant"),
    [
        # Group commit: a head handed on as the member built it, because the hook's file is
        # in the tree, from a merge that lakeFS ran no hook for (it landed on a foreign
        # commit the member does not know of): the next member completes over it.
        (GROUP_HOOK_NOT_RUN, ("handoff-readback",), "F6"),
        # Group commit: without turns, a member's hard reset drops a sibling member's merge.
        pytest.param(  # ~30 s of search: in make model-check
            GROUP_DISJOINT, ("turnstile",), "F5", marks=pytest.mark.exhaustive
        ),
        # Admitting another attempt of a member's step: a no-op retry completes on r0 while
        # its timed-out first attempt, sharing the grant, merges after it.
        (GROUP_OVERLAPPING, ("group-scope",), "F2"),
        # Without the branch lease a retry's hard reset drops a sibling's publication.
        (DISJOINT, ("lease",), "F5"),
        # A lease per scope is no better: the reset and the sibling's merge do not meet.
        (DISJOINT, ("branch-lease",), "F5"),
        # Without scoped replacement the markers still refuse the retry's merge beside its
        # earlier publication (same scope, different claims); without both, two are in effect.
        (DISJOINT, ("scoped-replace", "marker"), "F1"),
        # Overlapping scopes: the history fence refuses; the markers refuse too; without both,
        # a lost update.
        (OVERLAPPING, ("scope-fence", "marker"), "F3"),
    ],
)
def test_dropping_a_mechanism_shows_what_it_protects(
    cfg: FanoutConfig, drops: tuple[str, ...], invariant: str
) -> None:
    dropped = FanoutConfig(**{**cfg.__dict__, "drops": frozenset(drops)})
    found = explore(dropped, stop_at_first=True).violations
    assert [v.invariant for v in found] == [invariant]


@pytest.mark.exhaustive
@pytest.mark.parametrize("drop", ["scoped-replace", "scope-fence"])
def test_the_markers_back_up_the_fence(drop: str) -> None:
    """Defence in depth: each of these alone leaves every invariant intact."""
    assert not _violated(DISJOINT if drop == "scoped-replace" else OVERLAPPING, drop)


def test_scopes_overlap_by_path_segments() -> None:
    assert overlaps("a/", "a/x/") and overlaps("a/x/", "a/")
    assert not overlaps("a/", "b/") and not overlaps("a/", "ab/")


def test_three_way_merge_conflicts_only_on_different_marker_changes() -> None:
    base = ((ABSENT, ABSENT, ABSENT), 0)
    a = ((INTENT, claim(0), ABSENT), 0b01)  # step of a/ : root intent, own claim
    b = ((INTENT, ABSENT, claim(1)), 0b10)  # step of b/
    assert three_way(base, a, b) == ((INTENT, claim(0), claim(1)), 0b11)
    again = ((INTENT, claim(2), ABSENT), 0b100)  # another attempt claiming a/
    assert three_way(base, a, again) is None


def test_revert_undoes_exactly_the_commits_change() -> None:
    parent = Commit((), "root", NO_REF, (ABSENT, ABSENT), 0, 0, 1, 1)
    published = Commit((0,), "merge", 0, (INTENT, claim(0)), 0b1, 0, 3, 3)
    sibling_on_top = ((INTENT, claim(0)), 0b11)  # a sibling's data (bit 1) on top
    assert revert(sibling_on_top, published, parent) == ((ABSENT, ABSENT), 0b10)
    assert revert(((INTENT, claim(5)), 0b1), published, parent) is None  # claim changed since


@pytest.mark.exhaustive
def test_the_cli_runs_one_configuration_and_exits_1_on_a_violation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--steps", "AB", "--no-noop", "--no-foreign", "--no-traces"]
    assert main(args) == 0
    assert main([*args, "--drop", "lease"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATED" in out and "only with the drop" in out
    with pytest.raises(SystemExit, match="unknown mechanism"):
        main(["--drop", "nope"])
