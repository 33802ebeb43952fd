"""What a run prints: its figures, the verdict per invariant, and what each drop showed."""

from __future__ import annotations

from model.config import Config
from model.explore import Result
from model.invariants import INVARIANTS
from model.trace import format_counterexample

__all__ = ["drop_verdict", "format_drop", "format_result", "steps_of", "why_no_counterexample"]

#: Every step an attempt can be at (a run reaching all of them covered the whole protocol).
STEPS = frozenset(
    {
        "polled",
        "fence1",
        "noop_peek",
        "noop_head",
        "noop_decide",
        "noop_lease",
        "stage",
        "fence2",
        "publish_fence",
        "merge_refresh",
        "merge",
        "merge_recheck",
        "noop_fence",
        "reread",
        "tag",
        "refresh",
        "reset",
        "recheck",
        "verify",
        "release",
        "report",
        "done",
    }
)


def why_no_counterexample(cfg: Config, mechanism: str) -> str:
    """Why dropping ``mechanism`` left every invariant intact in ``cfg``: defence in depth."""
    guarded = cfg.leases and cfg.has("merge-guard")
    if mechanism == "fence1" and cfg.guarded_report:
        return (
            "every write and every COMPLETED report follows attempt fence #2 under the branch "
            "lease (the no-op path takes it too), so fence #1 only saves work"
        )
    if mechanism == "fence1" and cfg.leases and cfg.has("noop-peek") and cfg.redeliveries == 0:
        return (
            "every write follows attempt fence #2 under the branch lease (on the no-op path "
            "too since 261b23b), and the no-op shortcut (lease free, head the input ref) "
            "writes nothing: a stale attempt's COMPLETED is ignored, its task id being "
            "terminal. So fence #1 only saves work"
        )
    if mechanism == "window-wait" and cfg.redeliveries == 0:
        return (
            "it protects against a task id delivered twice (finding F3 with report windows): "
            "--drop window-wait --redelivery shows F3 again (I4)"
        )
    if mechanism == "window-wait" and not cfg.report_window:
        return "it is a part of report-window, which this run drops"
    if mechanism == "fresh-fence" and cfg.redeliveries == 0:
        return (
            "it protects against a task id delivered twice (a re-delivery waits before the "
            "lease, off the branch): --drop fresh-fence --redelivery shows F3 again (I4)"
        )
    if mechanism == "fresh-fence" and not (cfg.report_window and cfg.has("window-wait")):
        return "it is a part of window-wait, which this run drops"
    if mechanism == "report-again" and not cfg.report_window:
        return "it is a part of report-window, which this run drops"
    if mechanism == "report-again":
        return (
            "it spares a retry when Conductor is slower than a window, not what is safe: "
            "without it a closed window gives FAILED at once, which holds too"
        )
    if mechanism == "again-fence" and not (cfg.report_window and cfg.has("report-again")):
        return "it is a part of report-again, which this run drops"
    if mechanism == "again-fence" and cfg.fresh_fences:
        return (
            "with fresh fences (as coded) a second window opens only after a fence that "
            "passed: without this one it opens closed and the delivery reports FAILED; "
            "--drop again-fence --drop fresh-fence --redelivery shows F3 again (I4)"
        )
    if mechanism == "again-fence" and cfg.redeliveries == 0:
        return (
            "it protects against a task id delivered twice: a retry is scheduled only after "
            "the task id ended, so a second window's COMPLETED is ignored then; "
            "--drop again-fence --redelivery shows F3 again (I4)"
        )
    if mechanism == "report-window":
        return (
            "it changes when a grant ends, not what is safe: without it COMPLETED is reported "
            "under the branch lease (the code from df3d7a7), which holds too"
        )
    if mechanism == "noop-peek" and cfg.guarded_report:
        return (
            "with guarded-report (as coded) the no-op path always takes the branch lease, so "
            "there is no lease read to drop (--drop guarded-report --drop noop-peek: F1)"
        )
    if mechanism == "guarded-report" and cfg.redeliveries == 0 and cfg.has("noop-peek"):
        return (
            "it protects against a task id delivered twice (finding F3, --redelivery); "
            "without re-deliveries the no-op path's lease read (261b23b) covers F1"
        )
    if mechanism == "marker" and (guarded or cfg.hooks == (True,)):
        why = (
            "guarded merges serialize merges: in the model a guarded write cannot outlive its lease"
            if guarded
            else "the expected-head hook rejects a second merge onto a moved head"
        )
        return (
            f"{why}. The marker still covers what the model abstracts away (a merge request "
            "landing after its client gave up, past the lease) and PERAGO_COORD_BACKEND=none "
            "(--drop marker --drop lease finds I1)"
        )
    if mechanism == "hook":
        return (
            "the marker rejects a second publication from the input ref, and the post-publish "
            "check fails closed when a foreign commit lands between fence and merge; the hook "
            "turns that detection into prevention (no publication on a head the fence did not "
            "see), which no invariant asks for (--drop postcheck: I5 without the hook, "
            "nothing with it)"
        )
    if mechanism == "serial-report" and cfg.extensions == 0:
        return "no response-timeout extension overlaps another update (extensions=0)"
    if mechanism == "postcheck" and cfg.hooks == (True,):
        return "with the expected-head hook installed a merge onto a moved head is rejected"
    if mechanism == "lease" and cfg.redeliveries == 0 and cfg.retries == 1:
        return (
            "with one retry and no re-delivery only one attempt can ever reach a hard reset; "
            "the re-read under the lease narrows a window the foreign writer is assumed not "
            "to use (outside-reset); --redelivery gives a second resetter (I3b)"
        )
    return "nothing in this configuration depends on it"


