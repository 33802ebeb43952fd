"""In-place publication is confined to the task's prefix (real lakeFS; the body's S3 writes
are played by uploads to the staging branch, which is what the S3 gateway does)."""

from __future__ import annotations

import pytest

from perago.adapters.lakefs import LakeFSStore
from perago.core.orchestrator import TaskSnapshot
from perago.errors import WorkspaceError
from perago.publish import AttemptIdentity, Publisher, WorkspaceTarget
from perago.testing import StaticLedger

pytestmark = pytest.mark.integration


def _in_place(store: LakeFSStore, repo: str, prefix: str, paths: list[str]) -> str:
    me = AttemptIdentity("wf", "step", "t0", retry_count=0, poll_count=1, task_type="tt")
    ledger = StaticLedger(TaskSnapshot("t0", "tt", "step", "wf", "IN_PROGRESS", 0, 1, "w", 60, {}))
    publisher = Publisher(store, ledger, worker_id="w")
    target = WorkspaceTarget(repo, "main", store.branch_head(repo, "main"))
    staging = publisher.open_in_place(me, target)
    for path in paths:
        store.upload_bytes(repo, staging, path, b"x")
    return publisher.publish_in_place(me, target, prefix=prefix).ref


@pytest.mark.parametrize(
    ("prefix", "stray"),
    [
        ("data/", "_lakefs_actions/steal.yaml"),
        ("data/", "top.txt"),
        ("data/", "datab/x.txt"),
        ("a/b/", "a/c.txt"),
        ("a/b/", "a/bc/x.txt"),
    ],
)
def test_a_write_outside_the_prefix_fails_and_publishes_nothing(
    store: LakeFSStore, repo: str, prefix: str, stray: str
) -> None:
    head = store.branch_head(repo, "main")
    with pytest.raises(WorkspaceError, match="outside its prefix") as e:
        _in_place(store, repo, prefix, [f"{prefix}ok.txt", f"{prefix}deep/ok.txt", stray])
    # The stray path, or the folder holding it, is named.
    named = e.value.message.split("branch (")[1].split(")")[0]
    assert stray.startswith(named) and e.value.non_retryable
    assert store.branch_head(repo, "main") == head
    assert store.list_branches(repo, prefix="perago-stg-") == []


def test_writes_inside_the_prefix_are_published(store: LakeFSStore, repo: str) -> None:
    head = store.branch_head(repo, "main")
    published = _in_place(store, repo, "a/b/", ["a/b/one.txt", "a/b/c/two.txt"])
    assert published == store.branch_head(repo, "main") != head
