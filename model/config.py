"""What one model-check run explores: the actors' bounds and which mechanisms are switched on.

A mechanism named in ``drops`` is removed from the protocol, so a run can show what that
mechanism protects (a counterexample), or that nothing in the model depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model.explore import Spec

__all__ = ["FIXES", "FOREIGN_MODES", "MECHANISMS", "Config"]

#: Every mechanism ``--drop`` can remove, with what removing it means in the model.
MECHANISMS: dict[str, str] = {
    "fence1": "attempt fence #1 always passes (a stale attempt reaches staging or the no-op path)",
    "fence2": "attempt fence #2 always passes (a stale attempt reaches the publish fence)",
    "marker": "staged commits do not rewrite the publication marker (no 3-way conflict)",
    "hook": "the expected-head pre-merge hook is never installed",
    "postcheck": "no check of the merge commit's first parent after the merge",
    "lease": "no branch lease (PERAGO_COORD_BACKEND=none): no re-read, renew or re-check",
    "merge-guard": "the merge is not a guarded write (the code before 8814d5d): the lease is "
    "held but neither refreshed nor checked around the merge",
    "identity": "commit metadata is ignored: a head whose parent is the input ref counts as "
    "an abandoned publication, an unpinned retry pins the head",
    "tag": "a replaced head is not tagged before the hard reset",
    "noop-peek": "the no-op path decides on the head without reading the branch lease first "
    "and takes the lease only to relocate (the code before 261b23b: finding F1)",
    "guarded-report": "COMPLETED is not reported under the branch lease (the code before "
    "df3d7a7): the lease is released before the report, and the no-op path completes without "
    "it when it reads the lease free and the head unchanged (finding F3 with --redelivery)",
    "report-window": "COMPLETED is reported under the branch lease and the lease released after "
    "the report (the code from df3d7a7 until issue 41): an attempt does not leave the lease "
    "before its report, and a grant ends at its members' last report",
    "window-wait": "a re-delivered attempt (poll count > 1) does not wait, before taking the "
    "branch lease, until every earlier delivery's report window of its task id has closed",
    "fresh-fence": "a report window opens however long ago the delivery's attempt fence "
    "passed, where as coded it opens only within FENCE_FRESH_SECONDS of that fence (closed "
    "at once otherwise: the second window's lease and fence follow); a re-delivery's wait "
    "then leaves windows that open after it (modelled with --redelivery only)",
    "report-again": "a COMPLETED whose report window closed is reported FAILED at once (the "
    "code from issue 41 until 2026-11-28), where as coded the delivery takes the branch lease "
    "again, re-runs the attempt fence under it and reports in a second window",
    "again-fence": "a delivery reporting again after its window closed does not re-run the "
    "attempt fence under the lease it took again",
    "serial-report": "the final report does not wait for a response-timeout extension in "
    "flight (the code before dcbbee2): Conductor's unlocked read-modify-write lets the "
    "extension write IN_PROGRESS back over an accepted COMPLETED (issue 14)",
}

#: Changes to the protocol proposed before they are coded (docs/model-check.md): guarded-report
#: (F3) was one until df3d7a7, report-window until issue 41 (mechanisms now). None is open.
FIXES: dict[str, str] = {}

#: How the foreign writer (not Perago) may commit to the target branch.
FOREIGN_MODES = ("off", "outside-reset", "anytime")


@dataclass(frozen=True)
class Config:
    """Bounds and switches of one exhaustive exploration."""

    #: Conductor retries of the step: ``retries + 1`` task ids (retry counts 0..retries).
    retries: int = 1
    #: Re-deliveries of an IN_PROGRESS task id to another worker (poll count + 1).
    redeliveries: int = 0
    #: Response-timeout extensions whose update may overlap another update of the task (the
    #: server reads the task, then writes it back: an update landing in between is undone).
    extensions: int = 1
    #: ``outside-reset``: one foreign commit at any moment except inside a reset window
    #: (after the head was validated for a hard reset and before the reset): the documented
    #: operating assumption, since lakeFS OSS cannot detect such a commit at all.
    foreign: str = "outside-reset"
    #: Initial states: expected-head hook installed or not (both by default).
    hooks: tuple[bool, ...] = (False, True)
    #: Initial states: workspace input with an explicit ref, or unpinned (both by default).
    pinned: tuple[bool, ...] = (True, False)
    #: Bodies may produce an empty diff (the no-op path) as well as a non-empty one.
    noop: bool = True
    #: Every attempt of the step produces the same kind of diff (deterministic body).
    same_diff: bool = False
    #: I1 without "per input ref": at most one publication of the step at all.
    once_per_step: bool = False
    drops: frozenset[str] = field(default_factory=frozenset)
    #: Proposed changes (``FIXES``) applied on top of the protocol as coded.
    fixes: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        unknown = self.drops - MECHANISMS.keys()
        if unknown:
            raise ValueError(f"unknown mechanism(s) {sorted(unknown)}; choose from {MECHANISMS}")
        if self.fixes - FIXES.keys():
            raise ValueError(f"unknown fix(es) {sorted(self.fixes - FIXES.keys())}")
        if self.foreign not in FOREIGN_MODES:
            raise ValueError(f"foreign must be one of {FOREIGN_MODES}, not {self.foreign!r}")
        if min(self.retries, self.redeliveries, self.extensions) < 0:
            raise ValueError("retries, redeliveries and extensions must be >= 0")
        if not self.hooks or not self.pinned:
            raise ValueError("retries and redeliveries must be >= 0; hooks and pinned non-empty")

    def spec(self) -> Spec:
        """The serial step's model, for the explorer."""
        from model import actions, invariants, state  # they import this module
        from model.explore import Spec

        return Spec(
            state.initial_states,
            actions.successors,
            actions.terminal,
            invariants.check_state,
            invariants.check_transition,
        )

    def has(self, mechanism: str) -> bool:
        """True unless ``mechanism`` was dropped."""
        return mechanism not in self.drops

    def fixed(self, fix: str) -> bool:
        """True if the proposed change ``fix`` is applied."""
        return fix in self.fixes

    @property
    def leases(self) -> bool:
        return self.has("lease")

    @property
    def guarded_report(self) -> bool:
        """COMPLETED reported under the branch lease (needs a lease to guard it with)."""
        return self.leases and self.has("guarded-report")

    @property
    def report_window(self) -> bool:
        """COMPLETED reported in a window after leaving the lease (issue 41), not under it."""
        return self.guarded_report and self.has("report-window")

    @property
    def fresh_fences(self) -> bool:
        """A report window opens only while the delivery's last attempt fence is fresh (the
        code's ``FENCE_FRESH_SECONDS``). Only a re-delivery's wait depends on it: without
        re-deliveries a stale fence only closes a window that a fence read would reopen, so
        the smaller runs leave the clock steps it needs out."""
        return self.report_window and self.has("fresh-fence") and self.redeliveries > 0

    @property
    def tasks(self) -> int:
        return self.retries + 1

    @property
    def polls(self) -> int:
        """Deliveries one task id can have."""
        return self.redeliveries + 1

    @property
    def slots(self) -> int:
        """Every attempt (task id x delivery) the run may create."""
        return self.tasks * self.polls

    def describe(self) -> str:
        hook = "off and on" if len(set(self.hooks)) > 1 else "on" if self.hooks[0] else "off"
        pin = "pinned" if self.pinned == (True,) else "unpinned" if self.pinned == (False,) else ""
        pin = pin or "pinned and unpinned"
        parts = [
            f"{self.tasks} task ids (retries={self.retries})",
            f"re-deliveries={self.redeliveries}",
            f"overlapping extensions={self.extensions}",
            f"foreign writer={self.foreign}",
            f"hook={hook}",
            f"input ref={pin}",
            f"no-op bodies={'yes' if self.noop else 'no'}",
        ]
        if self.same_diff:
            parts.append("deterministic diff")
        if self.once_per_step:
            parts.append("I1 once per step")
        parts.append(f"drop={','.join(sorted(self.drops)) or 'nothing'}")
        parts.append(f"fixes={','.join(sorted(self.fixes)) or 'none (as coded)'}")
        return ", ".join(parts)
