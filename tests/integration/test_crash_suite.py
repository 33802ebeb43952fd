"""Kill the worker at every failpoint; a fresh worker finishes; the invariants hold.

Invariants (docs/protocol.md): the workflow completes; exactly one publication of the step
sits on the input ref in the target's first-parent history and it is the reported output;
no staging branch survives the janitor, and no branch lease is left held.

``before_reset`` is only reached by a replacement publication, so for it a first worker
publishes and dies (an abandoned publication), and the retry is killed before its reset.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.coord.lakefs_objects import LakeFSObjectsStore
from perago.coord.lease import LeaseManager
from perago.worker.failpoints import POINTS

from .harness import (
    attempts,
    held_leases,
    one_step,
    perago_cli,
    publications,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration
ROUNDS = int(os.environ.get("PERAGO_CRASH_ROUNDS", "1"))


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(PERAGO_TEST_RESPONSE_TIMEOUT="4", PERAGO_JANITOR_ON_START="false")


@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize("point", POINTS)
def test_kill_at_failpoint_then_recover(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    point: str,
    round_: int,
) -> None:
    name = f"pt_wf_crash_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", {"files": {"c.txt": point}})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    kills = ["after_publish", point] if point == "before_reset" else [point]
    for n, kill in enumerate(kills):
        failpoint = {"PERAGO_FAILPOINTS": f"{kill}=kill"}
        with worker({**env, **failpoint}, tmp_path / f"killed{n}.log") as w:
            assert w.wait_killed(conductor, wid) == -signal.SIGKILL
    with worker(env, tmp_path / "fresh.log") as fresh:
        wf = wait_workflow(conductor, wid, timeout=120, nudge=True)
        if point != "after_complete":
            # The worker says it reported (it left the lease before: report windows).
            fresh.wait_for("attempt_reported", status="COMPLETED")
    assert wf["status"] == "COMPLETED"
    steps = attempts(wf, "step")
    if point == "after_complete":
        assert [t["status"] for t in steps] == ["COMPLETED"]  # reported before dying
    else:
        # Each killed attempt is failed by the restarted worker (recovery) or, when its
        # response timeout was already close, timed out by Conductor.
        assert [t["status"] for t in steps][-1] == "COMPLETED" and len(steps) == len(kills) + 1
        for t in steps[:-1]:
            recovered = t["status"] == "FAILED" and "restarted" in t["reasonForIncompletion"]
            assert recovered or t["status"] == "TIMED_OUT", t
    if point == "before_reset":
        assert fresh.wait_for("reset_under_lease")["fencing_token"] > 1
    out = wf["output"]["workspace"]["ref"]
    pubs = publications(store, repo)
    assert [c.id for c in pubs] == [out] == [store.branch_head(repo, "main")]
    assert pubs[0].parents[0] == input_ref
    assert held_leases(store, repo) == []
    leases = LeaseManager(LakeFSObjectsStore(store, repo), ttl=timedelta(seconds=4))
    assert leases.records()
    done = perago_cli(["janitor", "--repository", repo], env)
    assert done.returncode == 0, done.stderr
    assert staging_branches(store, repo) == []
    assert leases.records() == []  # released leases are tidied away too


def test_a_report_paused_past_its_window_fails_and_the_retry_decides_from_the_branch(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Report windows (issue 41): a worker that left the branch lease and then paused past
    its report window (8 s) sends no late COMPLETED;
    it reports FAILED, and the retry decides from the branch: it replaces the abandoned
    publication with its own, so the step is on the branch once. Really paused, against the
    real servers."""
    env = make_env(PERAGO_TEST_RESPONSE_TIMEOUT="30", PERAGO_JANITOR_ON_START="false")
    name = f"pt_wf_window_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", {"files": {"w.txt": "window"}})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    paused = {"PERAGO_FAILPOINTS": "before_report=pause:11@1"}
    with worker({**env, **paused}, tmp_path / "w.log") as w:
        wf = wait_workflow(conductor, wid, timeout=120)
        refused = w.wait_for("guarded_report_refused")
    assert "report window closed" in refused["error"]
    assert wf["status"] == "COMPLETED"
    first, retry = attempts(wf, "step")
    assert first["status"] == "FAILED"
    assert "report window closed" in first["reasonForIncompletion"]
    assert retry["status"] == "COMPLETED"
    out = wf["output"]["workspace"]["ref"]
    pubs = publications(store, repo)
    assert [c.id for c in pubs] == [out] == [store.branch_head(repo, "main")]
    assert pubs[0].metadata["perago.task_id"] == retry["taskId"]  # the first's replaced
    assert held_leases(store, repo) == []
