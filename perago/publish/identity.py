"""Who published a commit: the attempt identity written into lakeFS commit metadata.

A retry decides from this, never from worker-local state: a head counts as an abandoned
publication only when its metadata names an earlier attempt of the same workflow instance
and task reference.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from cachetools import LRUCache

from perago._api.inputs import ResolvedInput
from perago.core import lakefs_names as names
from perago.core.store import Commit

__all__ = [
    "AttemptIdentity",
    "StagedReference",
    "WorkspaceTarget",
    "staging_branch_name",
    "staging_prefix",
]

_KEY = names.METADATA_PREFIX
staging_prefix = names.staging_prefix


@dataclass(frozen=True)
class WorkspaceTarget:
    """The resolved workspace input: target branch and the pinned input commit, and what
    the attempt reads beside it (its named inputs, each at one commit)."""

    repository: str
    branch: str
    input_ref: str
    reads: tuple[ResolvedInput, ...] = ()
    #: Refuse to publish over a head where an input read from this branch changed.
    serializable: bool = False
    #: What an incremental task's publication records for later re-runs (its code
    #: version, params digest and result; ``perago.worker.reuse.record``).
    recorded: tuple[tuple[str, str], ...] = ()

    def reads_metadata(self) -> dict[str, str]:
        """``perago.input.<name>: repository@commit/prefix`` for every input read, and what
        the publication records for incremental re-runs."""
        out: dict[str, str] = {}
        for read in self.reads:
            out.update(read.metadata())
        out.update(self.recorded)
        return out


#: Commits whose identity :meth:`AttemptIdentity.from_commit` keeps parsed (as many as the
#: fences' commit cache holds, ``perago.publish.first_parents.CAPACITY``), by commit id,
#: with the commit object it was parsed from (a commit made up elsewhere is parsed anew).
PARSED_CAPACITY = 20_000
_PARSED: LRUCache[str, tuple[Commit, AttemptIdentity | None]] = LRUCache(PARSED_CAPACITY)
_PARSED_LOCK = threading.Lock()


@dataclass(frozen=True)
class AttemptIdentity:
    workflow_id: str
    reference_name: str
    task_id: str
    retry_count: int
    poll_count: int
    task_type: str
    #: The Conductor cluster this worker serves (``PERAGO_CLUSTER_ID``); names staging branches.
    cluster_id: str = field(default="", compare=False)
    #: The rendered prefix the step publishes (``None``: unknown, overlaps every scope).
    scope: str | None = None
    #: A step inside a sub-workflow: ``<root workflow id>/<parent task ref>/.../<task ref>``,
    #: the same for every retried child, and the parent tasks' retry counts (outermost
    #: first), which order attempts across children (``perago.core.step_lineage``).
    step_key: str | None = None
    lineage_retries: tuple[int, ...] = ()

    def metadata(self, input_ref: str, **extra: str) -> dict[str, str]:
        scope = {} if self.scope is None else {f"{_KEY}scope": self.scope}
        if self.step_key is not None:
            scope[f"{_KEY}step"] = self.step_key
            scope[f"{_KEY}lineage_retries"] = ",".join(map(str, self.lineage_retries))
        return {
            f"{_KEY}workflow_id": self.workflow_id,
            f"{_KEY}task_ref": self.reference_name,
            f"{_KEY}task_id": self.task_id,
            f"{_KEY}retry_count": str(self.retry_count),
            f"{_KEY}poll_count": str(self.poll_count),
            f"{_KEY}task_type": self.task_type,
            f"{_KEY}input_ref": input_ref,
            **scope,
            **{f"{_KEY}{k}": v for k, v in extra.items()},
        }

    @classmethod
    def from_commit(cls, commit: Commit) -> AttemptIdentity | None:
        """The attempt that wrote ``commit`` (None: not Perago). Parsed once per commit
        object: every fence of a fan-out walks the same chain of siblings' publications."""
        with _PARSED_LOCK:
            hit = _PARSED.get(commit.id)
        if hit is not None and hit[0] is commit:
            return hit[1]
        owner = cls._parse(commit)
        with _PARSED_LOCK:
            _PARSED[commit.id] = (commit, owner)
        return owner

    @classmethod
    def _parse(cls, commit: Commit) -> AttemptIdentity | None:
        m = commit.metadata
        try:
            return cls(
                workflow_id=m[f"{_KEY}workflow_id"],
                reference_name=m[f"{_KEY}task_ref"],
                task_id=m[f"{_KEY}task_id"],
                retry_count=int(m[f"{_KEY}retry_count"]),
                poll_count=int(m.get(f"{_KEY}poll_count", "0")),
                task_type=m.get(f"{_KEY}task_type", ""),
                scope=m.get(f"{_KEY}scope"),
                step_key=m.get(f"{_KEY}step"),
                lineage_retries=tuple(
                    int(x) for x in m.get(f"{_KEY}lineage_retries", "").split(",") if x
                ),
            )
        except (KeyError, ValueError):
            return None

    def same_step(self, other: AttemptIdentity) -> bool:
        """The same logical workflow step; across retried sub-workflows by the step key."""
        if self.step_key is not None and other.step_key is not None:
            return self.step_key == other.step_key
        return self.workflow_id == other.workflow_id and self.reference_name == other.reference_name

    def same_attempt(self, other: AttemptIdentity) -> bool:
        return self.same_step(other) and (self.task_id, self.poll_count) == (
            other.task_id,
            other.poll_count,
        )

    def is_earlier_attempt_of_same_step(self, other: AttemptIdentity) -> bool:
        """True if ``other`` is an earlier (or re-delivered) attempt of this workflow step."""
        if not self.same_step(other) or self.same_attempt(other):
            return False
        # A retry has a higher retry count; a re-delivery of one task id a higher poll count;
        # a step of a retried sub-workflow a higher retry count of a parent task.
        if len(other.lineage_retries) != len(self.lineage_retries):
            return False
        return (*other.lineage_retries, other.retry_count, other.poll_count) < (
            *self.lineage_retries,
            self.retry_count,
            self.poll_count,
        )


def staging_branch_name(identity: AttemptIdentity) -> str:
    """The attempt's staging branch (``perago.core.lakefs_names``)."""
    return names.staging_branch_name(identity.task_id, identity.poll_count, identity.cluster_id)


@dataclass(frozen=True)
class StagedReference:
    repository: str
    staging_branch: str
    staging_commit: str
