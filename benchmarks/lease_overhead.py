"""(f) What the branch lease adds to one publication: leases off vs the default backend.

The same small publication (one 1 KiB file changed) is published again and again through
:class:`perago.publish.Publisher` against the real lakeFS, once per side and run, on two
paths:

* **merge**: the target head is the input ref, so stage, (lease,) staged commit, attempt
  fence, publish fence, merge;
* **replacement**: the target head is an abandoned publication of an earlier attempt of the
  same step (published first, not timed), so Confirm is a hard reset to the staged commit.

With a lease, it is held from the staged commit through Confirm, and Confirm's write (merge
or reset) runs as the lease's guarded write (renewed, re-checked before and after); what
exactly is whatever :class:`~perago.publish.Publisher` does at the measured commit. Every
sample also counts the lakeFS operations of the publication and of the lease.

Sides: ``leases=None`` (the baseline) and the default backend, built exactly as the worker
builds it: ``perago.coord.factory.branch_leases(load(env), store)`` with no ``PERAGO_COORD_*``
set, i.e. lakeFS objects on the ``_perago_coord`` branch of the target repository.

A ``StaticLedger`` stands in for Conductor: the attempt fence's Conductor GET (two per
publication) is left out of both sides alike. The sides alternate which goes first in each
run, after untimed warm-up publications (the first lease creates the coordination branch and
the lease record; HTTP connections open).
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from benchmarks.common import ROOT, BenchmarkError, percentile
from perago.adapters.lakefs import LakeFSStore
from perago.config import load
from perago.coord.branch_leases import BranchLeases
from perago.coord.factory import branch_leases
from perago.core.orchestrator import TaskSnapshot
from perago.errors import NotFoundError
from perago.publish import AttemptIdentity, Publisher, WorkspaceTarget
from perago.testing import StaticLedger
from perago.workspace import Diff

__all__ = ["PATHS", "SIDES", "measure", "table"]

PREFIX = "data/"
FILE = "out.bin"
FILE_SIZE = 1024
WORKER_ID = "bench-lease-worker"
#: side -> label in the table
SIDES = {"off": "leases off", "lakefs": "branch lease, lakeFS objects (default)"}
#: path -> label in the table
PATHS = {"merge": "merge", "replace": "replacement (hard reset)"}
_TOKEN_KEY = "perago.fencing_token"
_ATTEMPTS = 5


class CountingStore:
    """Forwards to a :class:`LakeFSStore` and counts its public calls (lakeFS operations)."""

    def __init__(self, store: LakeFSStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if name.startswith("_") or not callable(value):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return value(*args, **kwargs)

        return counted

    def take(self) -> Counter[str]:
        with self._lock:
            calls, self.calls = self.calls, Counter()
        return calls


class _Side:
    """One configuration: its publisher, its target branches and the call counters."""

    def __init__(
        self,
        name: str,
        store: LakeFSStore,
        leases: BranchLeases | None,
        repo: str,
        workspace: Path,
    ) -> None:
        self.name = name
        self.repo = repo
        self.workspace = workspace
        self.store = store
        self.publication_store = CountingStore(store)
        self.leases = leases
        self.ledger = StaticLedger()
        self.samples: dict[str, list[float]] = {p: [] for p in PATHS}
        self.calls: dict[str, list[Counter[str]]] = {p: [] for p in PATHS}
        self.redone: dict[str, list[str]] = {p: [] for p in PATHS}
        self._rng = random.Random(f"{name}-{repo}")
        workspace.mkdir(parents=True)
        self.log = structlog.get_logger("benchmarks.lease").bind(side=name)

    def branch(self, path: str) -> str:
        return f"{path}-{self.name}"

    def _attempt(self, workflow: str, retry: int) -> AttemptIdentity:
        me = AttemptIdentity(
            workflow_id=workflow,
            reference_name="step",
            task_id=f"bench-{uuid.uuid4().hex}",
            retry_count=retry,
            poll_count=1,
            task_type="bench_lease",
        )
        # No Conductor: the attempt fence reads "IN_PROGRESS, yours" from this ledger.
        self.ledger.snapshots[me.task_id] = TaskSnapshot(
            task_id=me.task_id,
            task_type=me.task_type,
            reference_name=me.reference_name,
            workflow_id=me.workflow_id,
            status="IN_PROGRESS",
            retry_count=retry,
            poll_count=1,
            worker_id=WORKER_ID,
            response_timeout_seconds=0,
            input={},
        )
        return me

    def _publish(self, me: AttemptIdentity, branch: str, input_ref: str) -> tuple[str, float]:
        """One publication of a freshly rewritten file; (new head, seconds of ``publish``)."""
        (self.workspace / FILE).write_bytes(self._rng.randbytes(FILE_SIZE))
        publisher = Publisher(
            self.publication_store,  # a counting proxy of the store
            self.ledger,
            worker_id=WORKER_ID,
            leases=self.leases,
        )
        target = WorkspaceTarget(self.repo, branch, input_ref)
        started = time.perf_counter()
        publication = publisher.publish(me, target, PREFIX, self.workspace, Diff(changed=(FILE,)))
        seconds = time.perf_counter() - started
        publication.release(wait=True)  # no report follows here
        return publication.ref, seconds

    def run(self, path: str, counted: bool, lease_store: CountingStore) -> None:
        """One publication on ``path``, done again if a janitor took its staging branch.

        A Perago worker's start-up janitor pass (any worker on the same lakeFS) deletes every
        ``perago-stg-*`` branch whose task Conductor does not know, which includes this
        benchmark's: such a publication fails with 404 before it lands and is done again from
        the branch's current head; it is counted in ``redone``, never sampled.
        """
        once = self._merge if path == "merge" else self._replace
        for _ in range(_ATTEMPTS - 1):
            try:
                seconds, calls = once(lease_store)
                break
            except NotFoundError as e:
                self.redone[path].append(str(e)[:300])
                print(f"warning: ({self.name}, {path}) redone: {e}", file=sys.stderr)
        else:
            seconds, calls = once(lease_store)
        if counted:
            self.samples[path].append(seconds)
            self.calls[path].append(calls)

    def _merge(self, lease_store: CountingStore) -> tuple[float, Counter[str]]:
        branch = self.branch("merge")
        store = self.store
        base = store.branch_head(self.repo, branch)
        self._reset_counts(lease_store)
        ref, seconds = self._publish(self._attempt(f"wf-{uuid.uuid4().hex[:12]}", 0), branch, base)
        calls = self._take_counts(lease_store)
        commit = store.get_commit(self.repo, ref)
        if len(commit.parents) != 2 or commit.parents[0] != base:
            raise BenchmarkError(
                f"{self.name}: expected a merge commit on {base[:12]}, got {ref[:12]} with "
                f"parents {commit.parents}"
            )
        self._check_token(commit.metadata, ref)
        return seconds, calls

    def _replace(self, lease_store: CountingStore) -> tuple[float, Counter[str]]:
        branch = self.branch("replace")
        store = self.store
        base = store.branch_head(self.repo, branch)
        workflow = f"wf-{uuid.uuid4().hex[:12]}"
        # Not timed: attempt 0 publishes and is then abandoned (its answer never reached
        # Conductor); its retry starts from the same input ref and finds it on the head.
        abandoned, _ = self._publish(self._attempt(workflow, 0), branch, base)
        self._reset_counts(lease_store)
        ref, seconds = self._publish(self._attempt(workflow, 1), branch, base)
        calls = self._take_counts(lease_store)
        commit = store.get_commit(self.repo, ref)
        head = store.branch_head(self.repo, branch)
        if head != ref or commit.parents != (base,) or ref == abandoned:
            raise BenchmarkError(
                f"{self.name}: expected the head of {branch} to be the retry's staged commit on "
                f"{base[:12]}, got head {head[:12]}, parents {commit.parents}"
            )
        self._check_token(commit.metadata, ref)
        return seconds, calls

    def _check_token(self, metadata: Mapping[str, str], ref: str) -> None:
        has_token = _TOKEN_KEY in metadata
        if has_token != (self.leases is not None):
            raise BenchmarkError(
                f"{self.name}: commit {ref[:12]} {'has' if has_token else 'lacks'} a fencing "
                "token: the lease configuration is not what this side is meant to measure"
            )

    def _reset_counts(self, lease_store: CountingStore) -> None:
        self.publication_store.take()
        lease_store.take()

    def _take_counts(self, lease_store: CountingStore) -> Counter[str]:
        calls = self.publication_store.take()
        if self.leases is not None:
            calls.update({f"lease.{k}": v for k, v in lease_store.take().items()})
        return calls


def _summary(seconds: list[float], calls: list[Counter[str]]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    lease_calls = [sum(v for k, v in c.items() if k.startswith("lease.")) for c in calls]
    all_calls = [sum(c.values()) for c in calls]
    return {
        "runs": len(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": percentile(ms, 90),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "samples_ms": ms,
        "median_lakefs_calls": statistics.median(all_calls),
        "median_lease_lakefs_calls": statistics.median(lease_calls),
        "lakefs_calls_first_run": dict(sorted(calls[0].items())),
    }


def _source_state() -> dict[str, Any]:
    """The commit measured, and whether perago/ had uncommitted changes at the time."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "perago_dirty": bool(git("status", "--porcelain", "--", "perago")),
    }


