"""Remove what killed workers leave behind: staging branches and expired branch leases.

A staging branch is named after its attempt (``perago-stg-<task id>-p<poll count>``, or
``perago-<cluster id>-stg-...`` with ``PERAGO_CLUSTER_ID``), so Conductor says whether the
attempt is over. A pass only looks at its own cluster's staging branches (another Conductor
does not know their tasks), optionally narrowed to repositories and a branch-name pattern.
A branch whose task is still IN_PROGRESS with the same poll count belongs to a live attempt
and is never touched.

A branch lease is removed only when released, or when this process watched it unchanged for
its takeover time (ttl x clock-skew rate): Conductor's view of the holder's attempt is not
enough, since a paused holder may still be inside its write window.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

import structlog

from perago.config import Settings
from perago.coord.branch_leases import BranchLeases
from perago.coord.lease import LeaseRecord
from perago.core.lakefs_names import wap_prefix
from perago.core.orchestrator import AttemptLedger, TaskSnapshot, WorkflowLedger
from perago.core.store import VersionStore
from perago.errors import ConfigError
from perago.publish.deliveries import RECORD_KEEP, EndedRecords
from perago.publish.identity import staging_prefix
from perago.telemetry import metrics

__all__ = ["JanitorReport", "parse_duration", "sweep", "sweep_leases", "takeover_watch"]

log = structlog.get_logger("perago.publish.janitor")
_STAGING = re.compile(r"^(?P<task>.+)-p(?P<poll>\d+)$")  # after the cluster's prefix
_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[smhd]?)$")


def parse_duration(text: str) -> timedelta:
    """'90s', '10m', '2h', '1d' (a bare number is seconds)."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ConfigError(f"duration {text!r} is not like 90s, 10m, 2h or 1d")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m["unit"]]
    return timedelta(seconds=float(m["n"]) * scale)


@dataclass
class JanitorReport:
    removed: list[tuple[str, str, str]] = field(default_factory=list)
    kept: list[tuple[str, str, str]] = field(default_factory=list)


def _verdict(task: TaskSnapshot | None, poll: int, older_than: timedelta, now: float) -> str | None:
    """Why the branch may go, or None if it must stay."""
    if task is None:
        return "attempt unknown to Conductor"
    age = now - task.update_time_ms / 1000 if task.update_time_ms else float("inf")
    if task.terminal:
        return f"attempt {task.status}" if age >= older_than.total_seconds() else None
    if task.poll_count != poll and age >= older_than.total_seconds():
        return f"superseded delivery (task now at poll {task.poll_count})"
    return None


def sweep_wap(
    store: VersionStore,
    ledger: WorkflowLedger,
    *,
    repositories: Iterable[str],
    cluster_id: str = "",
    keep_wap: bool = False,
) -> JanitorReport:
    """Only the isolated branches of write-audit-publish workflows that ended, in any state
    (the worker's periodic pass, ``PERAGO_WAP_SWEEP_INTERVAL``)."""
    report = JanitorReport()
    _sweep_wap(store, ledger, repositories, cluster_id, None, keep_wap, False, report)
    return report


def sweep(
    store: VersionStore,
    ledger: AttemptLedger,
    *,
    repositories: Iterable[str],
    dry_run: bool = False,
    older_than: timedelta = timedelta(0),
    clock: Callable[[], float] = time.time,
    cluster_id: str = "",
    branch_pattern: str | None = None,
    keep_wap: bool = False,
) -> JanitorReport:
    """Remove the staging branches of ``cluster_id`` whose attempts are over (optionally only
    those matching the glob ``branch_pattern``), and the isolated branches of its
    write-audit-publish workflows that ended (unless ``keep_wap``)."""
    report = JanitorReport()
    if isinstance(ledger, WorkflowLedger):
        _sweep_wap(
            store, ledger, repositories, cluster_id, branch_pattern, keep_wap, dry_run, report
        )
    prefix = staging_prefix(cluster_id)
    for repo in repositories:
        for branch, _ in store.list_branches(repo, prefix=prefix):
            m = _STAGING.match(branch.removeprefix(prefix))
            if not m or (branch_pattern and not fnmatch.fnmatchcase(branch, branch_pattern)):
                continue
            reason = _verdict(ledger.get_task(m["task"]), int(m["poll"]), older_than, clock())
            if reason is None:
                report.kept.append((repo, branch, "live or too recent"))
                continue
            if not dry_run:
                store.delete_branch(repo, branch)
                metrics.JANITOR_REMOVALS.labels("staging_branch").inc()
            report.removed.append((repo, branch, reason))
            log.info(
                "janitor_would_remove" if dry_run else "janitor_removed",
                repository=repo,
                staging_branch=branch,
                reason=reason,
            )
    return report


