"""The audit: what Conductor and lakeFS recorded, checked against the protocol's promises.

Everything here is read from the servers after the run (plus the branch heads and foreign
commits the run sampled), never from the workers' own logs.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from perago.adapters.conductor import ConductorClient
from perago.config import Settings

__all__ = ["Figures", "Run", "audit", "percentile"]

_PUBLICATION_KINDS = ("publication", "staged")
_TERMINAL_WF = ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED")


@dataclass(frozen=True)
class Run:
    workflow_id: str
    kind: str
    repository: str
    branch: str
    input_ref: str


@dataclass
class Figures:
    workflows: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    steps: int = 0
    attempts: Counter[str] = field(default_factory=Counter)
    publications: int = 0
    double_publications: list[str] = field(default_factory=list)
    lost_publications: list[str] = field(default_factory=list)
    publications_without_completed_step: list[str] = field(default_factory=list)
    foreign_commits: int = 0
    foreign_commits_replaced: list[str] = field(default_factory=list)
    orphan_staging_branches: list[str] = field(default_factory=list)
    leases_held: list[str] = field(default_factory=list)
    commits_checked: int = 0
    unreachable_commits: list[str] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    attempt_seconds: list[float] = field(default_factory=list)

    def violations(self) -> int:
        return sum(
            len(x)
            for x in (
                self.double_publications,
                self.lost_publications,
                self.foreign_commits_replaced,
                self.orphan_staging_branches,
                self.leases_held,
                self.unreachable_commits,
            )
        )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


class _LakeFS:
    """Raw reads of lakeFS (tags and whole-DAG logs are not in Perago's store interface)."""

    def __init__(self, settings: Settings) -> None:
        self._http = httpx.Client(
            base_url=settings.lakefs_api_url,
            auth=(
                settings.lakefs_access_key_id,
                settings.lakefs_secret_access_key.get_secret_value(),
            ),
            timeout=60,
        )

    def _pages(self, path: str, **params: Any) -> Iterable[dict[str, Any]]:
        after = ""
        while True:
            r = self._http.get(path, params={**params, "after": after, "amount": 1000})
            r.raise_for_status()
            body = r.json()
            yield from body["results"]
            if not body["pagination"]["has_more"]:
                return
            after = body["pagination"]["next_offset"]

    def refs(self, repo: str, kind: str) -> dict[str, str]:
        return {x["id"]: x["commit_id"] for x in self._pages(f"/repositories/{repo}/{kind}")}

    def log(self, repo: str, ref: str, *, first_parent: bool) -> list[dict[str, Any]]:
        return list(
            self._pages(
                f"/repositories/{repo}/refs/{ref}/commits",
                first_parent=str(first_parent).lower(),
            )
        )


def _steps(conductor: ConductorClient, workflow_id: str) -> tuple[str, list[dict[str, Any]]]:
    """The workflow's status and its SIMPLE tasks, sub-workflows' included."""
    wf = conductor.get_workflow(workflow_id)
    tasks: list[dict[str, Any]] = []
    for t in wf.get("tasks", []):
        if t.get("taskType") == "SUB_WORKFLOW" and t.get("subWorkflowId"):
            tasks.extend(_steps(conductor, t["subWorkflowId"])[1])
        elif t.get("taskType") in ("chaos_write", "chaos_read", "chaos_part"):
            tasks.append(t)
    return str(wf.get("status")), tasks


def audit(
    settings: Settings,
    conductor: ConductorClient,
    runs: list[Run],
    *,
    sampled_heads: dict[tuple[str, str], set[str]],
    foreign: list[tuple[str, str, str]],
    leases_held: list[str],
) -> Figures:
    lakefs = _LakeFS(settings)
    f = Figures()
    first_parent: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        first_parent[(run.repository, run.branch)] = lakefs.log(
            run.repository, run.branch, first_parent=True
        )
    reported: set[tuple[str, str]] = set()  # (workflow id, step) with a COMPLETED writer
    must_reach: dict[str, set[str]] = {}
    for run in runs:
        status, tasks = _steps(conductor, run.workflow_id)
        f.workflows[status if status in _TERMINAL_WF else "RUNNING"] += 1
        f.kinds[run.kind] += 1
        history = first_parent[(run.repository, run.branch)]
        on_branch = {c["id"]: c for c in history}
        by_step: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for t in tasks:
            by_step.setdefault((t["workflowInstanceId"], t["referenceTaskName"]), []).append(t)
            f.attempts[t["status"]] += 1
            if t.get("startTime") and t.get("endTime"):
                f.attempt_seconds.append((t["endTime"] - t["startTime"]) / 1000)
        for (wid, ref), attempts in by_step.items():
            f.steps += 1
            attempts.sort(key=lambda t: (t.get("retryCount", 0), t.get("seq", 0)))
            last = attempts[-1]
            if last["status"] != "COMPLETED":
                continue
            f.step_seconds.append((last["endTime"] - attempts[0]["scheduledTime"]) / 1000)
            if last["taskType"] not in ("chaos_write", "chaos_part"):
                continue
            reported.add((wid, ref))
            out = (last.get("outputData") or {}).get("workspace", {}).get("ref", "")
            must_reach.setdefault(run.repository, set()).add(out)
            commit = on_branch.get(out)
            meta = (commit or {}).get("metadata") or {}
            if commit is None or (meta.get("perago.workflow_id"), meta.get("perago.task_ref")) != (
                wid,
                ref,
            ):
                f.lost_publications.append(f"{run.repository}/{run.branch} {wid} {ref} -> {out}")
        keys: Counter[tuple[str, str, str]] = Counter()
        # A scoped replacement (a retry inside a fan-out) names what it supersedes.
        replaced = {
            r
            for c in history
            for r in ((c.get("metadata") or {}).get("perago.replaces") or "").split(",")
            if r
        }
        for c in history:
            meta = c.get("metadata") or {}
            if meta.get("perago.kind") in _PUBLICATION_KINDS and c["id"] not in replaced:
                f.publications += 1
                key = (
                    meta["perago.workflow_id"],
                    meta["perago.task_ref"],
                    meta["perago.input_ref"],
                )
                keys[key] += 1
                must_reach.setdefault(run.repository, set()).add(c["id"])
        f.double_publications += [f"{run.branch} {k} x{n}" for k, n in keys.items() if n > 1]
        for wid, ref, _ in keys:
            if (wid, ref) not in reported:
                f.publications_without_completed_step.append(f"{run.branch} {wid} {ref}")
    for repo, branch, foreign_id in foreign:
        f.foreign_commits += 1
        if foreign_id not in {c["id"] for c in first_parent.get((repo, branch), [])}:
            f.foreign_commits_replaced.append(f"{repo}/{branch} {foreign_id}")
    for (repo, _), heads in sampled_heads.items():
        must_reach.setdefault(repo, set()).update(heads)
    for repo, commits in must_reach.items():
        reachable: set[str] = set()
        for kind in ("branches", "tags"):
            for commit_id in set(lakefs.refs(repo, kind).values()):
                if commit_id not in reachable:
                    reachable.update(
                        c["id"] for c in lakefs.log(repo, commit_id, first_parent=False)
                    )
        f.commits_checked += len(commits)
        f.unreachable_commits += [f"{repo} {c}" for c in sorted(commits - reachable)]
        for name in lakefs.refs(repo, "branches"):
            if name.startswith("perago-stg-"):
                f.orphan_staging_branches.append(f"{repo}/{name}")
    f.leases_held = leases_held
    return f
