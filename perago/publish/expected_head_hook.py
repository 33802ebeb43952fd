"""A lakeFS pre-merge hook that turns Perago's merge into a compare-and-swap on the head.

lakeFS runs pre-merge hooks inside its atomic branch update and reads actions from
``_lakefs_actions/`` of the merge *source*; staging branches are created from the input ref,
so the hook must be in the target branch's history: ``perago repo init`` commits it there.
The hook fails the merge (HTTP 412) when the destination head is not the head the publish
fence saw (``perago.expected_head`` in the merge metadata). Merges without that key pass.
"""

from __future__ import annotations

import io

from perago.core import lakefs_names as names
from perago.core.store import VersionStore
from perago.errors import NotFoundError

__all__ = ["HOOK_PATH", "HOOK_YAML", "install"]

HOOK_PATH = names.HOOK_PATH
HOOK_YAML = f"""\
name: perago expected head
description: Reject a Perago publication whose destination head moved after the publish fence.
on:
  pre-merge:
    branches: []
hooks:
  - id: perago_expected_head
    type: lua
    properties:
      script: |
        local expected = action.commit.metadata["perago.expected_head"]
        local head = action.commit.parents[1]
        if expected ~= nil and expected ~= "" and head ~= expected then
          error("{names.HEAD_MOVED}" .. tostring(head) .. ", expected " .. expected)
        end
"""


def installed(store: VersionStore, repository: str, ref: str) -> bool:
    buf = io.BytesIO()
    try:
        store.download(repository, ref, HOOK_PATH, buf)
    except NotFoundError:
        return False
    return buf.getvalue().decode() == HOOK_YAML


def install(store: VersionStore, repository: str, branch: str) -> str | None:
    """Commit the hook onto ``branch`` unless it is there already; returns the new commit."""
    if installed(store, repository, branch):
        return None
    store.upload_bytes(repository, branch, HOOK_PATH, HOOK_YAML.encode())
    commit = store.commit(
        repository,
        branch,
        message="perago: install the expected-head pre-merge hook",
        metadata={"perago.kind": "repo-init"},
    )
    return commit.id
