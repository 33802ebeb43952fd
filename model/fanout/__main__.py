"""``python -m model.fanout``: check fan-out publication exhaustively; exit 1 on a violation.

Without options it runs the suite below (every invariant holds: exit 0). One exploration of
three writers with every switch on does not fit a 2-core machine (tens of millions of
states), so the suite splits the question: all three writers together, and each pair
(disjoint, overlapping) with everything else switched on. ``--steps`` and the other options
explore one configuration instead; ``--drop M`` removes a mechanism from every run and
reports what breaks that did not break with it; ``--drops`` does that for each mechanism.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from model.explore import Result, explore, explore_parallel
from model.fanout.config import GROUP_MECHANISMS, MECHANISMS, STEPS, FanoutConfig
from model.fanout.report import format_result

#: The default suite: (what it shows, configuration).
SUITE: tuple[tuple[str, FanoutConfig], ...] = (
    (
        "two disjoint writers and an overlapping one, A retried",
        FanoutConfig(steps="ABC", retried="A", noop=False, foreign="off", hooks=(False,)),
    ),
    (
        "disjoint pair, A retried, no-op bodies, foreign writer, hook off and on",
        FanoutConfig(steps="AB", retried="A"),
    ),
    (
        "overlapping pair, A retried, no-op bodies, foreign writer, hook off and on",
        FanoutConfig(steps="AC", retried="A"),
    ),
    (
        "overlapping pair, the inner scope C retried, foreign writer",
        FanoutConfig(steps="AC", retried="C", noop=False, hooks=(False,)),
    ),
    (
        "disjoint pair with crashes after any step (they add no violation, only states)",
        FanoutConfig(steps="AB", retried="A", noop=False, crashes=True, hooks=(False,)),
    ),
    (
        "group commit: disjoint pair in one worker process, A retried, no-op bodies, foreign "
        "writer",
        FanoutConfig(steps="AB", retried="A", hooks=(False,), group=True),
    ),
    (
        "group commit: disjoint pair in one worker process, A retried, no-op bodies, foreign "
        "writer, hook on (members hand the head their merge made to the next turn)",
        FanoutConfig(steps="AB", retried="A", hooks=(True,), group=True),
    ),
    (
        "group commit: disjoint pair in one worker process, A retried, no-op bodies, foreign "
        "writer, the hook's file in the tree but lakeFS runs no hooks (the head is handed on "
        "from the merge commit read back)",
        FanoutConfig(steps="AB", retried="A", hooks=(True,), hooks_run=False, group=True),
    ),
    (
        "group commit: overlapping pair in one worker process, A retried, no-op bodies, "
        "foreign writer, hook off and on",
        FanoutConfig(steps="AC", retried="A", group=True),
    ),
    (
        "group commit: disjoint pair in one process, A retried, members crash after any step",
        FanoutConfig(steps="AB", retried="A", noop=False, crashes=True, hooks=(False,), group=True),
    ),
)

#: Smaller runs for ``--drops``: each pair with A retried, everything else on (and in one
#: process with group commit, for the group's own mechanisms).
DROP_SUITE: tuple[FanoutConfig, ...] = (
    FanoutConfig(steps="AB", retried="A", hooks=(False,)),
    FanoutConfig(steps="AC", retried="A", hooks=(False,)),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model.fanout",
        description="Exhaustive model check of Perago's fan-out publication (parallel writers).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="steps: "
        + ", ".join(f"{k} ({v})" for k, v in STEPS.items())
        + "\n\nmechanisms (--drop):\n"
        + "\n".join(f"  {k:<15} {v}" for k, v in MECHANISMS.items()),
    )
    p.add_argument("--drop", action="append", default=[], metavar="M", help="remove M")
    p.add_argument("--drops", action="store_true", help="drop each mechanism in turn")
    p.add_argument("--steps", help="explore one configuration with these steps (e.g. ABC)")
    p.add_argument("--retried", default="A", help="steps with retries (default A)")
    p.add_argument("--retries", type=int, default=1, help="retries of each retried step")
    p.add_argument("--no-noop", action="store_true", help="bodies never produce an empty diff")
    p.add_argument("--no-foreign", action="store_true", help="no foreign writer")
    p.add_argument("--hook", action="store_true", help="also explore with the hook installed")
    p.add_argument(
        "--hooks-not-run",
        action="store_true",
        help="with --hook: its file is in the tree but lakeFS runs no hooks",
    )
    p.add_argument("--crashes", action="store_true", help="workers may die after any step")
    p.add_argument(
        "--group", action="store_true", help="group commit: the attempts share one process"
    )
    p.add_argument("--first", action="store_true", help="stop at the first violation")
    p.add_argument("--no-traces", action="store_true", help="verdicts only")
    return p


def _drops(values: list[str]) -> frozenset[str]:
    out: set[str] = set()
    for value in values:
        for name in value.split(","):
            if name not in MECHANISMS:
                raise SystemExit(f"unknown mechanism {name!r}; choose from {', '.join(MECHANISMS)}")
            out.add(name)
    return frozenset(out)


def _one(args: argparse.Namespace, drops: frozenset[str]) -> FanoutConfig:
    try:
        return FanoutConfig(
            steps=args.steps,
            retried=args.retried,
            retries=args.retries,
            noop=not args.no_noop,
            foreign="off" if args.no_foreign else "outside-reset",
            hooks=(False, True) if args.hook else (False,),
            hooks_run=not args.hooks_not_run,
            crashes=args.crashes,
            group=args.group,
            drops=drops,
        )
    except ValueError as e:
        raise SystemExit(f"bad configuration: {e}") from e


def _verdict(mechanism: str, results: list[Result], baselines: list[Result]) -> str:
    new = []
    for result, base in zip(results, baselines, strict=True):
        known = {v.invariant for v in base.violations}
        new += [
            f"{v.invariant} ({len(v.steps)} steps, {result.config.steps})"
            for v in result.violations
            if v.invariant not in known
        ]
    if new:
        return "counterexample: " + ", ".join(new)
    return "no counterexample: defence in depth here (docs/model-check.md says which covers it)"


def _drop_table(base: frozenset[str]) -> int:
    configs = [replace(c, drops=base) for c in DROP_SUITE]
    with ProcessPoolExecutor(max_workers=2) as pool:
        baselines = list(pool.map(explore, configs))
        table = []
        for mechanism in MECHANISMS:
            runs = configs
            if mechanism in GROUP_MECHANISMS:  # baselines hold with the group as without
                runs = [replace(c, group=True) for c in configs]
            if mechanism == "handoff-readback":  # what it guards against: a hook not run
                runs = [replace(c, hooks=(True,), hooks_run=False) for c in runs]
            dropped = [replace(c, drops=base | {mechanism}) for c in runs]
            table.append((mechanism, list(pool.map(explore, dropped))))
    for result in baselines:
        print(format_result(result, traces=False))
    print("\ndropping one mechanism at a time:")
    for mechanism, results in table:
        states = sum(r.states for r in results)
        print(f"  {mechanism:<15} {states:>10,} states  {_verdict(mechanism, results, baselines)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    drops = _drops(args.drop)
    print("Perago fan-out publication: exhaustive model check")
    if args.drops:
        return _drop_table(drops)
    runs = (
        [("one configuration", _one(args, drops))]
        if args.steps
        else [(what, replace(cfg, drops=drops)) for what, cfg in SUITE]
    )
    failed = 0
    for what, cfg in runs:
        print(f"\n== {what}")
        baseline = explore_parallel(replace(cfg, drops=frozenset())) if drops else None
        result = explore_parallel(cfg, stop_at_first=args.first)
        print(format_result(result, traces=not args.no_traces, baseline=baseline))
        failed += bool(result.violations)
    if failed:
        print(f"\n{failed} run(s) found a violation (docs/model-check.md, fan-out).")
        return 1
    print("\nno violation.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
