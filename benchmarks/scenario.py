"""The Perago side of one data scenario, in its own process (so ``ru_maxrss`` is its own).

    python -m benchmarks.scenario publish     --repo R --branch B --prefix P --dir D
    python -m benchmarks.scenario materialize --repo R --ref REF --prefix P --dir D
    python -m benchmarks.scenario edit        --repo R --branch B --prefix P --dir D \\
                                               --change REL --content FILE
    python -m benchmarks.scenario cache       --repo R --branch B --prefix P --dir D --out O
    python -m benchmarks.scenario baseline

Each prints one JSON object on stdout: timings measured inside the process (imports and
interpreter start excluded), what moved, and the peak RSS in KiB. The stack comes from the
environment (``perago.config.load()``).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import structlog

from benchmarks.common import tree_stats
from perago.adapters.lakefs import LakeFSStore
from perago.config import Settings, load
from perago.core.orchestrator import TaskSnapshot
from perago.publish import AttemptIdentity, Publisher, WorkspaceTarget
from perago.testing import StaticLedger
from perago.workspace import ContentCache, Manifest, compute_diff, materialize


def _max_rss_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _publish(
    settings: Settings,
    store: LakeFSStore,
    *,
    repo: str,
    branch: str,
    prefix: str,
    root: Path,
    manifest: Manifest,
    cache: ContentCache | None = None,
) -> dict[str, Any]:
    """Diff ``root`` against ``manifest`` and publish it onto ``branch`` (stage, fence, merge)."""
    input_ref = store.branch_head(repo, branch)
    task_id = f"bench-{uuid.uuid4().hex}"
    me = AttemptIdentity(
        workflow_id=f"bench-wf-{uuid.uuid4().hex[:12]}",
        reference_name="bench",
        task_id=task_id,
        retry_count=0,
        poll_count=1,
        task_type="bench_publish",
    )
    # No Conductor here: the attempt fence reads a ledger that always answers "this attempt
    # is still IN_PROGRESS and yours". Fine for a benchmark (it skips one HTTP round trip to
    # Conductor per fence, two per publication); a worker asks the real server.
    ledger = StaticLedger(
        TaskSnapshot(
            task_id=task_id,
            task_type=me.task_type,
            reference_name=me.reference_name,
            workflow_id=me.workflow_id,
            status="IN_PROGRESS",
            retry_count=0,
            poll_count=1,
            worker_id=settings.worker_id,
            response_timeout_seconds=0,
            input={},
        )
    )
    publisher = Publisher(
        store,
        ledger,
        worker_id=settings.worker_id,
        parallelism=settings.transfer_parallelism,
        cache=cache,
    )

    cpu = _cpu_s()
    started = time.perf_counter()
    diff = compute_diff(manifest, root)
    diffed = time.perf_counter()
    ref = publisher.publish(me, WorkspaceTarget(repo, branch, input_ref), prefix, root, diff).ref
    done = time.perf_counter()
    return {
        "seconds": done - started,
        "cpu_s": _cpu_s() - cpu,
        "diff_seconds": diffed - started,
        "publish_seconds": done - diffed,
        "uploaded_files": len(diff.uploads),
        "uploaded_bytes": sum((root / p).stat().st_size for p in diff.uploads),
        "input_ref": input_ref,
        "ref": ref,
    }


def _adopt(cache: ContentCache, root: Path) -> float:
    """The cache adopts ``root``'s files, as a worker does after the report; the seconds."""
    started = time.perf_counter()
    cache.adopt(root)
    return time.perf_counter() - started


def _materialize(
    settings: Settings,
    store: LakeFSStore,
    *,
    repo: str,
    ref: str,
    prefix: str,
    root: Path,
    cache: ContentCache | None = None,
) -> tuple[Manifest, dict[str, Any]]:
    root.mkdir(parents=True, exist_ok=False)
    cpu = _cpu_s()
    started = time.perf_counter()
    manifest = materialize(
        store, repo, ref, prefix, root, parallelism=settings.transfer_parallelism, cache=cache
    )
    seconds = time.perf_counter() - started
    return manifest, {
        "seconds": seconds,
        "cpu_s": _cpu_s() - cpu,
        "files": len(manifest.entries),
        "bytes": manifest.total_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scenario")
    parser.add_argument("op", choices=["publish", "materialize", "edit", "cache", "baseline"])
    parser.add_argument("--out", type=Path, help="cache: where the two reads go")
    parser.add_argument("--repo")
    parser.add_argument("--branch")
    parser.add_argument("--ref")
    parser.add_argument("--prefix")
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--change", help="workspace-relative path the edit step rewrites")
    parser.add_argument("--content", type=Path, help="new content of --change")
    args = parser.parse_args(argv)

    # Perago's protocol events would otherwise go to stdout, where the result goes.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    settings = load()
    store = LakeFSStore(settings)
    result: dict[str, Any] = {"op": args.op, "parallelism": settings.transfer_parallelism}
    try:
        if args.op == "publish":
            result.update(
                _publish(
                    settings,
                    store,
                    repo=args.repo,
                    branch=args.branch,
                    prefix=args.prefix,
                    root=args.dir,
                    manifest=Manifest(),  # a fresh target: every file is new
                )
            )
        elif args.op == "materialize":
            _, result["materialize"] = _materialize(
                settings, store, repo=args.repo, ref=args.ref, prefix=args.prefix, root=args.dir
            )
            result.update(result.pop("materialize"))
        elif args.op == "cache":
            # One worker process: publish (its uploads are vouched for), then read what it
            # just published, then read that ref again. Between steps the cache adopts the
            # step's files, as a worker does once the attempt is reported (timed apart).
            cache = ContentCache(args.out / "cache", max_bytes=settings.cache_bytes)
            attempt = args.out / "publish"
            shutil.copytree(args.dir, attempt)  # adopting moves the files: keep --dir intact
            result["publish"] = _publish(
                settings,
                store,
                repo=args.repo,
                branch=args.branch,
                prefix=args.prefix,
                root=attempt,
                manifest=Manifest(),
                cache=cache,
            )
            result["publish"]["adopt_seconds"] = _adopt(cache, attempt)
            ref = result["publish"]["ref"]
            for step in ("chained", "reread"):
                _, result[step] = _materialize(
                    settings,
                    store,
                    repo=args.repo,
                    ref=ref,
                    prefix=args.prefix,
                    root=args.out / step,
                    cache=cache,
                )
                result[step]["tree"] = tree_stats(args.out / step)  # before it moves away
                result[step]["adopt_seconds"] = _adopt(cache, args.out / step)
            result["cache_entries"] = len(cache)
            cache.close()
        elif args.op == "edit":
            # What a writable attempt does: materialize, change one file, diff, publish.
            input_ref = store.branch_head(args.repo, args.branch)
            manifest, result["materialize"] = _materialize(
                settings, store, repo=args.repo, ref=input_ref, prefix=args.prefix, root=args.dir
            )
            result["materialize"]["max_rss_kib"] = _max_rss_kib()
            shutil.copyfile(args.content, args.dir / args.change)
            result["publish"] = _publish(
                settings,
                store,
                repo=args.repo,
                branch=args.branch,
                prefix=args.prefix,
                root=args.dir,
                manifest=manifest,
            )
    finally:
        store.close()
    result["max_rss_kib"] = _max_rss_kib()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
