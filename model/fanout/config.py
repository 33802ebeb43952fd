"""What one fan-out model-check run explores: the steps, their retries, what they read, and
which mechanisms are switched on (``--drop`` removes one to show what it protects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model.explore import Spec

__all__ = [
    "FOREIGN_MODES",
    "GROUP_MECHANISMS",
    "ISOLATION",
    "MECHANISMS",
    "STEPS",
    "FanoutConfig",
    "overlaps",
]

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
    "read-set": "a serializable step does not check, under the lease, that the folders it "
    "read are unchanged at the head it publishes over",
    "fresh-reads": "an unpinned attempt reads its inputs at its input ref, not at the head it "
    "starts from (the code before Fix F7): a retry whose input ref is an earlier attempt's "
    "reads the old input again",
    "group-scope": "group commit admits any publication into a group, whatever its scope and "
    "step (an overlapping writer or another attempt of a member's step shares the grant)",
    "turnstile": "group members read the head, decide and merge or reset without taking turns",
    "report-window": "COMPLETED is reported under the branch lease and the lease released "
    "after the report (the code from df3d7a7 until issue 41), instead of leaving the lease "
    "first and reporting inside a report window",
    "handoff-readback": "a group member hands the next member's turn the merge commit as it "
    "builds it (first parent: the head its fence saw) whenever the hook's file is in the "
    "tree, instead of the commit lakeFS made, read back and checked to sit on that head "
    "(the code before issue 38)",
}
#: Mechanisms of group commit: ``--drops`` checks them on configurations with ``group``.
GROUP_MECHANISMS = frozenset({"group-scope", "turnstile", "handoff-readback"})

FOREIGN_MODES = ("off", "outside-reset")
#: Isolation of a step's named inputs read from the target branch (issue 25).
ISOLATION = ("snapshot", "serializable")


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
    #: lakeFS runs the hook when its file is in the tree; False: the file is there but
    #: lakeFS runs no hooks (``actions.enabled: false``, a hook that fails to load).
    hooks_run: bool = True
    #: Every writer of a fork pins the fork's input ref r0 (the documented pattern); False:
    #: no step's input names a ref, so each attempt starts from the branch head (or from its
    #: earlier attempt's input ref, ``unpinned_input_ref``). Both: two initial states.
    pinned: tuple[bool, ...] = (True,)
    #: Bodies may produce an empty diff (the no-op path) as well as a non-empty one.
    noop: bool = True
    #: A worker may die after any step. Off by default: a crash is a pause that never ends,
    #: so every state after one is reachable with the attempt paused instead (its lease runs
    #: out by the clock, Conductor times the task out): crashes add no state an invariant
    #: could fail in, only states (``--crashes`` checks that on a smaller fork).
    crashes: bool = False
    drops: frozenset[str] = field(default_factory=frozenset)
    #: Named read-only inputs from the target branch: (step, folder) pairs. A step reads the
    #: folder at the pinned ref, or unpinned at the head its attempt starts from; the folder
    #: is disjoint from its own scope.
    reads: tuple[tuple[str, str], ...] = ()
    #: Isolation of those reads: ``snapshot`` (the publish fence guards the output scope
    #: only) or ``serializable`` (the read-set check at publish time).
    isolation: str = "snapshot"
    #: Group commit (``perago/publish/group_commit.py``): the attempts run in one worker
    #: process, and one that finds the lease held by a group it may join (disjoint from
    #: every member, another step) shares the grant instead of waiting.
    group: bool = False

    def __post_init__(self) -> None:
        unknown = self.drops - MECHANISMS.keys()
        if unknown:
            raise ValueError(f"unknown mechanism(s) {sorted(unknown)}; choose from {MECHANISMS}")
        if not self.steps or set(self.steps) - STEPS.keys() or set(self.retried) - STEPS.keys():
            raise ValueError(f"steps and retried name steps of {sorted(STEPS)}")
        if self.foreign not in FOREIGN_MODES:
            raise ValueError(f"foreign must be one of {FOREIGN_MODES}, not {self.foreign!r}")
        if self.retries < 0 or not self.hooks or not self.pinned:
            raise ValueError("retries must be >= 0, hooks and pinned non-empty")
        if self.isolation not in ISOLATION:
            raise ValueError(f"isolation must be one of {ISOLATION}, not {self.isolation!r}")
        for step, folder in self.reads:
            if step not in self.steps or overlaps(STEPS[step], folder):
                raise ValueError(f"{step} reads {folder!r}: name a step of the run, another folder")
        scopes = [self.scope(i) for i in range(len(self.steps))]
        if False in self.pinned and any(
            overlaps(a, b) for i, a in enumerate(scopes) for b in scopes[i + 1 :]
        ):
            # F3 and the scope markers stand for publications from one input ref (the code
            # keeps markers per input ref); unpinned overlapping writers are not modelled.
            raise ValueError("unpinned inputs are modelled for disjoint steps only")

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
    def report_window(self) -> bool:
        """A COMPLETED attempt leaves the lease, then reports inside its window (issue 41)."""
        return self.leases and self.has("report-window")

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

    def reads_of(self, step: int) -> tuple[str, ...]:
        """The folders step number ``step`` reads from the target branch."""
        return tuple(folder for name, folder in self.reads if name == self.steps[step])

    def checks_reads(self, step: int) -> bool:
        """Whether step number ``step``'s publications run the read-set check."""
        return self.isolation == "serializable" and bool(self.reads_of(step))

    def describe(self) -> str:
        hook = "off and on" if len(set(self.hooks)) > 1 else "on" if self.hooks[0] else "off"
        if not self.hooks_run:
            hook += " (its file only: lakeFS runs no hooks)"
        scopes = ", ".join(f"{n} {STEPS[n]}" for n in self.steps)
        pins = {True: "pinned to r0", False: "unpinned"}
        reads = [f"{n} reads {f}" for n, f in self.reads]
        return ", ".join(
            [
                f"steps {scopes}, inputs {' and '.join(pins[p] for p in self.pinned)}",
                *([f"{' and '.join(reads)} ({self.isolation})"] if reads else []),
                f"retries={self.retries} of {self.retried or 'none'}",
                f"foreign writer={self.foreign}",
                f"hook={hook}",
                f"no-op bodies={'yes' if self.noop else 'no'}",
                *(["group commit"] if self.group else []),
                f"drop={','.join(sorted(self.drops)) or 'nothing'}",
            ]
        )
