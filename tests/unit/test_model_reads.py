"""Reads and isolation in the fan-out model (docs/model-check.md, "Reads and isolation"): B
reads a/, which its sibling A publishes. Both isolations hold as coded, and without the
read-set check a serializable B publishes over a/ changed since it read it (R1). An
unpinned attempt reads at the head it starts from (Fix F7): reading at its input ref instead
(``--drop fresh-reads``) refuses a retry after a lost report forever (R2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from model.explore import explore
from model.fanout import FanoutConfig, actions, reads
from model.fanout.state import COMPLETED, ENDED, NONE, SCHEDULED, State
from model.fanout.tree import ROOT, merge_slot
from model.reads import reading
from model.reads.__main__ import main

#: No retries: each step's first attempt, pinned and unpinned (about 8,000 states each).
SMALL = {"retries": 0}


def _walk(
    cfg: FanoutConfig, s: State, *moves: tuple[str, str], violates: str = ""
) -> tuple[State, list[str]]:
    """Take the first enabled step of each (actor, label fragment) in turn; the labels. Every
    invariant holds on the way, but ``violates``, which some step must break."""
    spec, labels, broken = cfg.spec(), [], set()
    for actor, fragment in moves:
        found = [
            tr
            for tr in actions.successors(cfg, s)
            if actions.actor_name(cfg, tr[0]) == actor and fragment in tr[1]
        ]
        assert found, f"{actor} cannot take {fragment!r} here"
        for bad in (spec.check_transition(cfg, s, found[0]), spec.check_state(cfg, found[0][2])):
            broken |= {bad[0]} if bad else set()
        labels.append(found[0][1])
        s = found[0][2]
    assert broken == ({violates} if violates else set()), broken
    return s, labels


def _initial(cfg: FanoutConfig) -> State:
    return next(iter(cfg.spec().initial_states(cfg)))


#: A0 publishes a/ and reports while B0, polled first, holds a/ as of r0.
A0_PUBLISHES = (
    ("Conductor", "polls B0"),
    ("Conductor", "polls A0"),
    ("A0", "fence #1"),
    ("A0", "stages"),
    ("A0", "fence #2"),
    ("A0", "publish fence"),
    ("A0", "refreshes"),
    ("A0", "merges"),
    ("A0", "re-checks"),
    ("A0", "releases"),  # its report window opens (issue 41)
    ("A0", "reports COMPLETED"),
)
B0_TO_THE_FENCE = (
    ("B0", "fence #1"),
    ("B0", "stages"),
    ("B0", "fence #2"),
    ("B0", "publish fence"),
    ("B0", "releases"),
    ("B0", "reports"),
)
#: Unpinned: B0 publishes M[B0] and times out before its report (lost); A0 publishes on it.
B0_PUBLISHES_A0_CHANGES_ITS_INPUT = (
    ("Conductor", "polls B0"),
    ("B0", "no ref"),
    *B0_TO_THE_FENCE[:4],
    ("B0", "refreshes"),
    ("B0", "merges"),
    ("Conductor", "B0 times out"),
    ("B0", "re-checks"),
    ("B0", "releases"),
    ("B0", "reports COMPLETED"),
    A0_PUBLISHES[1],
    ("A0", "no ref"),
    *A0_PUBLISHES[2:],
)


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_a_reader_beside_the_writer_of_its_input_holds_as_coded(isolation: str) -> None:
    result = explore(reading(isolation, **SMALL))
    assert result.ok, [v.message for v in result.violations]
    assert result.states > 7_000 and result.terminal > 0
    assert {"start", "merge"} <= result.pcs


def test_without_the_read_set_check_a_serializable_reader_publishes_over_a_changed_input() -> None:
    cfg = reading("serializable", drops=frozenset({"read-set"}), **SMALL)
    found = explore(cfg, stop_at_first=True).violations
    assert [v.invariant for v in found] == ["R1"]
    assert "B0 read a/ at r0, but its merge lands on M[A0]" in found[0].message


def test_a_refused_unpinned_reader_retries_from_the_new_head_and_publishes() -> None:
    cfg = reading("serializable", retried="B", pinned=(False,))
    s, _ = _walk(cfg, next(iter(cfg.spec().initial_states(cfg))), ("Conductor", "polls B0"))
    a0 = (A0_PUBLISHES[1], ("A0", "no ref"), *A0_PUBLISHES[2:])
    s, labels = _walk(cfg, s, ("B0", "no ref"), *a0, *B0_TO_THE_FENCE)
    assert "the head r0 is its input ref; reads a/ there" in labels[0]
    assert "read-set check: a/ changed between r0 and the head M[A0]" in labels[-3]
    assert labels[-3].endswith("retryable") and s.tasks[3].status == SCHEDULED  # B1
    m_a0 = merge_slot(0)
    s, labels = _walk(
        cfg,
        s,
        ("Conductor", "polls B1"),
        ("B1", "no ref"),
        ("B1", "fence #1"),
        ("B1", "stages"),
        ("B1", "fence #2"),
        ("B1", "publish fence"),
        ("B1", "refreshes"),
        ("B1", "merges"),
    )
    assert s.attempts[3] is not None and s.attempts[3].input_ref == m_a0
    assert labels[5] == "publish fence: head M[A0] -> first publication"  # read at M[A0]


def test_a_refused_pinned_reader_fails_terminally() -> None:
    cfg = reading("serializable", retried="B", pinned=(True,))
    s, labels = _walk(cfg, next(iter(cfg.spec().initial_states(cfg))), *A0_PUBLISHES)
    s, labels = _walk(cfg, s, *B0_TO_THE_FENCE)
    assert labels[3].endswith("terminal (pinned input)")
    assert "FAILED_WITH_TERMINAL_ERROR" in labels[-1]
    assert s.tasks[2].status == ENDED and s.tasks[3].status == NONE  # B0 over, no B1
    assert s.attempts[2] is not None and s.attempts[2].input_ref == ROOT


def test_a_snapshot_reader_publishes_beside_the_writer_of_its_input() -> None:
    cfg = reading("snapshot", pinned=(True,), **SMALL)
    s, _ = _walk(cfg, next(iter(cfg.spec().initial_states(cfg))), *A0_PUBLISHES)
    s, labels = _walk(cfg, s, *B0_TO_THE_FENCE[:4], ("B0", "refreshes"), ("B0", "merges"))
    assert "disjoint publication" in labels[3] and "read-set" not in labels[3]


def test_finding_f7_fixed_a_retry_after_a_lost_report_reads_the_new_input_and_publishes() -> None:
    """F7, fixed (docs/model-check.md): B0 published, then timed out; A changed a/. B1's
    workspace starts from B0's input ref r0 (``unpinned_input_ref``, to replace M[B0]), but
    it reads a/ at the head it started from, M[A0]: the read-set check passes and its scoped
    replacement publishes B1 beside A0's a/, every invariant holding on the way."""
    cfg = reading("serializable", retried="B", pinned=(False,))
    s, _ = _walk(cfg, _initial(cfg), *B0_PUBLISHES_A0_CHANGES_ITS_INPUT)
    s, labels = _walk(
        cfg,
        s,
        ("Conductor", "polls B1"),
        ("B1", "no ref"),
        *[("B1", fragment) for _, fragment in B0_TO_THE_FENCE[:4]],
        ("B1", "scoped replacement"),
        ("B1", "refreshes"),
        ("B1", "merges"),
        ("B1", "re-checks"),
        ("B1", "releases"),
        ("B1", "reports COMPLETED"),
    )
    assert labels[1].endswith(
        "M[B0] is an earlier attempt's, its input ref r0 is this one's; reads a/ at the head M[A0]"
    )
    assert labels[5] == "publish fence: head M[A0] -> scoped replacement"  # no read-set refusal
    assert "reverts M[B0], merges S[B1]" in labels[6]
    assert labels[8] == "merges P[B1] onto M[A0]: head M[B1]"
    a0, b1 = 0, 3
    assert s.tasks[b1].status == COMPLETED and s.tasks[b1].output == merge_slot(b1)
    assert s.commits[s.head].data == 1 << a0 | 1 << b1  # type: ignore[union-attr]
    assert reads.content(cfg, s, s.head, "a/") == 1 << a0  # what B1 read


