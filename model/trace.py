"""Counterexamples for people: each step, who took it, and what it changed."""

from __future__ import annotations

from model.actions import actor_name
from model.config import Config
from model.explore import Counterexample
from model.invariants import INVARIANTS
from model.state import NONE, State, attempt_name, ref_name
from model.store import NO_REF, first_parent_history

__all__ = ["format_counterexample", "summary"]

_WIDTH = 15  # actor column


def summary(cfg: Config, s: State) -> str:
    """Branch history (head first), tags, lease and Conductor's tasks, on one line."""
    history = " < ".join(ref_name(cfg, r) for r in first_parent_history(s.commits, s.head))
    tags = ", ".join(ref_name(cfg, r) for r in range(len(s.commits)) if s.tags >> r & 1)
    if s.lease.holder == NO_REF:
        held = "free"
    else:
        held = attempt_name(cfg, s.lease.holder) + (" (run out)" if s.lease.expired else "")
    tasks = ", ".join(
        f"t{i} {t.status}" + (f"={ref_name(cfg, t.output)}" if t.output != NO_REF else "")
        for i, t in enumerate(s.tasks)
        if t.status != NONE
    )
    return f"branch: {history} | tags: {tags or '-'} | lease: {held} | Conductor: {tasks}"


def format_counterexample(cfg: Config, cx: Counterexample) -> str:
    title = INVARIANTS.get(cx.invariant, "every state can move on until all is terminal")
    ref = "the task input names ref r0" if cx.initial.pinned else "the task input has no ref"
    hook = "installed" if cx.initial.hook else "not installed"
    lines = [
        f"Counterexample to {cx.invariant} ({title}), {len(cx.steps)} steps:",
        f"  {cx.message}",
        f"  initially: head r0; {ref}; expected-head hook {hook}",
        "  (tN: the attempt on the task id of retry N"
        + ("; tNpK: its K-th delivery" if cfg.polls > 1 else "")
        + "; S[x], M[x]: x's staged and merge commits; F: the foreign commit)",
    ]
    before = summary(cfg, cx.initial)
    for n, step in enumerate(cx.steps, 1):
        lines.append(f"  {n:>3}. {actor_name(cfg, step.actor):<{_WIDTH}} {step.label}")
        after = summary(cfg, step.state)
        if after != before:
            lines.append(f"  {'':>4} {'':<{_WIDTH}}   -> {after}")
        before = after
    return "\n".join(lines)
