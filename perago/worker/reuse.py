"""Incremental re-runs: whether an attempt of an ``incremental`` task may answer with its
step's earlier publication instead of running its body (docs/tasks.md, "Incremental
re-runs").

Every publication of an incremental task records what its output was a function of: the
code version, a digest of the params and the result (``record``). An attempt reuses the
newest such publication of its task type and scope on the history of its input ref when
the code version and the params are the same, every named input has the same content at
its prefix as when that publication read it, and the scope holds exactly what that
publication left there. Anything else, or anything that cannot be checked, runs the body.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from perago._api.inputs import ResolvedInput
from perago._api.task import TaskDefinition
from perago.core import lakefs_names as names
from perago.core.store import Commit, VersionStore
from perago.errors import NotFoundError
from perago.publish.first_parents import FirstParents
from perago.publish.identity import WorkspaceTarget

__all__ = ["HISTORY_LIMIT", "Reuse", "find_reusable", "record"]

_KEY = names.METADATA_PREFIX
#: How many commits of first-parent history (and of each write-audit-publish branch it
#: passes) are searched for the step's last publication.
HISTORY_LIMIT = 1000
#: A result larger than this (JSON characters) is not recorded: its step always runs.
RESULT_LIMIT = 8192


def params_digest(params: BaseModel) -> str:
    """The params, compared canonically (key order and formatting do not count)."""
    text = json.dumps(params.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def record(defn: TaskDefinition[Any, Any], params: BaseModel, result: BaseModel) -> dict[str, str]:
    """The commit metadata an incremental task's publication carries for later re-runs."""
    out = {
        f"{_KEY}code_version": defn.code_version,
        f"{_KEY}params_digest": params_digest(params),
    }
    text = result.model_dump_json()
    if len(text) <= RESULT_LIMIT:
        out[f"{_KEY}result"] = text
    return out


@dataclass(frozen=True)
class Reuse:
    """The earlier publication an attempt answers with, and its result."""

    commit: Commit
    result: BaseModel

    def as_output(self) -> dict[str, str]:
        m = self.commit.metadata
        return {
            "commit": self.commit.id,
            "workflow_id": m.get(f"{_KEY}workflow_id", ""),
            "task_id": m.get(f"{_KEY}task_id", ""),
        }


@dataclass(frozen=True)
class Verdict:
    """What the check found: a publication to reuse, or why the body runs."""

    reuse: Reuse | None
    reason: str
    #: The earlier publication looked at ("" when none was found).
    candidate: str = ""


def _history(history: FirstParents, repository: str, ref: str) -> Iterator[Commit]:
    """``ref``'s first-parent history, newest first; through a write-audit-publish
    publication, the history of the isolated branch it published (kept by its tag) down to
    where that branch began."""
    for commit in history.walk(repository, ref, limit=HISTORY_LIMIT):
        yield commit
        m = commit.metadata
        tag, base = m.get(f"{_KEY}wap_tag"), m.get(f"{_KEY}wap_base")
        if not tag or not base:
            continue
        try:
            for inner in history.walk(repository, tag, limit=HISTORY_LIMIT):
                if inner.id == base:
                    break
                yield inner
        except NotFoundError:  # the tag was removed: those records are gone
            continue


def _last_publication(
    history: FirstParents, defn: TaskDefinition[Any, Any], target: WorkspaceTarget, scope: str
) -> Commit | None:
    for commit in _history(history, target.repository, target.input_ref):
        m = commit.metadata
        if (
            m.get(f"{_KEY}kind") in ("publication", "staged")
            and m.get(f"{_KEY}task_type") == defn.name
            and m.get(f"{_KEY}scope") == scope
            and f"{_KEY}params_digest" in m
        ):
            return commit
    return None


def _same_content(store: VersionStore, repository: str, old: str, new: str, prefix: str) -> bool:
    return old == new or not store.diff_refs(repository, old, new, prefix=prefix)


def _inputs_changed(store: VersionStore, commit: Commit, target: WorkspaceTarget) -> str:
    """Why the inputs differ from what ``commit`` read ("" when they do not)."""
    recorded = ResolvedInput.from_metadata(commit.metadata)
    now = {read.name: read for read in target.reads}
    if sorted(recorded) != sorted(now):
        return f"its inputs were {sorted(recorded)}, now {sorted(now)}"
    for name, location in recorded.items():
        then, read = ResolvedInput.parse(name, location), now[name]
        if (then.repository, then.prefix) != (read.repository, read.prefix):
            return f"input {name!r} was {location}, now {read.location}"
        try:
            same = _same_content(store, read.repository, then.commit, read.commit, read.prefix)
        except NotFoundError:
            return f"input {name!r}: the commit it was read at ({then.commit[:12]}) is gone"
        if not same:
            return f"input {name!r} ({read.prefix}) changed since {then.commit[:12]}"
    return ""


def find_reusable(
    store: VersionStore,
    history: FirstParents,
    defn: TaskDefinition[Any, Any],
    target: WorkspaceTarget,
    scope: str,
    params: BaseModel,
) -> Verdict:
    """The publication this attempt may answer with, or why its body must run (``history``:
    the process's commit cache, which the walk reads through)."""
    commit = _last_publication(history, defn, target, scope)
    if commit is None:
        return Verdict(None, "no earlier publication of this step's scope")
    m, short = commit.metadata, commit.id[:12]
    candidate = commit.id
    if m.get(f"{_KEY}code_version") != defn.code_version:
        return Verdict(None, f"the code changed since {short}", candidate)
    if m.get(f"{_KEY}params_digest") != params_digest(params):
        return Verdict(None, f"the params changed since {short}", candidate)
    raw = m.get(f"{_KEY}result")
    try:
        result = defn.result_type.model_validate_json(raw or "")
    except ValidationError:
        return Verdict(None, f"the result {short} recorded does not validate now", candidate)
    changed = _inputs_changed(store, commit, target)
    if changed:
        return Verdict(None, changed, candidate)
    if not _same_content(store, target.repository, commit.id, target.input_ref, scope):
        return Verdict(None, f"{scope} changed on the branch since {short}", candidate)
    return Verdict(Reuse(commit, result), f"same inputs, params and code as {short}", candidate)