def steps_of(result: Result) -> frozenset[str]:
    return frozenset(result.pcs) & STEPS


def format_result(result: Result, *, traces: bool = True, baseline: Result | None = None) -> str:
    cfg = result.config
    lines = [
        f"configuration: {cfg.describe()}",
        f"explored: {result.states:,} distinct states, {result.transitions:,} transitions, "
        f"max depth {result.depth}, {result.terminal:,} terminal states, "
        f"{result.seconds:.1f} s, peak memory {result.peak_mb:.0f} MB per process "
        f"(fingerprint collision chance <= {result.collision_bound:.0e})",
    ]
    missing = STEPS - result.pcs - _unreachable(cfg)
    if missing:
        lines.append(f"steps never reached: {', '.join(sorted(missing))}")
    known = {v.invariant for v in baseline.violations} if baseline else set()
    found = {v.invariant: v for v in result.violations}
    for inv, text in {**INVARIANTS, "deadlock": "no deadlock other than all-terminal"}.items():
        v = found.get(inv)
        if v is None:
            verdict = "holds"
        else:
            verdict = f"VIOLATED ({len(v.steps)} steps)"
            if baseline is not None:
                verdict += " also without the drop" if inv in known else " only with the drop"
        lines.append(f"  {inv:<8} {verdict:<38} {text}")
    if traces:
        for v in result.violations:
            if baseline is None or v.invariant not in known:
                lines += ["", format_counterexample(cfg, v)]
    return "\n".join(lines)


def _unreachable(cfg: Config) -> frozenset[str]:
    """Steps a configuration cannot reach by construction."""
    out = set()
    if not cfg.leases:
        out |= {"noop_peek", "noop_head", "noop_lease", "noop_fence"}
        out |= {"reread", "refresh", "recheck"}
    if not cfg.has("tag"):
        out.add("tag")
    if not cfg.noop:
        out |= {"noop_peek", "noop_head", "noop_decide", "noop_lease", "noop_fence"}
    if not (cfg.leases and cfg.has("merge-guard")):
        out |= {"merge_refresh", "merge_recheck"}
    if not cfg.has("noop-peek") or cfg.guarded_report:
        out |= {"noop_peek", "noop_head"}  # the no-op path never reads the lease first
        if not cfg.guarded_report:
            out.add("noop_fence")  # and never re-runs its fence (the code before 261b23b)
    return frozenset(out)


def format_drop(mechanism: str, result: Result, baseline: Result) -> str:
    """One row of the drop table: what removing ``mechanism`` broke that was not broken."""
    return f"  {mechanism:<12} {_figures(result)}  {drop_verdict(mechanism, result, baseline)}"


def _figures(result: Result) -> str:
    return f"{result.states:>9,} {result.transitions:>11,} {result.seconds:>6.1f}s"


def drop_verdict(mechanism: str, result: Result, baseline: Result) -> str:
    known = {v.invariant for v in baseline.violations}
    new = [v for v in result.violations if v.invariant not in known]
    if new:
        return "counterexample: " + ", ".join(f"{v.invariant} ({len(v.steps)} steps)" for v in new)
    if known:
        return (
            f"no counterexample to an invariant that holds without the drop (it violates "
            f"{', '.join(sorted(known))} already; --fix all tells them apart)"
        )
    why = why_no_counterexample(result.config, mechanism)
    return f"no counterexample: defence in depth under the modelled assumptions: {why}"
