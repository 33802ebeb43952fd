"""Kill the worker at every failpoint; a fresh worker finishes; the invariants hold.

Invariants (docs/protocol.md): the workflow completes; exactly one publication of the step
sits on the input ref in the target's first-parent history and it is the reported output;
no staging branch survives the janitor, and no branch lease is left held.

``before_reset`` is only reached by a replacement publication, so for it a first worker
publishes and dies (an abandoned publication), and the retry is killed before its reset.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.coord.lakefs_objects import LakeFSObjectsStore
from perago.coord.lease import LeaseManager
from perago.worker.failpoints import POINTS

from .harness import (
    WorkerProcess,
    attempts,
    decide_now,
    held_leases,
    one_step,
    perago_cli,
    publications,
    requeue,
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


def _one_write(
    conductor: ConductorClient, store: LakeFSStore, repo: str, unique: str, name: str
) -> str:
    """A one-step workflow ``name`` that writes ``w.txt``, started on main's head: its id."""
    one_step(conductor, name, f"pt_write_{unique}", {"files": {"w.txt": "window"}})
    return start(conductor, name, repo, ref=store.branch_head(repo, "main"))


def test_a_report_paused_past_its_window_is_sent_in_another_under_the_lease_taken_again(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Report windows (issue 41): a worker that left the branch lease and then paused past
    its report window (8 s) sends no late COMPLETED in it; the task still being its own, it
    takes the lease again, re-runs the attempt fence under it and reports inside a second
    window: the step completes once, no retry spent, nothing held. Really paused, against
    the real servers."""
    env = make_env(PERAGO_TEST_RESPONSE_TIMEOUT="60", PERAGO_JANITOR_ON_START="false")
    wid = _one_write(conductor, store, repo, unique, f"pt_wf_window_{unique}")
    paused = {"PERAGO_FAILPOINTS": "before_report=pause:11@1"}
    with worker({**env, **paused}, tmp_path / "w.log") as w:
        wf = wait_workflow(conductor, wid, timeout=120)
        closed = w.wait_for("report_window_closed")
        reopened = w.wait_for("report_window_reopened")
    assert "report window closed" in closed["error"] and closed["window"] == 1
    assert reopened["task_id"] == wf["tasks"][0]["taskId"]
    assert wf["status"] == "COMPLETED"
    [only] = attempts(wf, "step")
    assert only["status"] == "COMPLETED"
    out = wf["output"]["workspace"]["ref"]
    assert [c.id for c in publications(store, repo)] == [out] == [store.branch_head(repo, "main")]
    assert held_leases(store, repo) == []


@contextlib.contextmanager
def _delivered_twice(
    env: dict[str, str], stack_env: dict[str, str], unique: str, tmp_path: Path, failpoint: str
) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """A task id Conductor really delivers twice: the first delivery pauses at ``failpoint``
    (its worker's one place busy, it polls no more), the task is requeued through Conductor's
    admin API (what its sweeper does under load) and a second worker takes it (poll count 2)
    and starts waiting out report windows; then the first is released. Yields both workers."""
    release = tmp_path / "release"
    paused = {
        "PERAGO_FAILPOINTS": f"{failpoint}=pause:60@1",
        "PERAGO_FAILPOINTS_RELEASE": str(release),
        "PERAGO_PUBLICATIONS_IN_FLIGHT": "0",
    }
    with worker({**env, **paused}, tmp_path / "first.log") as first:
        first.wait_for("failpoint_hit", failpoint=failpoint)
        requeue(stack_env, f"pt_write_{unique}")
        with worker(env, tmp_path / "second.log") as second:
            waiting = second.wait_for("report_windows_waiting", timeout=60)
            assert waiting["poll_count"] == 2
            release.touch()
            yield first, second


def _published_once_by_the_redelivery(wf: dict[str, Any], store: LakeFSStore, repo: str) -> None:
    """The workflow COMPLETED with one task id (no retry spent), delivered twice, and its
    output ref is the branch's one publication."""
    assert wf["status"] == "COMPLETED"
    [only] = attempts(wf, "step")
    assert only["status"] == "COMPLETED" and only["pollCount"] == 2
    out = wf["output"]["workspace"]["ref"]
    assert [c.id for c in publications(store, repo)] == [out] == [store.branch_head(repo, "main")]


def test_a_redelivery_waits_out_the_earlier_deliverys_report_window_holding_no_lease(
    make_env: Callable[..., dict[str, str]],
    stack_env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Report windows with a task id Conductor really delivers twice (its admin requeue,
    what its sweeper does under load): the first delivery pauses after attempt fence #2,
    holding its share of the branch lease; the task is requeued and a second worker takes
    it (poll count 2). The second waits 5 s plus a window (10 s), times the skew rate 1.5,
    from its poll before it takes the branch lease, and holds nothing meanwhile: the first
    resumes, publishes and ends (its COMPLETED lands if its window opened within 5 s of its
    fence; else the window opens closed and it stays silent, the task being the second's),
    and no lease is held while the second still waits. Then the second fences and decides
    from the branch: the step is on the branch once and the task COMPLETED with that ref."""
    env = make_env(PERAGO_TEST_RESPONSE_TIMEOUT="60", PERAGO_JANITOR_ON_START="false")
    wid = _one_write(conductor, store, repo, unique, f"pt_wf_redelivered_{unique}")
    with _delivered_twice(env, stack_env, unique, tmp_path, "after_fence2") as (first, second):
        ended = first.wait_for("attempt_finished", timeout=60)
        assert held_leases(store, repo) == []  # the second waits holding nothing
        assert not [e for e in second.events() if e["event"] == "report_windows_waited_out"]
        waited = second.wait_for("report_windows_waited_out", timeout=60)
        wf = wait_workflow(conductor, wid, timeout=120)
        second.wait_for("attempt_finished", timeout=60)
        events = [e["event"] for e in second.events()]
    assert waited["seconds"] >= 15  # 22.5 s from its poll, less what came before
    assert events.index("report_windows_waited_out") < events.index("branch_lease_acquired")
    _published_once_by_the_redelivery(wf, store, repo)
    assert ended["status"] in ("COMPLETED", "FAILED")
    assert held_leases(store, repo) == []


def test_a_redelivery_goes_on_once_the_superseded_delivery_in_another_worker_recorded_its_end(
    make_env: Callable[..., dict[str, str]],
    stack_env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """What a fan-out meets when Conductor's sweeper hands a task out again early: the
    first delivery pauses after attempt fence #1 (before any lease); the task is requeued
    and a second worker takes it (poll count 2) and starts waiting out report windows. The
    first resumes: its fence #2 finds the task delivered again, it sends no report and
    records its end in the repository's coordination store (lakeFS); the second reads that
    record and goes on long before its 22.5 s are up. One publication, the task COMPLETED
    with it, no retry."""
    env = make_env(PERAGO_TEST_RESPONSE_TIMEOUT="60", PERAGO_JANITOR_ON_START="false")
    wid = _one_write(conductor, store, repo, unique, f"pt_wf_superseded_{unique}")
    with _delivered_twice(env, stack_env, unique, tmp_path, "after_fence1") as (first, second):
        recorded = first.wait_for("delivery_end_recorded", timeout=60)
        waited = second.wait_for("report_windows_waited_out", timeout=60)
        wf = wait_workflow(conductor, wid, timeout=120)
        second.wait_for("attempt_finished", timeout=60)
        skipped = first.wait_for("report_skipped_delivered_again", timeout=10)
    assert (recorded["poll_count"], recorded["repository"]) == (1, repo)
    assert skipped["live_poll_count"] == 2
    assert waited["ended_by"] == "recorded"  # not the 22.5 s deadline
    _published_once_by_the_redelivery(wf, store, repo)
    assert held_leases(store, repo) == []


def test_a_report_paused_until_conductor_timed_the_task_out_fails_and_the_retry_decides(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """A worker paused past its report window and past the task's response timeout (no
    extension is sent once the report has begun): Conductor timed the task out and retried
    it, so no second window opens for it; the retry decides from the branch and replaces the
    abandoned publication with its own: the step is on the branch once. Really paused."""
    env = make_env(PERAGO_TEST_RESPONSE_TIMEOUT="4", PERAGO_JANITOR_ON_START="false")
    wid = _one_write(conductor, store, repo, unique, f"pt_wf_window_out_{unique}")
    release = tmp_path / "release"
    paused = {
        "PERAGO_FAILPOINTS": "before_report=pause:120@1",
        "PERAGO_FAILPOINTS_RELEASE": str(release),
    }
    with worker({**env, **paused}, tmp_path / "w.log") as w:
        w.wait_for("failpoint_hit", failpoint="before_report")
        hit = time.monotonic()
        while attempts(conductor.get_workflow(wid), "step")[0]["status"] == "IN_PROGRESS":
            assert time.monotonic() < hit + 90, "Conductor never timed the paused task out"
            decide_now(conductor, wid)  # its embedded sweeper re-checks only every ~60 s
            time.sleep(1)
        time.sleep(max(0.0, hit + 9 - time.monotonic()))  # and past the 8 s window
        release.touch()
        wf = wait_workflow(conductor, wid, timeout=120)
        refused = w.wait_for("guarded_report_refused", timeout=60)
    assert "no longer this delivery's" in refused["error"]
    assert wf["status"] == "COMPLETED"
    first, retry = attempts(wf, "step")
    assert first["status"] == "TIMED_OUT"
    assert retry["status"] == "COMPLETED"
    out = wf["output"]["workspace"]["ref"]
    pubs = publications(store, repo)
    assert [c.id for c in pubs] == [out] == [store.branch_head(repo, "main")]
    assert pubs[0].metadata["perago.task_id"] == retry["taskId"]  # the first's replaced
    assert held_leases(store, repo) == []
