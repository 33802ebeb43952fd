"""``python -m model``: check the publication protocol exhaustively; exit 1 on a violation.

Without options it checks the protocol as coded, in the configuration of docs/model-check.md
(every invariant holds: exit 0). ``--drop M`` removes a mechanism and reports what breaks that
did not break with it; ``--drops`` does that for every mechanism; ``--fix all`` applies the
changes the model proposes (none is open: F3's guarded-report is coded since df3d7a7, and
``--redelivery`` holds).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from model.config import FIXES, MECHANISMS, Config
from model.explore import Result, explore, explore_parallel
from model.report import drop_verdict, format_drop, format_result


def _names(values: list[str], known: dict[str, str], what: str) -> frozenset[str]:
    out: set[str] = set()
    for value in values:
        for name in value.split(","):
            if name == "all":
                out |= known.keys()
            elif name in known:
                out.add(name)
            else:
                raise SystemExit(f"unknown {what} {name!r}; choose from {', '.join(known)}, all")
    return frozenset(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model",
        description="Exhaustive model check of Perago's publication protocol.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="mechanisms (--drop):\n"
        + "\n".join(f"  {k:<12} {v}" for k, v in MECHANISMS.items())
        + "\n\nproposed fixes (--fix):\n"
        + ("\n".join(f"  {k:<22} {v}" for k, v in FIXES.items()) or "  none open"),
    )
    p.add_argument("--drop", action="append", default=[], metavar="M", help="remove M")
    p.add_argument("--drops", action="store_true", help="drop each mechanism in turn")
    p.add_argument("--fix", action="append", default=[], metavar="F", help="apply F (or all)")
    foreign = p.add_mutually_exclusive_group()
    foreign.add_argument(
        "--foreign",
        dest="foreign",
        action="store_const",
        const="outside-reset",
        default="outside-reset",
        help="a foreign writer commits once, never inside a reset window (default)",
    )
    foreign.add_argument(
        "--no-foreign", dest="foreign", action="store_const", const="off", help="no foreign writer"
    )
    foreign.add_argument(
        "--foreign-anytime",
        dest="foreign",
        action="store_const",
        const="anytime",
        help="the foreign writer may also commit inside a reset window",
    )
    hook = p.add_mutually_exclusive_group()
    hook.add_argument(
        "--hook", dest="hooks", action="store_const", const=(True,), help="hook installed only"
    )
    hook.add_argument(
        "--no-hook", dest="hooks", action="store_const", const=(False,), help="hook never"
    )
    pinned = p.add_mutually_exclusive_group()
    pinned.add_argument(
        "--pinned", dest="pinned", action="store_const", const=(True,), help="input names a ref"
    )
    pinned.add_argument(
        "--unpinned", dest="pinned", action="store_const", const=(False,), help="input: no ref"
    )
    p.add_argument("--redelivery", action="store_true", help="one re-delivery of a task id")
    p.add_argument("--retries", type=int, default=1, help="Conductor retries (default 1)")
    p.add_argument(
        "--extensions",
        type=int,
        default=1,
        help="response-timeout extensions that may overlap another update (default 1)",
    )
    p.add_argument("--deterministic", action="store_true", help="every attempt: same diff")
    p.add_argument("--no-noop", action="store_true", help="bodies never produce an empty diff")
    p.add_argument("--once-per-step", action="store_true", help="I1 whatever the input ref")
    p.add_argument("--first", action="store_true", help="stop at the first violation")
    p.add_argument("--no-traces", action="store_true", help="verdicts only")
    return p


def _config(args: argparse.Namespace) -> Config:
    return Config(
        retries=args.retries,
        redeliveries=1 if args.redelivery else 0,
        extensions=args.extensions,
        foreign=args.foreign,
        hooks=args.hooks or (False, True),
        pinned=args.pinned or (True, False),
        noop=not args.no_noop,
        same_diff=args.deterministic,
        once_per_step=args.once_per_step,
        drops=_names(args.drop, MECHANISMS, "mechanism"),
        fixes=_names(args.fix, FIXES, "fix"),
    )


def _explore(cfg: Config) -> Result:
    return explore(cfg)


def _drop_table(base: Config) -> int:
    configs = [base] + [replace(base, drops=base.drops | {m}) for m in MECHANISMS]
    with ProcessPoolExecutor(max_workers=2) as pool:
        baseline, *dropped = pool.map(_explore, configs)
    print(format_result(baseline, traces=False))
    print("\ndropping one mechanism at a time (states, transitions, time, result):")
    for mechanism, result in zip(MECHANISMS, dropped, strict=True):
        print(format_drop(mechanism, result, baseline))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cfg = _config(args)
    print("Perago publication protocol: exhaustive model check")
    if args.drops:
        return _drop_table(cfg)
    baseline = explore_parallel(replace(cfg, drops=frozenset())) if cfg.drops else None
    result = explore_parallel(cfg, stop_at_first=args.first)
    print(format_result(result, traces=not args.no_traces, baseline=baseline))
    if baseline is not None:
        for mechanism in sorted(cfg.drops):
            print(f"\ndropping {mechanism}: {drop_verdict(mechanism, result, baseline)}")
    if result.violations:
        print(f"\n{len(result.violations)} invariant(s) violated.", end=" ")
        if not cfg.fixes:
            print("docs/model-check.md (findings) says which are open, fixed or documented limits.")
        else:
            print()
        return 1
    print("\nno violation.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
