"""Serializable isolation: refuse to publish output computed from an input that changed.

Under snapshot isolation (the default) an attempt's inputs are read at their resolved
commits and only the output scope is fenced. Under ``isolation="serializable"`` the
publisher also checks, under the branch lease and against the very head it publishes over,
that no input read from the target branch changed since the commit it was read at: the
read-set validation of Iceberg's ``validateNoConflictingData`` and Delta's read predicates,
on lakeFS's diff of one folder between two commits.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from perago._api.inputs import ResolvedInput
from perago.core.store import Commit, VersionStore
from perago.errors import PublishFenceError
from perago.publish.identity import AttemptIdentity, WorkspaceTarget

__all__ = ["check_reads"]

log = structlog.get_logger("perago.publish")

#: Commits inspected to name the one that changed an input (the refusal stands either way).
_BLAME_LIMIT = 50


def check_reads(
    store: VersionStore, target: WorkspaceTarget, head: Commit, history: Sequence[Commit]
) -> None:
    """Refuse (``PublishFenceError``) if an input read from the target branch differs
    between the commit it was read at and ``head``; nothing to do under snapshot isolation.

    ``history`` is the head's first-parent chain, newest first, as the publish fence read it.
    """
    if not target.serializable:
        return
    for read in target.reads:
        if not read.on_target or read.commit == head.id:
            continue
        changes = store.diff_refs(target.repository, read.commit, head.id, prefix=read.prefix)
        if not changes:
            continue
        kind, path = changes[0]
        culprit = _who_changed(store, target.repository, read, head, history)
        raise PublishFenceError(
            f"serializable isolation: input {read.name!r} ({read.prefix}) changed on "
            f"{target.branch} since this attempt read it at {read.commit[:12]}: "
            f"{culprit} ({len(changes)} object(s), e.g. {path} {kind}); the output was "
            "computed from data that is no longer current, so nothing was published. A retry "
            "starts from the new head and reads the new data"
        )
    log.info("read_set_checked", inputs=[r.name for r in target.reads if r.on_target])


def _who_changed(
    store: VersionStore,
    repository: str,
    read: ResolvedInput,
    head: Commit,
    history: Sequence[Commit],
) -> str:
    """Name the oldest commit on the head's first-parent chain that changed the input."""
    chain = list(history) if history and history[0].id == head.id else [head]
    found = None
    for commit in chain[:_BLAME_LIMIT]:
        if commit.id == read.commit or not commit.parents:
            break
        if store.diff_refs(repository, commit.parents[0], commit.id, prefix=read.prefix):
            found = commit
    if found is None:
        return f"the head {head.id[:12]} differs there"
    owner = AttemptIdentity.from_commit(found)
    if owner is None:
        return f"commit {found.id[:12]} ({found.message[:60]!r}, not a Perago publication)"
    return (
        f"commit {found.id[:12]}, published by step {owner.reference_name!r} of workflow "
        f"{owner.workflow_id} (scope {owner.scope!r})"
    )
