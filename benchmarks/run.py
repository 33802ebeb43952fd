"""Run every benchmark against one stack, print the table, write ``benchmarks/results.json``.

    python -m benchmarks.run            # full sizes, 3 repetitions: about 5 minutes on 2 cores
    python -m benchmarks.run --quick    # every size divided by 10, a smoke run
    python -m benchmarks.run --only lease   # one scenario: a, b, c, d, lease (f), h or i

The stack comes from the environment when ``CONDUCTOR_SERVER_URL``,
``LAKECTL_SERVER_ENDPOINT_URL``, ``LAKECTL_CREDENTIALS_*`` and ``PERAGO_BENCH_LAKECTL`` are
set, otherwise from ``perago_dev.stack.up()``. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog

from benchmarks import lease_overhead, roundtrip, task_duration
from benchmarks.common import (
    MIB,
    BenchmarkError,
    ChildRun,
    Lakectl,
    Stack,
    Trash,
    TreeSpec,
    rel_path,
    resolve_stack,
    run_child,
    scenario_command,
    tree_stats,
    write_tree,
)
from perago.adapters.lakefs import LakeFSStore
from perago.config import load
from perago.errors import PeragoError

PREFIX = "data/"
RESULTS = Path(__file__).resolve().parent / "results.json"
RESULTS_S3 = Path(__file__).resolve().parent / "results-s3.json"


@dataclass(frozen=True)
class Scale:
    many: TreeSpec  # (a)
    large: TreeSpec  # (b)
    one_change: TreeSpec  # (c)
    workflows: int  # (d)
    lease_runs: int  # (f), per side and path
    cached: TreeSpec  # (i)
    task_reads: TreeSpec  # (h)
    task_writes: TreeSpec  # (h)


SCALES = {
    "full": Scale(
        many=TreeSpec(1_000, 64 * 1024),
        large=TreeSpec(10, 50 * MIB),
        one_change=TreeSpec(10_000, 1024),
        workflows=20,
        lease_runs=30,
        cached=TreeSpec(5_000, 1024),
        task_reads=TreeSpec(5_000, 1024),
        task_writes=TreeSpec(1_000, 64 * 1024),
    ),
    "quick": Scale(
        many=TreeSpec(100, 64 * 1024),
        large=TreeSpec(10, 5 * MIB),
        one_change=TreeSpec(1_000, 1024),
        workflows=5,
        lease_runs=5,
        cached=TreeSpec(500, 1024),
        task_reads=TreeSpec(500, 1024),
        task_writes=TreeSpec(100, 64 * 1024),
    ),
}


@dataclass(frozen=True)
class Sample:
    seconds: float  # Perago: the operation timed inside its process; lakectl: the process
    max_rss_kib: int
    cpu_s: float  # Perago: CPU of the operation; lakectl: CPU of the process

    @classmethod
    def of_perago(cls, result: dict[str, Any], max_rss_kib: int | None = None) -> Sample:
        return cls(result["seconds"], max_rss_kib or result["max_rss_kib"], result["cpu_s"])

    @classmethod
    def of_lakectl(cls, run: ChildRun) -> Sample:
        return cls(run.seconds, run.max_rss_kib, run.cpu_s)


@dataclass
class Row:
    """One comparison; each repetition adds one sample per side, the table shows medians."""

    scenario: str
    moved_bytes: int
    perago: list[Sample] = field(default_factory=list)
    lakectl: list[Sample] = field(default_factory=list)

    def add(self, perago: Sample, lakectl: Sample) -> None:
        self.perago.append(perago)
        self.lakectl.append(lakectl)

    @property
    def perago_s(self) -> float:
        return statistics.median(s.seconds for s in self.perago)

    @property
    def lakectl_s(self) -> float:
        return statistics.median(s.seconds for s in self.lakectl)

    @property
    def ratio(self) -> float:
        return self.lakectl_s / self.perago_s

    @property
    def mib_per_s(self) -> float | None:
        # A throughput for a handful of bytes says nothing; leave it out.
        if self.moved_bytes < MIB:
            return None
        return self.moved_bytes / MIB / self.perago_s

    @property
    def perago_rss_mib(self) -> float:
        return max(s.max_rss_kib for s in self.perago) / 1024

    @property
    def lakectl_rss_mib(self) -> float:
        return max(s.max_rss_kib for s in self.lakectl) / 1024

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "moved_bytes": self.moved_bytes,
            "perago_s": self.perago_s,
            "lakectl_s": self.lakectl_s,
            "ratio_lakectl_over_perago": self.ratio,
            "perago_mib_per_s": self.mib_per_s,
            "perago_peak_rss_mib": self.perago_rss_mib,
            "lakectl_peak_rss_mib": self.lakectl_rss_mib,
            "perago_cpu_s": statistics.median(s.cpu_s for s in self.perago),
            "lakectl_cpu_s": statistics.median(s.cpu_s for s in self.lakectl),
            "perago_samples": [asdict(s) for s in self.perago],
            "lakectl_samples": [asdict(s) for s in self.lakectl],
        }


def _mib(kib: int) -> float:
    return kib / 1024


T = TypeVar("T")
U = TypeVar("U")


def in_order(rep: int, perago: Callable[[], T], lakectl: Callable[[], U]) -> tuple[T, U]:
    """Run both sides, Perago first on even repetitions, lakectl first on odd ones."""
    if rep % 2 == 0:
        p = perago()
        return p, lakectl()
    lk = lakectl()
    return perago(), lk


class Bench:
    def __init__(self, stack: Stack, tmp: Path, *, repeats: int) -> None:
        self.env = {**os.environ, **stack.env}
        self.tmp = tmp
        self.repeats = repeats
        self.lakectl = Lakectl(stack.lakectl, self.env)
        self.store = LakeFSStore(load(self.env))
        self.token = uuid.uuid4().hex[:8]
        self.repos: list[str] = []
        self.trash = Trash(tmp / "trash")

    # -- helpers ---------------------------------------------------------------------------

    def perago(self, *args: str) -> dict[str, Any]:
        run = run_child(scenario_command(*args), env=self.env, what=f"perago {args[0]}")
        result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
        result["process_wall_s"] = run.seconds  # with interpreter start and imports
        return result

    def new_repo(self, key: str) -> str:
        repo = f"bench-{key}-{self.token}"
        self.store.create_repository(repo)
        self.repos.append(repo)
        return repo

    def branches(self, repo: str, rep: int, source: str = "main") -> tuple[str, str]:
        """A fresh target branch per side and repetition."""
        names = (f"perago-{rep}", f"lakectl-{rep}")
        for name in names:
            self.store.create_branch(repo, name, source)
        return names

    def remote(self, repo: str, ref: str) -> dict[str, tuple[int, str | None]]:
        return {
            o.path[len(PREFIX) :]: (o.size, o.checksum)
            for o in self.store.list_objects(repo, ref, PREFIX)
        }

    def check_remote(self, repo: str, ref: str, spec: TreeSpec) -> None:
        objects = self.remote(repo, ref)
        size = sum(s for s, _ in objects.values())
        if (len(objects), size) != (spec.files, spec.total_bytes):
            raise BenchmarkError(
                f"{repo}@{ref}/{PREFIX} holds {len(objects)} objects, {size} bytes; expected "
                f"{spec.files}, {spec.total_bytes}"
            )

    @staticmethod
    def check_local(root: Path, spec: TreeSpec) -> None:
        found = tree_stats(root)
        if found != (spec.files, spec.total_bytes):
            raise BenchmarkError(f"{root} holds {found} (files, bytes); expected {spec}")

    # -- (a), (b): a new tree ------------------------------------------------------------------

    def new_tree(self, key: str, spec: TreeSpec, seed: int) -> list[Row]:
        """Publish a tree to a fresh branch, then copy the prefix back into an empty dir."""
        repo = self.new_repo(key)
        work = self.tmp / key
        src = work / "src"
        write_tree(src, spec, seed=seed)
        publish = Row(f"({key}) stage+publish {spec.describe()}", spec.total_bytes)
        copy = Row(f"({key}) materialize {spec.describe()}", spec.total_bytes)
        for rep in range(self.repeats):
            p_branch, l_branch = self.branches(repo, rep)
            # lakectl writes its index into the directory it syncs: give it hard links.
            l_src = work / f"lakectl-src-{rep}"
            shutil.copytree(src, l_src, copy_function=os.link)
            self.lakectl.init(f"lakefs://{repo}/{l_branch}/{PREFIX}", l_src)
            pub, commit = in_order(
                rep,
                partial(self.perago, "publish", "--repo", repo, "--branch", p_branch,
                        "--prefix", PREFIX, "--dir", str(src)),
                partial(self.lakectl.commit, l_src, f"bench {key}"),
            )  # fmt: skip
            publish.add(Sample.of_perago(pub), Sample.of_lakectl(commit))
            self.check_remote(repo, p_branch, spec)
            self.check_remote(repo, l_branch, spec)
            self.trash.discard(l_src)

            # Both sides copy the same commit: the one Perago just published.
            p_out, l_out = work / f"perago-out-{rep}", work / f"lakectl-out-{rep}"
            mat, clone = in_order(
                rep,
                partial(self.perago, "materialize", "--repo", repo, "--ref", pub["ref"],
                        "--prefix", PREFIX, "--dir", str(p_out)),
                partial(self.lakectl.clone, f"lakefs://{repo}/{p_branch}/{PREFIX}", l_out),
            )  # fmt: skip
            copy.add(Sample.of_perago(mat), Sample.of_lakectl(clone))
            self.check_local(p_out, spec)
            self.check_local(l_out, spec)
            self.trash.discard(p_out)
            self.trash.discard(l_out)
        self.trash.discard(work)
        return [publish, copy]

    # -- (c): one change among many small files ----------------------------------------------

    def _lakectl_edit(
        self, uri: str, directory: Path, changed: str, content: Path
    ) -> tuple[ChildRun, ChildRun]:
        clone = self.lakectl.clone(uri, directory)
        shutil.copyfile(content, directory / changed)
        return clone, self.lakectl.commit(directory, "bench c: one change")

    def one_change(self, spec: TreeSpec, seed: int) -> list[Row]:
        """Materialize many small files, change one, publish; lakectl: clone, change, commit."""
        repo = self.new_repo("c")
        work = self.tmp / "c"
        src = work / "src"
        write_tree(src, spec, seed=seed)
        # The input commit on main (not measured).
        self.lakectl.init(f"lakefs://{repo}/main/{PREFIX}", src)
        self.lakectl.commit(src, "bench c: input")
        self.trash.discard(src)
        self.check_remote(repo, "main", spec)
        before = self.remote(repo, "main")

        changed = rel_path(spec.files // 2)
        content = work / "changed.bin"
        # A new size as well as new bytes: lakectl detects changes by size and mtime, and a
        # same-size rewrite within the second of the clone is invisible to it.
        content.write_bytes(random.Random(seed + 1).randbytes(spec.size + 512))
        publish = Row(f"(c) stage+publish 1 changed of {spec.files:,}", spec.size + 512)
        copy = Row(f"(c) materialize {spec.describe()}", spec.total_bytes)
        for rep in range(self.repeats):
            p_branch, l_branch = self.branches(repo, rep)
            p_out, l_out = work / f"perago-out-{rep}", work / f"lakectl-out-{rep}"
            edit, (clone, commit) = in_order(
                rep,
                partial(self.perago, "edit", "--repo", repo, "--branch", p_branch,
                        "--prefix", PREFIX, "--dir", str(p_out), "--change", changed,
                        "--content", str(content)),
                partial(self._lakectl_edit, f"lakefs://{repo}/{l_branch}/{PREFIX}", l_out,
                        changed, content),
            )  # fmt: skip
            copy.add(
                Sample.of_perago(edit["materialize"], edit["materialize"]["max_rss_kib"]),
                Sample.of_lakectl(clone),
            )
            publish.add(
                Sample.of_perago(edit["publish"], edit["max_rss_kib"]), Sample.of_lakectl(commit)
            )
            for branch in (p_branch, l_branch):
                after = self.remote(repo, branch)
                moved = {p for p in after.keys() | before.keys() if after.get(p) != before.get(p)}
                if moved != {changed} or after[changed][0] != spec.size + 512:
                    raise BenchmarkError(
                        f"after the one-file change, {repo}@{branch} differs from the input in "
                        f"{sorted(moved)[:5]} (expected exactly {changed!r} with the new size)"
                    )
            self.trash.discard(p_out)
            self.trash.discard(l_out)
        self.trash.discard(work)
        return [publish, copy]

    # -- (i): the worker-local content cache ---------------------------------------------------

    def cached(self, spec: TreeSpec, seed: int) -> list[Row]:
        """One Perago process publishes, reads that back, reads it again; lakectl clones it."""
        repo = self.new_repo("i")
        work = self.tmp / "i"
        src = work / "src"
        write_tree(src, spec, seed=seed)
        chained = Row(
            f"(i) read what this worker just published, {spec.describe()}", spec.total_bytes
        )
        reread = Row(f"(i) read the same ref again, {spec.describe()}", spec.total_bytes)
        for rep in range(self.repeats):
            p_branch, _ = self.branches(repo, rep)
            out = work / f"perago-{rep}"
            # lakectl clones what Perago published, so Perago always goes first here.
            run = self.perago("cache", "--repo", repo, "--branch", p_branch, "--prefix", PREFIX,
                              "--dir", str(src), "--out", str(out))  # fmt: skip
            self.check_remote(repo, p_branch, spec)
            for step in ("chained", "reread"):  # the cache adopted the files: counted before
                if tuple(run[step]["tree"]) != (spec.files, spec.total_bytes):
                    raise BenchmarkError(f"(i) {step} read {run[step]['tree']}; expected {spec}")
            if run["cache_entries"] != spec.files:
                print(f"warning: (i) the cache kept {run['cache_entries']} of {spec.files} "
                      "files", file=sys.stderr)  # fmt: skip
            clones = []
            for n in range(2):
                l_out = work / f"lakectl-out-{rep}-{n}"
                clones.append(self.lakectl.clone(f"lakefs://{repo}/{p_branch}/{PREFIX}", l_out))
                self.check_local(l_out, spec)
                self.trash.discard(l_out)
            chained.add(
                Sample.of_perago(run["chained"], run["max_rss_kib"]), Sample.of_lakectl(clones[0])
            )
            reread.add(
                Sample.of_perago(run["reread"], run["max_rss_kib"]), Sample.of_lakectl(clones[1])
            )
            self.trash.discard(out)
        self.trash.discard(work)
        return [chained, reread]

    def cleanup(self) -> None:
        self.trash.empty()
        for repo in self.repos:
            try:
                self.store.delete_repository(repo)
            except PeragoError as e:
                print(f"warning: could not delete repository {repo}: {e}", file=sys.stderr)
        self.store.close()


# -- output -------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    head = (
        "| scenario | Perago s | lakectl s | lakectl/Perago | Perago MiB/s "
        "| Perago peak RSS MiB | lakectl peak RSS MiB |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rate = f"{r.mib_per_s:.1f}" if r.mib_per_s is not None else "-"
        lines.append(
            f"| {r.scenario} | {r.perago_s:.2f} | {r.lakectl_s:.2f} | {r.ratio:.2f} | {rate} "
            f"| {r.perago_rss_mib:.0f} | {r.lakectl_rss_mib:.0f} |"
        )
    return "\n".join(lines)


def roundtrip_table(rt: dict[str, Any]) -> str:
    lines = [
        f"| (d) no-op workflow, N={rt['perago']['runs']} | median ms | p90 ms "
        "| median poll wait ms | median worker ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for side, label in (("perago", "Perago worker (writable task)"), ("bare", "bare worker")):
        s = rt[side]
        lines.append(
            f"| {label} | {s['median_ms']:.0f} | {s['p90_ms']:.0f} "
            f"| {s['median_poll_wait_ms']:.0f} | {s['median_worker_ms']:.0f} |"
        )
    return "\n".join(lines)


#: Scenario names for ``--only``: (a)-(c) data, (d) Conductor round trip, (f) branch lease,
#: (h) task durations through Conductor, (i) the content cache.
SCENARIOS = ("a", "b", "c", "d", "lease", "h", "i")


def _merge_results(output: Path, partial_run: dict[str, Any], only: list[str]) -> dict[str, Any]:
    """A run of some scenarios replaces only their parts of an existing results file."""
    if not output.exists():
        return partial_run
    merged: dict[str, Any] = json.loads(output.read_text())
    ran = tuple(f"({key}) " for key in only if key in ("a", "b", "c", "i"))
    merged["rows"] = [
        r for r in merged.get("rows", []) if not r["scenario"].startswith(ran)
    ] + partial_run["rows"]
    for key in ("roundtrip", "lease_overhead", "task_duration"):
        if key in partial_run:
            merged[key] = partial_run[key]
    if "perago_baseline_rss_mib" in partial_run:
        merged["perago_baseline_rss_mib"] = partial_run["perago_baseline_rss_mib"]
    update = {k: partial_run[k] for k in ("date", "mode", "repeats", "machine", "total_seconds")}
    merged.setdefault("partial_updates", []).append({"only": only, **update})
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Perago vs lakectl local and a bare Conductor worker; see docs/benchmarks.md",
    )
    parser.add_argument("--quick", action="store_true", help="every size divided by 10")
    parser.add_argument(
        "--repeat",
        type=int,
        help="repetitions of each data comparison, medians reported (default 3, quick 1)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=SCENARIOS,
        metavar="NAME",
        help=f"run only this scenario (repeatable; one of {', '.join(SCENARIOS)}); the results "
        "replace only that scenario's part of an existing --output file",
    )
    parser.add_argument(
        "--stack",
        choices=("default", "s3"),
        default="default",
        help="s3: the data scenarios (a, b, c, i) on the S3 stack variant (versitygw and "
        "a lakeFS on it, perago_dev.s3_stack), with pre-signed transfers on both sides; its "
        "results go to benchmarks/results-s3.json unless --output says otherwise",
    )
    parser.add_argument(
        "--local-blockstore",
        action="store_true",
        help="Perago reads objects of the default stack's local blockstore directly "
        "(PERAGO_LAKEFS_LOCAL_BLOCKSTORE), as a worker beside lakeFS can; results go to "
        "benchmarks/results-local-blockstore.json unless --output says otherwise",
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.local_blockstore and args.stack != "default":
        parser.error("--local-blockstore needs the default stack (its blockstore is local)")
    if args.stack == "s3":
        data = {"a", "b", "c", "i"}
        if args.only and not set(args.only) <= data:
            parser.error("--stack s3 runs only the data scenarios a, b, c and i")
        args.only = args.only or sorted(data)
    if args.output is None:
        args.output = RESULTS_S3 if args.stack == "s3" else RESULTS
        if args.local_blockstore:
            args.output = RESULTS.with_name("results-local-blockstore.json")
    mode = "quick" if args.quick else "full"
    scale = SCALES[mode]
    repeats = args.repeat or (1 if args.quick else 3)
    only: list[str] = sorted(set(args.only or SCENARIOS), key=SCENARIOS.index)

    # The in-process Perago worker of (d) logs every protocol step; only problems matter here.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    started = time.monotonic()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as running:
        if args.stack == "s3":
            stack = running.enter_context(_s3_stack(Path(tempfile.mkdtemp(prefix="perago-s3-"))))
        else:
            stack = resolve_stack()
            if args.local_blockstore:
                from perago_dev.paths import stack_paths

                block = stack_paths().data / "lakefs" / "block"
                stack = Stack(
                    {**stack.env, "PERAGO_LAKEFS_LOCAL_BLOCKSTORE": str(block)},
                    stack.lakectl,
                    f"{stack.source}, Perago reading {block} directly",
                )
        return _run(args, stack, scale, repeats, only, mode, started, load_before)


@contextlib.contextmanager
def _s3_stack(work: Path) -> Iterator[Stack]:
    """The S3 stack variant as a benchmark :class:`Stack` (its lakectl: the default stack's)."""
    from perago_dev.paths import stack_paths
    from perago_dev.s3_stack import s3_stack

    try:
        with s3_stack(work) as s3:
            env = {
                "CONDUCTOR_SERVER_URL": "unused: the S3 variant runs data scenarios only",
                "LAKECTL_SERVER_ENDPOINT_URL": s3.lakefs_endpoint,
                "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": s3.access_key_id,
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": s3.secret_access_key,
            }
            yield Stack(
                env, stack_paths().bin / "lakectl", f"perago_dev.s3_stack (S3 {s3.s3_endpoint})"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(
    args: argparse.Namespace,
    stack: Stack,
    scale: Scale,
    repeats: int,
    only: list[str],
    mode: str,
    started: float,
    load_before: tuple[float, float, float],
) -> int:
    print(
        f"stack from {stack.source}: lakeFS {stack.env['LAKECTL_SERVER_ENDPOINT_URL']}, "
        f"Conductor {stack.env['CONDUCTOR_SERVER_URL']}, lakectl {stack.lakectl}",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="perago-bench-"))
    bench = Bench(stack, tmp, repeats=repeats)
    rows: list[Row] = []
    baseline: dict[str, Any] | None = None
    rt: dict[str, Any] | None = None
    lease: dict[str, Any] | None = None
    task_rows: dict[str, Any] | None = None
    creates: dict[str, float] = {}

    def disk(key: str) -> str:
        creates[key] = bench.trash.create_cost_us()
        return f"file creation {creates[key]:.0f} us"

    try:
        if any(key in only for key in ("a", "b", "c")):
            baseline = bench.perago("baseline")
        for key, spec, seed in (("a", scale.many, 1), ("b", scale.large, 2)):
            if key in only:
                print(f"({key}) {spec.describe()}, {repeats} repetition(s), {disk(key)} ...",
                      flush=True)  # fmt: skip
                rows += bench.new_tree(key, spec, seed)
        if "c" in only:
            print(f"(c) {scale.one_change.describe()}, {repeats} repetition(s), {disk('c')} ...",
                  flush=True)  # fmt: skip
            rows += bench.one_change(scale.one_change, 3)
        if "i" in only:
            print(f"(i) {scale.cached.describe()}, {repeats} repetition(s), {disk('i')} ...",
                  flush=True)  # fmt: skip
            rows += bench.cached(scale.cached, 4)
        if "h" in only:
            print(f"(h) task durations through Conductor, {repeats} repetition(s), {disk('h')} "
                  "...", flush=True)  # fmt: skip
            task_rows = task_duration.measure(
                bench.env,
                bench.lakectl,
                reads=scale.task_reads,
                writes=scale.task_writes,
                repeats=repeats,
                work_dir=tmp / "h",
            )
        if "d" in only:
            print(f"(d) {scale.workflows} no-op workflows per worker ...", flush=True)
            rt = roundtrip.measure(bench.env, runs=scale.workflows, work_dir=tmp / "work")
        if "lease" in only:
            print(
                f"(f) {scale.lease_runs} publications per side and path, leases off vs on ...",
                flush=True,
            )
            lease = lease_overhead.measure(
                bench.env, bench.store, bench.new_repo, runs=scale.lease_runs, work_dir=tmp / "f"
            )
    finally:
        bench.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    load_after = os.getloadavg()

    if rows:
        print()
        print(table(rows))
    if rt is not None:
        print()
        print(roundtrip_table(rt))
    if task_rows is not None:
        print()
        print("| (h) task duration in Conductor | Perago s | lakectl s | lakectl/Perago |")
        print("|---|---:|---:|---:|")
        for r in task_rows["rows"]:
            print(f"| {r['scenario']} | {r['perago_s']:.2f} | {r['lakectl_s']:.2f} "
                  f"| {r['ratio']:.2f} |")  # fmt: skip
    if lease is not None:
        print()
        print(lease_overhead.table(lease))
        print(
            "(f) Conductor is replaced by perago.testing.StaticLedger: the attempt fence's "
            "Conductor GET is excluded from both sides equally."
        )
    print()
    if baseline is not None:
        print(
            "Perago process baseline RSS (interpreter, imports, clients; no work): "
            f"{_mib(baseline['max_rss_kib']):.0f} MiB."
        )
    print(
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after; total {elapsed:.0f} s"
    )
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": mode,
        "repeats": repeats,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1m": {"before": load_before[0], "after": load_after[0]},
        },
        "stack": {
            "source": stack.source,
            "lakefs": stack.env["LAKECTL_SERVER_ENDPOINT_URL"],
            "conductor": stack.env["CONDUCTOR_SERVER_URL"],
            "lakectl": str(stack.lakectl),
        },
        "rows": [r.to_json() for r in rows],
        # us to create one empty file right before each scenario: on ext4 it grows up to 50x
        # for a minute after many deletes (anyone's, lakeFS's too), see benchmarks.common.Trash
        "file_create_us_before": creates,
        "total_seconds": elapsed,
    }
    if baseline is not None:
        results["perago_transfer_parallelism"] = baseline["parallelism"]
        results["lakectl_parallelism"] = "default (25)"
        results["perago_baseline_rss_mib"] = _mib(baseline["max_rss_kib"])
    if rt is not None:
        results["roundtrip"] = rt
    if task_rows is not None:
        results["task_duration"] = task_rows
    if lease is not None:
        results["lease_overhead"] = {
            "date": results["date"],
            "mode": mode,
            "load_average_1m": results["machine"]["load_average_1m"],
            **lease,
        }
    if args.only:
        results = _merge_results(args.output, results, only)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
