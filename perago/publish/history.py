"""What Perago published on a branch, read back from lakeFS commit metadata (`perago log`).

The identity metadata every publication carries (``perago.publish.identity``) is enough to
say which workflow step and attempt wrote each commit, under which fencing token and scope,
from which inputs at which commits;
this module turns a branch's first-parent history into those records, with links to the
commit in the lakeFS UI and to the workflow in Conductor's API.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from perago._api.inputs import ResolvedInput
from perago.core.store import Commit, VersionStore
from perago.publish.identity import AttemptIdentity

__all__ = ["PublicationRecord", "branch_publications"]


@dataclass(frozen=True)
class PublicationRecord:
    """One Perago commit on a branch's first-parent history."""

    commit: str
    #: ``publication`` (a merge), ``replacement`` (one that replaced an earlier attempt's
    #: publication of the same step), ``staged`` (installed by a hard-reset replacement).
    kind: str
    workflow_id: str
    step: str
    task_type: str
    task_id: str
    retry_count: int
    poll_count: int
    scope: str | None
    fencing_token: str | None
    input_ref: str
    #: The named inputs it read: ``name -> repository@commit/prefix``.
    inputs: dict[str, str]
    created: int  # Unix seconds; 0 when the store does not say
    lakefs_url: str
    conductor_url: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _kind(commit: Commit) -> str:
    m = commit.metadata
    kind = m.get("perago.kind", "")
    if kind == "publication" and m.get("perago.replaces"):
        return "replacement"
    return kind


def branch_publications(
    store: VersionStore,
    repository: str,
    branch: str,
    *,
    amount: int,
    lakefs_ui: str,
    conductor_api: str,
) -> list[PublicationRecord]:
    """Perago's commits among the newest ``amount`` of ``branch``'s first-parent history,
    newest first; commits by anyone else are left out."""
    out = []
    for commit in store.log(repository, branch, amount=amount):
        me = AttemptIdentity.from_commit(commit)
        if me is None:
            continue
        m = commit.metadata
        out.append(
            PublicationRecord(
                commit=commit.id,
                kind=_kind(commit),
                workflow_id=me.workflow_id,
                step=me.step_key or me.reference_name,
                task_type=me.task_type,
                task_id=me.task_id,
                retry_count=me.retry_count,
                poll_count=me.poll_count,
                scope=me.scope,
                fencing_token=m.get("perago.fencing_token"),
                input_ref=m.get("perago.input_ref", ""),
                inputs=ResolvedInput.from_metadata(m),
                created=commit.created,
                lakefs_url=f"{lakefs_ui.rstrip('/')}/repositories/{repository}/commits/{commit.id}",
                conductor_url=f"{conductor_api.rstrip('/')}/workflow/{me.workflow_id}",
            )
        )
    return out
