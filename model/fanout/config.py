"""What one fan-out model-check run explores: the steps, their retries, and which
mechanisms are switched on (``--drop`` removes one to show what it protects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model.explore import Spec

__all__ = ["FOREIGN_MODES", "MECHANISMS", "STEPS", "FanoutConfig", "overlaps"]

#: The writing steps of the fork: name -> scope (their rendered prefixes).
STEPS: dict[str, str] = {"A": "a/", "B": "b/", "C": "a/x/"}

MECHANISMS: dict[str, str] = {
    "fence1": "attempt fence #1 always passes",
    "fence2": "attempt fence #2 always passes",
    "marker": "staged commits write no scope markers (no 3-way conflict between overlapping "
    "publications from one input ref)",
    "hook": "the expected-head pre-merge hook is never installed",
    "postcheck": "no check of the merge commit's first parent after the merge",
    "lease": "no branch lease (PERAGO_COORD_BACKEND=none)",
    "branch-lease": "one lease per scope instead of one per branch (siblings never wait for "
    "each other)",
    "scope-fence": "the publish fence takes any Perago publication of another step under the "
    "head as a sibling, without comparing scopes",
    "scoped-replace": "a retry under sibling publications takes its earlier attempt's "
    "publication for a sibling's and merges beside it (no revert)",
    "tag": "a replaced head is not tagged before the hard reset",
}

FOREIGN_MODES = ("off", "outside-reset")


def overlaps(a: str, b: str) -> bool:
    """``perago.publish.scope.overlaps`` for the model's scopes."""
    sa, sb = a.strip("/").split("/"), b.strip("/").split("/")
    n = min(len(sa), len(sb))
    return sa[:n] == sb[:n]


@dataclass(frozen=True)
class FanoutConfig:
    """Bounds and switches of one exhaustive exploration of a fork."""

    #: Which steps of ``STEPS`` run in the fork.
    steps: str = "ABC"
    #: Conductor retries of each step in ``retried`` (the others run one task id).
    retries: int = 1
    retried: str = "ABC"
    #: ``outside-reset``: one foreign commit at any moment except inside a reset window.
    foreign: str = "outside-reset"
    hooks: tuple[bool, ...] = (False, True)
    #: Every writer of a fork pins the fork's input ref r0 (the documented pattern).
    pinned: tuple[bool, ...] = (True,)
    #: Bodies may produce an empty diff (the no-op path) as well as a non-empty one.
    noop: bool = True
    #: A worker may die after any step. Off by default: a crash is a pause that never ends,
    #: so every state after one is reachable with the attempt paused instead (its lease runs
    #: out by the clock, Conductor times the task out): crashes add no state an invariant
    #: could fail in, only states (``--crashes`` checks that on a smaller fork).
    crashes: bool = False
    drops: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        unknown = self.drops - MECHANISMS.keys()
        if unknown:
            raise ValueError(f"unknown mechanism(s) {sorted(unknown)}; choose from {MECHANISMS}")
        if not self.steps or set(self.steps) - STEPS.keys() or set(self.retried) - STEPS.keys():
            raise ValueError(f"steps and retried name steps of {sorted(STEPS)}")
        if self.foreign not in FOREIGN_MODES:
            raise ValueError(f"foreign must be one of {FOREIGN_MODES}, not {self.foreign!r}")
        if self.retries < 0 or not self.hooks:
            raise ValueError("retries must be >= 0 and hooks non-empty")

    def spec(self) -> Spec:
        from model.explore import Spec
        from model.fanout import actions, invariants, state

        return Spec(
            state.initial_states,
            actions.successors,
            actions.terminal,
            invariants.check_state,
            invariants.check_transition,
        )

    def has(self, mechanism: str) -> bool:
        return mechanism not in self.drops

    @property
    def leases(self) -> bool:
        return self.has("lease")

    def tasks_of(self, step: int) -> int:
        """Task ids (retry counts 0..) step number ``step`` may get."""
        return self.retries + 1 if self.steps[step] in self.retried else 1

    @property
    def max_tasks(self) -> int:
        return max(self.tasks_of(i) for i in range(len(self.steps)))

    @property
    def slots(self) -> int:
        """Attempt slots: ``step * max_tasks + retry`` (one delivery per task id)."""
        return len(self.steps) * self.max_tasks

    def scope(self, step: int) -> str:
        return STEPS[self.steps[step]]

    def lease_key(self, step: int) -> int:
        """Which lease a step's attempts take: the branch's, or its scope's own."""
        return 0 if self.has("branch-lease") else step

    @property
    def lease_keys(self) -> int:
        return 1 if self.has("branch-lease") else len(self.steps)

    def describe(self) -> str:
        hook = "off and on" if len(set(self.hooks)) > 1 else "on" if self.hooks[0] else "off"
        scopes = ", ".join(f"{n} {STEPS[n]}" for n in self.steps)
        return ", ".join(
            [
                f"steps {scopes} from one input ref",
                f"retries={self.retries} of {self.retried or 'none'}",
                f"foreign writer={self.foreign}",
                f"hook={hook}",
                f"no-op bodies={'yes' if self.noop else 'no'}",
                f"drop={','.join(sorted(self.drops)) or 'nothing'}",
            ]
        )
