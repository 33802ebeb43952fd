"""Try/Confirm/Cancel publication of an attempt's workspace to a lakeFS branch."""

from perago.publish.fences import AttemptLedger, HeadDecision, check_attempt, decide_publication
from perago.publish.identity import (
    AttemptIdentity,
    StagedReference,
    WorkspaceTarget,
    staging_branch_name,
    staging_prefix,
)
from perago.publish.transaction import Publication, Publisher

__all__ = [
    "AttemptIdentity",
    "AttemptLedger",
    "HeadDecision",
    "Publication",
    "Publisher",
    "StagedReference",
    "WorkspaceTarget",
    "check_attempt",
    "decide_publication",
    "staging_branch_name",
    "staging_prefix",
]