#: Workflow states in which a write-audit-publish branch is still in use.
_LIVE_WORKFLOW = frozenset({"RUNNING", "PAUSED"})


def _sweep_wap(
    store: VersionStore,
    ledger: WorkflowLedger,
    repositories: Iterable[str],
    cluster_id: str,
    branch_pattern: str | None,
    keep: bool,
    dry_run: bool,
    report: JanitorReport,
) -> None:
    prefix = wap_prefix(cluster_id)
    for repo in repositories:
        for branch, _ in store.list_branches(repo, prefix=prefix):
            if branch_pattern and not fnmatch.fnmatchcase(branch, branch_pattern):
                continue
            status = ledger.workflow_status(branch.removeprefix(prefix))
            if status in _LIVE_WORKFLOW:
                report.kept.append((repo, branch, f"workflow {status}"))
                continue
            if keep:
                report.kept.append((repo, branch, "kept for inspection (PERAGO_WAP_KEEP_BRANCH)"))
                continue
            reason = f"workflow {status}" if status else "workflow unknown to Conductor"
            if not dry_run:
                store.delete_branch(repo, branch)
                metrics.JANITOR_REMOVALS.labels("wap_branch").inc()
            report.removed.append((repo, branch, reason))
            event = "janitor_would_remove" if dry_run else "janitor_removed"
            log.info(event, repository=repo, wap_branch=branch, reason=reason)


def takeover_watch(settings: Settings) -> timedelta:
    """How long to watch a held lease before calling it expired: its takeover time + 1 s."""
    return settings.lease_ttl * settings.max_clock_skew_rate + timedelta(seconds=1)


def sweep_leases(
    leases: BranchLeases,
    *,
    repositories: Iterable[str],
    dry_run: bool = False,
    watch: timedelta = timedelta(0),
    sleep: Callable[[float], object] = time.sleep,
) -> JanitorReport:
    """Remove released branch leases, and held ones watched unchanged for ``watch``; and the
    records of superseded deliveries once nothing reads them (``perago.publish.deliveries``).

    With ``watch`` shorter than the takeover time (ttl x clock-skew rate) only released leases
    go; with a long enough watch, so does a lease whose holder died.
    """
    report = JanitorReport()
    managers = {repo: leases.manager(repo) for repo in repositories}

    def look() -> dict[str, list[LeaseRecord]]:
        # Each look also (re)starts the manager's watch of every held lease it sees (a
        # changed one), so a fresh janitor's second look can find a silent holder.
        seen = {repo: m.records(f"branches/{repo}/") for repo, m in managers.items()}
        for repo, records in seen.items():
            for record in records:
                managers[repo].is_expired(record)
        return seen

    seen = look()
    if watch > timedelta(0) and any(r.held for records in seen.values() for r in records):
        log.info("janitor_watching_leases", seconds=watch.total_seconds())
        sleep(watch.total_seconds())
        seen = look()
    for repo, records in seen.items():
        manager = managers[repo]
        for record in records:
            if not manager.is_expired(record):
                report.kept.append((repo, record.name, f"held by {record.owner}"))
                continue
            reason = f"holder {record.owner} silent" if record.held else "released"
            if not dry_run:
                if not manager.remove(record):
                    continue  # renewed or taken meanwhile: it stays
                metrics.JANITOR_REMOVALS.labels("lease").inc()
            report.removed.append((repo, record.name, reason))
            log.info(
                "janitor_would_remove_lease" if dry_run else "janitor_removed_lease",
                repository=repo,
                lease=record.name,
                reason=reason,
            )
    ended = EndedRecords(lambda repo: managers[repo].store, worker_id="janitor")
    for repo in managers:
        for key in ended.sweep(repo, dry_run=dry_run):
            if not dry_run:
                metrics.JANITOR_REMOVALS.labels("delivery_record").inc()
            report.removed.append((repo, key, f"older than {RECORD_KEEP}"))
            log.info(
                "janitor_would_remove_delivery_record"
                if dry_run
                else "janitor_removed_delivery_record",
                repository=repo,
                record=key,
            )
    return report
