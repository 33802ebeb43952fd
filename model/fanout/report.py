"""What a fan-out run prints: figures, the verdict per invariant, counterexample traces."""

from __future__ import annotations

from model.explore import Counterexample, Result
from model.fanout.actions import actor_name
from model.fanout.config import FanoutConfig, overlaps
from model.fanout.invariants import INVARIANTS
from model.fanout.state import NONE, State, attempt_name, ref_name
from model.fanout.tree import NO_REF, first_parent_history
from model.fanout.worker import STEP_NAMES

__all__ = ["format_counterexample", "format_result", "summary"]

_WIDTH = 15


def summary(cfg: FanoutConfig, s: State) -> str:
    """Branch history (head first), tags, leases and Conductor's tasks, on one line."""
    history = " < ".join(ref_name(cfg, r) for r in first_parent_history(s.commits, s.head))
    tags = ", ".join(ref_name(cfg, r) for r in range(len(s.commits)) if s.tags >> r & 1)
    leases = ", ".join(
        "free"
        if held.holder == NO_REF
        else attempt_name(cfg, held.holder)
        + "".join(
            f"+{attempt_name(cfg, m)}"
            for m in range(cfg.slots)
            if held.members >> m & 1 and m != held.holder
        )
        + (f" (turn {attempt_name(cfg, held.turn)})" if held.turn != NO_REF else "")
        + (" (run out)" if held.expired else "")
        for held in s.leases
    )
    tasks = ", ".join(
        f"{attempt_name(cfg, slot)} {t.status}"
        + (f"={ref_name(cfg, t.output)}" if t.status == "COMPLETED" else "")
        for slot, t in enumerate(s.tasks)
        if t.status != NONE
    )
    return f"branch: {history} | tags: {tags or '-'} | lease: {leases} | Conductor: {tasks}"


def format_counterexample(cfg: FanoutConfig, cx: Counterexample) -> str:
    hook = "installed" if cx.initial.hook else "not installed"
    if cx.initial.hook and not cfg.hooks_run:
        hook += " (lakeFS runs no hooks)"
    pins = "every writer pins r0" if cx.initial.pinned else "no writer's input names a ref"
    reads = "".join(f"; {n} reads {f} ({cfg.isolation})" for n, f in cfg.reads)
    lines = [
        f"Counterexample to {cx.invariant} ({INVARIANTS.get(cx.invariant, 'no deadlock')}), "
        f"{len(cx.steps)} steps:",
        f"  {cx.message}",
        f"  initially: head r0; {pins}; expected-head hook {hook}{reads}",
        "  (X0, X1: step X's first attempt and its retry; S[x], P[x], M[x]: x's staged commit, "
        "scoped-replacement branch, merge; F: the foreign commit)",
    ]
    before = summary(cfg, cx.initial)
    for n, step in enumerate(cx.steps, 1):
        lines.append(f"  {n:>3}. {actor_name(cfg, step.actor):<{_WIDTH}} {step.label}")
        after = summary(cfg, step.state)
        if after != before:
            lines.append(f"  {'':>4} {'':<{_WIDTH}}   -> {after}")
        before = after
    return "\n".join(lines)


def format_result(result: Result, *, traces: bool = True, baseline: Result | None = None) -> str:
    cfg = result.config
    lines = [
        f"configuration: {cfg.describe()}",
        f"explored: {result.states:,} distinct states, {result.transitions:,} transitions, "
        f"max depth {result.depth}, {result.terminal:,} terminal states, "
        f"{result.seconds:.1f} s, peak memory {result.peak_mb:.0f} MB per process "
        f"(fingerprint collision chance <= {result.collision_bound:.0e})",
    ]
    missing = STEP_NAMES - result.pcs - _unreachable(cfg)
    if missing:
        lines.append(f"steps never reached: {', '.join(sorted(missing))}")
    known = {v.invariant for v in baseline.violations} if baseline else set()
    found = {v.invariant: v for v in result.violations}
    for inv, text in {**INVARIANTS, "deadlock": "no deadlock other than all-terminal"}.items():
        if inv in ("R1", "R2") and not any(cfg.checks_reads(i) for i in range(len(cfg.steps))):
            continue
        v = found.get(inv)
        verdict = "holds" if v is None else f"VIOLATED ({len(v.steps)} steps)"
        if v is not None and baseline is not None:
            verdict += " also without the drop" if inv in known else " only with the drop"
        lines.append(f"  {inv:<8} {verdict:<38} {text}")
    if traces:
        for v in result.violations:
            if baseline is None or v.invariant not in known:
                lines += ["", format_counterexample(cfg, v)]
    return "\n".join(lines)


def _unreachable(cfg: FanoutConfig) -> frozenset[str]:
    out = set()
    if False not in cfg.pinned:
        out.add("start")
    if not cfg.leases:
        out |= {"noop_lease", "noop_fence", "merge_refresh", "merge_recheck", "reread"}
        out |= {"refresh", "recheck"}
    if not cfg.has("tag"):
        out.add("tag")
    if not cfg.noop:
        out |= {"noop_lease", "noop_fence", "noop_decide"}
    if cfg.hooks == (False,) or not cfg.has("hook") or not cfg.hooks_run:
        out.add("refence")
    scopes = [cfg.scope(i) for i in range(len(cfg.steps))]
    disjoint = any(not overlaps(a, b) for a in scopes for b in scopes)
    if not cfg.has("scoped-replace") or not cfg.retried or not disjoint:
        out.add("scoped")  # a retry under a sibling needs a disjoint one
    return frozenset(out)
