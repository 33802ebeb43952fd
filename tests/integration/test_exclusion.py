"""The store itself rejects the loser: racing publications and writers between fence and merge."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.errors import HeadMovedError
from perago.publish.expected_head_hook import install

from .harness import (
    WorkerProcess,
    attempts,
    foreign_commit,
    one_step,
    publications,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration
ROUNDS = int(os.environ.get("PERAGO_RACE_ROUNDS", "3"))


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(PERAGO_TEST_RETRIES="0")


@pytest.mark.parametrize("leases", ["none", "lakefs"], ids=["merge-marker", "branch-lease"])
def test_two_publications_from_one_input_ref_exactly_one_lands(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    leases: str,
) -> None:
    """Two workflows publish from one input ref at once: exactly one lands, every round.

    Without leases both pass the publish fence on the same head and lakeFS's merge rejects
    one (the marker). With the branch lease (the default) the second waits for the lease,
    then its publish fence sees the first publication and refuses.
    """
    name = f"pt_wf_race_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", {"files": "${workflow.input.files}"})
    # Attempts pause after the publish fence until the round's release file exists: without
    # leases both have passed their fence on head == input ref before either merges; with
    # the lease the second has staged and waits for the lease while the first holds it.
    release = tmp_path / "release"
    racing = {
        **env,
        "PERAGO_FAILPOINTS": "after_publish_fence=pause:120",
        "PERAGO_FAILPOINTS_RELEASE": str(release),
        "PERAGO_COORD_BACKEND": leases,
    }
    outcomes = []
    with worker(racing, tmp_path / "a.log") as a, worker(racing, tmp_path / "b.log") as b:
        for round_ in range(ROUNDS):
            input_ref = store.branch_head(repo, "main")
            ids = [
                conductor.start_workflow(
                    name,
                    {
                        "workspace": {"repository": repo, "branch": "main", "ref": input_ref},
                        "files": {f"r{round_}-{i}.txt": "x"},
                    },
                )
                for i in range(2)
            ]
            hits = _wait_events([a, b], "failpoint_hit", ids, 1)
            if leases == "none":
                _wait_events([a, b], "failpoint_hit", ids, 2)  # both passed their fence
            else:
                _wait_events([a, b], "staging_branch_created", ids, 2)
                assert len(hits) == 1  # the other one waits for the lease
            release.touch()
            wfs = [wait_workflow(conductor, i, timeout=60) for i in ids]
            release.unlink()
            statuses = sorted(w["status"] for w in wfs)
            outcomes.append(statuses)
            assert statuses == ["COMPLETED", "FAILED"], f"round {round_}: {statuses}"
            loser = next(w for w in wfs if w["status"] == "FAILED")
            reason = attempts(loser, "step")[0]["reasonForIncompletion"]
            if leases == "none":
                assert "lakeFS rejected the merge" in reason
            else:
                assert "publish fence" in reason and "not by an earlier attempt" in reason
            winner = next(w for w in wfs if w["status"] == "COMPLETED")
            head = store.get_commit(repo, store.branch_head(repo, "main"))
            assert head.id == winner["output"]["workspace"]["ref"]
            assert head.parents[0] == input_ref  # exactly one publication on the input ref
    assert len(publications(store, repo)) == ROUNDS
    assert staging_branches(store, repo) == []


def _wait_events(
    workers: list[WorkerProcess], event: str, workflow_ids: list[str], n: int
) -> list[dict[str, Any]]:
    """Until the workers have logged ``n`` ``event`` events of these workflows."""
    deadline = time.monotonic() + 60
    while True:
        found = [
            e
            for w in workers
            for e in w.events()
            if e.get("event") == event and e.get("workflow_id") in workflow_ids
        ]
        if len(found) >= n:
            return found
        assert time.monotonic() < deadline, f"{len(found)} of {n} {event} events"
        time.sleep(0.05)


@pytest.mark.parametrize("hook", [True, False], ids=["expected-head-hook", "post-publish-check"])
def test_foreign_commit_between_fence_and_merge(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    hook: bool,
) -> None:
    if hook:
        assert install(store, repo, "main") is not None
        assert install(store, repo, "main") is None  # idempotent
    name = f"pt_wf_foreign_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", {"files": {"p.txt": "perago"}})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    release = tmp_path / "release"
    pausing = {
        **env,
        "PERAGO_FAILPOINTS": "after_publish_fence=pause:120",
        "PERAGO_FAILPOINTS_RELEASE": str(release),
    }
    with worker(pausing, tmp_path / "w.log") as w:
        w.wait_for("failpoint_hit", failpoint="after_publish_fence")
        foreign = foreign_commit(store, repo)
        release.touch()
        wf = wait_workflow(conductor, wid)
    reason = attempts(wf, "step")[0]["reasonForIncompletion"]
    assert wf["status"] == "FAILED"
    if hook:
        assert "lakeFS rejected the merge" in reason and "412" in reason
        assert store.branch_head(repo, "main") == foreign.id  # nothing published
        assert publications(store, repo) == []
    else:
        # without the hook lakeFS merges on top of the foreign commit; Perago notices and
        # fails closed, loudly, instead of reporting success
        assert "foreign writer" in reason
        head = store.get_commit(repo, store.branch_head(repo, "main"))
        assert head.parents[0] == foreign.id
    assert staging_branches(store, repo) == []


def test_real_lakefs_answers_the_hooks_refusal_as_a_moved_head(
    store: LakeFSStore, repo: str
) -> None:
    """The adapter types what real lakeFS answers when the expected-head hook refuses a merge
    (HTTP 412 carrying the hook's Lua error) as HeadMovedError, the type the publisher fences
    again on; the same merge with the head it expects lands."""
    assert install(store, repo, "main") is not None
    head = store.branch_head(repo, "main")
    store.create_branch(repo, "side", head)
    store.upload_bytes(repo, "side", "x.txt", b"x")
    store.commit(repo, "side", message="side", metadata={})
    stale = {"perago.expected_head": "0" * 64}
    with pytest.raises(HeadMovedError, match="412"):
        store.merge(repo, "side", "main", message="refused", metadata=stale)
    assert store.branch_head(repo, "main") == head
    store.merge(repo, "side", "main", message="lands", metadata={"perago.expected_head": head})
    assert store.branch_head(repo, "main") != head
