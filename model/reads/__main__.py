"""``python -m model.reads``: check named inputs and their isolation; exit 1 on a violation.

Without options it runs ``model.reads.SUITE`` (every invariant holds: exit 0). ``--drop
read-set`` removes the serializable check: R1 breaks (a shortest trace is printed).
``--drop fresh-reads`` reads an unpinned attempt's inputs at its input ref, as before Fix
F7: R2 breaks in the B-retried run (F7, a retry refused forever).
``--isolation``, ``--retried`` and the other options explore one configuration instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

from model.explore import explore_parallel
from model.fanout.config import ISOLATION, MECHANISMS, FanoutConfig
from model.fanout.report import format_result
from model.reads import SUITE, reading


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model.reads",
        description="Exhaustive model check of named inputs: B reads a/, which A publishes.",
    )
    p.add_argument("--drop", action="append", default=[], metavar="M", help="remove M")
    p.add_argument("--isolation", choices=ISOLATION, help="explore one configuration")
    p.add_argument("--retried", default="", help="steps with one retry (default none)")
    p.add_argument("--pinned", action="store_true", help="inputs pinned to r0 only")
    p.add_argument("--unpinned", action="store_true", help="inputs without ref only")
    p.add_argument("--noop", action="store_true", help="bodies may produce an empty diff")
    p.add_argument("--foreign", action="store_true", help="a foreign writer commits once")
    p.add_argument("--hook", action="store_true", help="also explore with the hook installed")
    p.add_argument("--crashes", action="store_true", help="workers may die after any step")
    p.add_argument("--first", action="store_true", help="stop at the first violation")
    p.add_argument("--no-traces", action="store_true", help="verdicts only")
    return p


def _one(args: argparse.Namespace) -> FanoutConfig:
    pinned = (True,) if args.pinned else (False,) if args.unpinned else (True, False)
    return reading(
        args.isolation,
        retried=args.retried,
        retries=1 if args.retried else 0,
        pinned=pinned,
        noop=args.noop,
        foreign="outside-reset" if args.foreign else "off",
        hooks=(False, True) if args.hook else (False,),
        crashes=args.crashes,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    drops = frozenset(name for value in args.drop for name in value.split(","))
    if drops - MECHANISMS.keys():
        raise SystemExit(f"unknown mechanism(s) {sorted(drops - MECHANISMS.keys())}")
    print("Perago named inputs (reads and isolation): exhaustive model check")
    runs = [("one configuration", _one(args))] if args.isolation else list(SUITE)
    failed = 0
    for what, cfg in runs:
        print(f"\n== {what}")
        cfg = replace(cfg, drops=drops)
        baseline = explore_parallel(replace(cfg, drops=frozenset())) if drops else None
        result = explore_parallel(cfg, stop_at_first=args.first)
        print(format_result(result, traces=not args.no_traces, baseline=baseline))
        failed += bool(result.violations)
    if failed:
        print(f"\n{failed} run(s) found a violation (docs/model-check.md, reads and isolation).")
        return 1
    print("\nno violation.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