def test_reading_at_the_input_ref_brings_f7_back() -> None:
    """F7 as it was before the fix (``--drop fresh-reads``): every retry of B reads a/ at B0's
    input ref r0 and is refused, retryable, although no retry can pass while A's change
    stays: R2 breaks at each refusal, and the step fails once its retries run out."""
    drops = frozenset({"fresh-reads"})
    cfg = reading("serializable", retried="B", retries=2, pinned=(False,), drops=drops)
    s, _ = _walk(cfg, _initial(cfg), *B0_PUBLISHES_A0_CHANGES_ITS_INPUT)
    for retry in ("B1", "B2"):
        s, labels = _walk(
            cfg,
            s,
            ("Conductor", f"polls {retry}"),
            (retry, "no ref"),
            *[(retry, fragment) for _, fragment in B0_TO_THE_FENCE[:4]],
            violates="R2",
        )
        assert labels[1].endswith(
            "M[B0] is an earlier attempt's, its input ref r0 is this one's; reads a/ there"
        )
        assert labels[-1].endswith(
            "changed between r0 and the head M[A0] (by M[A0]): PublishFenceError, retryable"
        )
        s, _ = _walk(cfg, s, (retry, "releases"), (retry, "reports FAILED"))
    assert s.tasks[5].status == ENDED  # B2, the last retry: the step failed


