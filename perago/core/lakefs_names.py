"""Every name Perago makes or parses in lakeFS: branches, tags, reserved paths, metadata keys.

Kept in one module because names are a contract: the janitor finds what the publisher made
by its name, a retry finds its earlier attempt's staging branch by its name, and users'
tasks must never write where Perago keeps its own records.
"""

from __future__ import annotations

import re

__all__ = [
    "ACTIONS_PREFIX",
    "COORD_BRANCH",
    "COORD_ROOT",
    "HEAD_MOVED",
    "HOOK_PATH",
    "METADATA_PREFIX",
    "RESERVED_PREFIXES",
    "SCOPE_MARKER_ROOT",
    "is_wap_branch",
    "replaced_tag",
    "scoped_branch_name",
    "staging_branch_name",
    "staging_prefix",
    "wap_branch_name",
    "wap_kept_tag",
    "wap_prefix",
]

#: Prefix of every commit metadata key Perago writes (``perago.workflow_id``, ...).
METADATA_PREFIX = "perago."

#: Paths no task may write: Perago's own records and lakeFS's actions (hooks).
#: Where lakeFS reads a repository's actions (hooks) from.
ACTIONS_PREFIX = "_lakefs_actions/"
RESERVED_PREFIXES = ("_perago/", ACTIONS_PREFIX)

#: How the expected-head hook's refusal begins (its Lua ``error``): lakeFS answers the merge
#: with HTTP 412 and this text, which the adapter turns into ``HeadMovedError``.
HEAD_MOVED = "perago: destination head is "

#: Where the per-scope publication markers live (inside the reserved ``_perago/``).
SCOPE_MARKER_ROOT = "_perago/scopes/"

#: The expected-head pre-merge hook `perago repo init` installs.
HOOK_PATH = ACTIONS_PREFIX + "perago-expected-head.yaml"

#: The default coordination backend's branch (hidden, never committed) and key root.
COORD_BRANCH = "_perago_coord"
COORD_ROOT = "_perago/coord"

_SAFE = re.compile(r"[^A-Za-z0-9_-]")


def staging_prefix(cluster_id: str = "") -> str:
    """Where a cluster's staging branch names start. Cluster ids have no hyphen, so no
    cluster's prefix starts another's, nor the unnamed cluster's ``perago-stg-``."""
    return f"perago-{cluster_id}-stg-" if cluster_id else "perago-stg-"


def staging_branch_name(task_id: str, poll_count: int, cluster_id: str = "") -> str:
    """An attempt's staging branch: execution-scoped and unique per delivery (a task id may
    be delivered twice, with a higher poll count)."""
    return f"{staging_prefix(cluster_id)}{_SAFE.sub('_', task_id)}-p{poll_count}"


def scoped_branch_name(staging_branch: str) -> str:
    """The private branch a scoped replacement is built on, beside the staging branch (same
    prefix, so the janitor judges it by the same attempt)."""
    cut = staging_branch.rindex("-p")
    return f"{staging_branch[:cut]}-scoped{staging_branch[cut:]}"


def replaced_tag(commit_id: str, retry_count: int) -> str:
    """The tag that keeps a head reachable after a hard-reset replacement moved past it."""
    return f"perago-replaced-{commit_id[:16]}-r{retry_count}"


def wap_kept_tag(commit_id: str) -> str:
    """The tag that keeps a published write-audit-publish branch's history reachable after
    the branch is deleted: the inputs its steps recorded stay resolvable."""
    return f"perago-wap-kept-{commit_id[:16]}"


def wap_prefix(cluster_id: str = "") -> str:
    """Where the isolated branches of write-audit-publish workflows start."""
    return f"perago-{cluster_id}-wap-" if cluster_id else "perago-wap-"


_WAP_BRANCH = re.compile(r"^perago-(?:[a-z0-9]{1,20}-)?wap-")


def is_wap_branch(name: str) -> bool:
    """A write-audit-publish workflow's isolated branch, of any cluster."""
    return _WAP_BRANCH.match(name) is not None


def wap_branch_name(workflow_id: str, cluster_id: str = "") -> str:
    """A workflow's isolated branch (visible: users look at it while the workflow runs)."""
    return f"{wap_prefix(cluster_id)}{_SAFE.sub('_', workflow_id)}"
