"""Breadth-first exhaustive exploration with a visited set of state fingerprints.

Breadth first, so the first violation found has a shortest trace. Like TLC, the visited set
keeps 64-bit fingerprints (Python's tuple hash of the canonical state), not the states:
memory stays near 150 bytes per state, frontier included. Two distinct states sharing a
fingerprint would hide one of them; the chance is at most n^2 / 2^64 for n states, reported
with the figures.
A trace is rebuilt by replaying the recorded parent fingerprints from an initial state.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple

__all__ = ["Counterexample", "Result", "Spec", "Step", "explore", "explore_parallel"]

State = Any  # a model's global state: a hashable NamedTuple with ``attempts``
#: A configuration (``model.config.Config``, ``model.fanout.FanoutConfig``) is a frozen
#: dataclass with ``spec()``, ``has(mechanism)``, ``hooks`` and ``pinned``.


class Spec(NamedTuple):
    """What the explorer needs from a model: the serial step's (``model``) or a fan-out's
    (``model.fanout``). Each configuration class names its spec (``Config.spec()``)."""

    initial_states: Callable[[Any], Iterator[Any]]
    successors: Callable[[Any, Any], list[tuple[int, str, Any, bool]]]
    terminal: Callable[[Any], bool]
    check_state: Callable[[Any, Any], tuple[str, str] | None]
    check_transition: Callable[[Any, Any, tuple[int, str, Any, bool]], tuple[str, str] | None]


_ROOT = -1  # parent of an initial state (CPython never returns -1 from hash())


@dataclass(frozen=True)
class Step:
    actor: int  # attempt slot, or -1 for the environment
    label: str
    state: State


@dataclass(frozen=True)
class Counterexample:
    invariant: str
    message: str
    initial: State
    steps: tuple[Step, ...]


@dataclass
class Result:
    config: Any  # model.config.Config or model.fanout.config.FanoutConfig
    states: int = 0
    transitions: int = 0
    depth: int = 0
    terminal: int = 0
    seconds: float = 0.0
    peak_mb: float = 0.0  # peak resident memory of the (largest) exploring process
    #: The first (so a shortest) counterexample of each violated invariant, in found order.
    violations: list[Counterexample] = field(default_factory=list)
    pcs: set[str] = field(default_factory=set)  # attempt steps reached (coverage)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def collision_bound(self) -> float:
        return self.states**2 / 2.0**64


def _trace(cfg: Any, spec: Spec, parents: dict[int, int], last: int) -> tuple[State, list[Step]]:
    chain = []
    fp = last
    while fp != _ROOT:
        chain.append(fp)
        fp = parents[fp]
    chain.reverse()
    state = next(s for s in spec.initial_states(cfg) if hash(s) == chain[0])
    first = state
    steps = []
    for fp in chain[1:]:
        actor, label, state, _ = next(t for t in spec.successors(cfg, state) if hash(t[2]) == fp)
        steps.append(Step(actor, label, state))
    return first, steps


def explore(cfg: Any, *, stop_at_first: bool = False) -> Result:
    """Every interleaving of ``cfg``, collecting a shortest counterexample per invariant.

    A state that violates a state invariant is not expanded (what follows from it is the
    same failure); a step that violates I2a or I2b is, so its consequences are explored too.
    """
    spec: Spec = cfg.spec()
    started = time.monotonic()
    result = Result(cfg)
    found: set[str] = set()
    parents: dict[int, int] = {}
    frontier: list[tuple[State, int]] = []
    for s in spec.initial_states(cfg):
        fp = hash(s)
        if fp not in parents:
            parents[fp] = _ROOT
            frontier.append((s, fp))

    def record(invariant: str, message: str, last: int, extra: Step | None = None) -> bool:
        """Keep the first counterexample of ``invariant``; True if exploration should stop."""
        if invariant not in found:
            found.add(invariant)
            first, steps = _trace(cfg, spec, parents, last)
            if extra is not None:
                steps.append(extra)
            result.violations.append(Counterexample(invariant, message, first, tuple(steps)))
        return stop_at_first

    while frontier:
        following: list[tuple[State, int]] = []
        for s, fp in frontier:
            for a in s.attempts:
                if a is not None:
                    result.pcs.add(a.pc)
            trs = spec.successors(cfg, s)
            if not trs:
                if not spec.terminal(s):
                    message = "no action is enabled, yet not everything is terminal"
                    if record("deadlock", message, fp):
                        return _done(result, parents, started)
                result.terminal += 1
            for tr in trs:
                result.transitions += 1
                nxt = tr[2]
                bad = spec.check_transition(cfg, s, tr)
                if bad is not None and record(*bad, fp, Step(tr[0], tr[1], nxt)):
                    return _done(result, parents, started)
                nfp = hash(nxt)
                if nfp in parents:
                    continue
                parents[nfp] = fp
                bad = spec.check_state(cfg, nxt)
                if bad is not None:
                    if record(*bad, nfp):
                        return _done(result, parents, started)
                    continue
                following.append((nxt, nfp))
        if following:
            result.depth += 1
        frontier = following
    return _done(result, parents, started)


def _done(result: Result, parents: dict[int, int], started: float) -> Result:
    result.states = len(parents)
    result.seconds = time.monotonic() - started
    result.peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return result


def explore_parallel(cfg: Any, *, workers: int = 2, stop_at_first: bool = False) -> Result:
    """``explore`` with the initial states split over processes.

    The hook and the pinning of the input never change after the initial state, so each
    (hook, pinned) pair spans its own part of the state space: the parts share no state and
    together are exactly what ``explore(cfg)`` visits.
    """
    # Pinned parts first: of equally short counterexamples, theirs read most simply.
    parts = sorted({(h and cfg.has("hook"), p) for h in cfg.hooks for p in cfg.pinned}, key=str)
    parts.sort(key=lambda part: (part[0], not part[1]))
    if workers <= 1 or len(parts) == 1:
        return explore(cfg, stop_at_first=stop_at_first)
    started = time.monotonic()
    configs = [replace(cfg, hooks=(h,), pinned=(p,)) for h, p in parts]
    with ProcessPoolExecutor(max_workers=min(workers, len(configs))) as pool:
        results = list(pool.map(partial(explore, stop_at_first=stop_at_first), configs))
    merged = Result(cfg)
    shortest: dict[str, Counterexample] = {}
    for r in results:
        merged.states += r.states
        merged.transitions += r.transitions
        merged.terminal += r.terminal
        merged.depth = max(merged.depth, r.depth)
        merged.peak_mb = max(merged.peak_mb, r.peak_mb)
        merged.pcs |= r.pcs
        for v in r.violations:
            if v.invariant not in shortest or len(v.steps) < len(shortest[v.invariant].steps):
                shortest[v.invariant] = v
    merged.violations = sorted(shortest.values(), key=lambda v: len(v.steps))
    merged.seconds = time.monotonic() - started
    return merged