def test_the_checker_finds_f7_when_a_retry_reads_at_its_input_ref() -> None:
    """The shortest R2 trace (25 steps, about 82,000 states): B1 starts on M[B0] before A0
    publishes, so it is rightly refused; but a retry after it would read a/ at r0 again."""
    drops = frozenset({"fresh-reads"})
    cfg = reading("serializable", retried="B", pinned=(False,), drops=drops)
    found = explore(cfg, stop_at_first=True).violations
    assert [(v.invariant, len(v.steps)) for v in found] == [("R2", 25)]
    assert found[0].message == (
        "B1 is refused (a/ changed by M[A0]), retryable, but a retry starting on the head "
        "M[A0] would read a/ at r0 again"
    )


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("isolation", "retried"),
    # Under snapshot isolation the reads change nothing, so B retried is A retried mirrored.
    [("snapshot", "A"), ("serializable", "A"), ("serializable", "B")],
)
def test_retries_of_the_writer_or_the_reader_hold(isolation: str, retried: str) -> None:
    result = explore(reading(isolation, retried=retried))
    assert result.ok, [v.message for v in result.violations]
    assert result.states > 200_000
    # B retried: a reader's scoped replacement under A's publication passes (F7 fixed).
    assert "scoped" in result.pcs


@pytest.mark.exhaustive
def test_the_cli_exits_1_without_the_read_set_check(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--isolation", "serializable", "--no-traces"]
    assert main(args) == 0
    assert main([*args, "--drop", "read-set"]) == 1
    out = capsys.readouterr().out
    assert "R1       VIOLATED" in out and "only with the drop" in out
    f7 = ["--isolation", "serializable", "--retried", "B", "--unpinned", "--no-traces"]
    assert main([*f7, "--drop", "fresh-reads"]) == 1
    out = capsys.readouterr().out
    assert "R2       VIOLATED (25 steps) only with the drop" in out


def test_isolation_and_reads_are_validated() -> None:
    with pytest.raises(ValueError, match="isolation"):
        reading("read-committed")
    with pytest.raises(ValueError, match="another folder"):
        replace(reading("snapshot"), reads=(("B", "b/"),))
    with pytest.raises(ValueError, match="disjoint steps only"):
        reading("snapshot", steps="AC", reads=(("C", "b/"),))