def measure(
    env: Mapping[str, str],
    store: LakeFSStore,
    new_repo: Callable[[str], str],
    *,
    runs: int,
    work_dir: Path,
    warmup: int = 2,
) -> dict[str, Any]:
    """Publish ``warmup + runs`` times per side and path; samples of the last ``runs``."""
    source = _source_state()
    # The default settings: whatever PERAGO_COORD_* the caller's environment has is ignored.
    settings = load(
        {k: v for k, v in env.items() if not k.startswith("PERAGO_COORD_")},
        coord_backend="lakefs",
    )
    lease_store = CountingStore(store)
    leases = branch_leases(settings, lease_store)  # a counting proxy
    if leases is None:
        raise BenchmarkError("branch_leases() returned None for the default (lakefs) backend")
    repo = new_repo("f")
    sides = [
        _Side("off", store, None, repo, work_dir / "off"),
        _Side("lakefs", store, leases, repo, work_dir / "lakefs"),
    ]
    for side in sides:
        for path in PATHS:
            store.create_branch(repo, side.branch(path), "main")
    for i in range(warmup + runs):
        order = sides if i % 2 == 0 else sides[::-1]
        counted = i >= warmup
        for path in PATHS:
            for side in order:
                side.run(path, counted, lease_store)
    result: dict[str, Any] = {
        "runs": runs,
        "warmup": warmup,
        "repository": repo,
        "file_bytes": FILE_SIZE,
        "backend": settings.coord_backend,
        "lease_ttl_s": settings.lease_ttl.total_seconds(),
        "max_clock_skew_rate": settings.max_clock_skew_rate,
        "ledger": "perago.testing.StaticLedger: the attempt fence's Conductor GET is excluded "
        "from both sides",
        "source": source,
        "paths": {},
    }
    for path in PATHS:
        entry = {
            s.name: {**_summary(s.samples[path], s.calls[path]), "redone": s.redone[path]}
            for s in sides
        }
        base = entry["off"]
        for name in SIDES:
            entry[name]["ratio_median_vs_off"] = entry[name]["median_ms"] / base["median_ms"]
            entry[name]["ratio_p90_vs_off"] = entry[name]["p90_ms"] / base["p90_ms"]
            entry[name]["added_median_ms"] = entry[name]["median_ms"] - base["median_ms"]
        result["paths"][path] = entry
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        f"| (f) publication of 1 changed file, N={result['runs']} | median ms | p90 ms "
        "| median / leases off | + median ms | lakeFS calls (of which lease) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for path, path_label in PATHS.items():
        for side, side_label in SIDES.items():
            s = result["paths"][path][side]
            lines.append(
                f"| {path_label}, {side_label} | {s['median_ms']:.0f} | {s['p90_ms']:.0f} "
                f"| {s['ratio_median_vs_off']:.2f} | {s['added_median_ms']:+.0f} "
                f"| {s['median_lakefs_calls']:.0f} ({s['median_lease_lakefs_calls']:.0f}) |"
            )
    redone = sum(len(s["redone"]) for e in result["paths"].values() for s in e.values())
    if redone:
        lines.append(
            f"\n{redone} publication(s) redone, not sampled: their staging branch was deleted "
            "(another worker's janitor pass)"
        )
    return "\n".join(lines)
