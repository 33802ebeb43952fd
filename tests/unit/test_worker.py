"""The worker and the attempt runner against the stub orchestrator and the in-memory store.

Every row of the failure matrix (docs/protocol.md), draining, an interrupt during the report
and lost reports, in seconds. The real-server tests (tests/integration) stay; these come in
addition. A "killed" worker is modelled by freezing the attempt's thread at a step boundary
(it never writes or reports again, holds its branch lease and keeps its staging branch),
which is what SIGKILL and SIGSTOP look like from outside; the integration crash suite kills
real processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import BaseModel

import perago
from perago import TaskError, WorkspaceSpec, task
from perago.config import Settings, load
from perago.coord.branch_leases import BranchLeases
from perago.coord.lease import LeaseManager
from perago.coord.memory import MemoryStore as CoordMemory
from perago.core.orchestrator import Outcome
from perago.core.store import Commit
from perago.publish.janitor import sweep
from perago.telemetry import steps
from perago.telemetry.steps import Boundary
from perago.testing import MemoryStore, StubOrchestrator, running_worker
from perago.worker import Worker, failpoints
from perago.worker.runtime import AttemptRunner

# -- tasks ------------------------------------------------------------------------------------


class Params(BaseModel):
    mode: str = "write"
    text: str = "hello"


class Result(BaseModel):
    files: int


class Script:
    """What the task bodies do besides their mode: a hook per retry count, and a body count."""

    def __init__(self) -> None:
        self.bodies = 0
        self.hooks: dict[int, Callable[[], None]] = {}
        self.lock = threading.Lock()


SCRIPT = Script()


@task("writer", workspace=WorkspaceSpec(prefix="data/"), body_retries=0)  # Conductor retries
def writer(workspace: Path, params: Params) -> Result:
    with SCRIPT.lock:
        SCRIPT.bodies += 1
    me = perago.info()
    hook = SCRIPT.hooks.get(me.retry_count)
    if hook is not None:
        hook()
    mode = params.mode
    if mode == "write-first":
        mode = "write" if me.retry_count == 0 else "noop"
    if mode in ("write", "write-settled"):
        (workspace / "out.txt").write_text(f"{params.text} from retry {me.retry_count}")
        if mode == "write-settled":
            time.sleep(0.02)
    elif mode == "raise":
        raise RuntimeError("the body failed")
    elif mode == "terminal":
        raise TaskError("bad data: do not retry", non_retryable=True)
    elif mode == "invalid":
        return {"files": "many"}  # type: ignore[return-value]
    elif mode == "symlink":
        (workspace / "link").symlink_to("/etc/hostname")
    elif mode == "import":
        import perago_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    return Result(files=len(list(workspace.iterdir())))


@task("reader", workspace=WorkspaceSpec(prefix="data/", read_only=True))
def reader(workspace: Path, params: Params) -> Result:
    (workspace / "scratch.txt").write_text("discarded")
    return Result(files=len(list(workspace.iterdir())))


@task("sparky", workspace=WorkspaceSpec(prefix="data/"), body_retries=0)
def sparky(workspace: Path, params: Params, spark: Any) -> Result:
    spark.sql("SELECT 1").collect()
    return Result(files=0)


class FailingSpark:
    """A Spark session whose every job fails; real Spark failures are in test_spark_runtime."""

    def sql(self, query: str) -> Any:
        raise RuntimeError("Job aborted due to stage failure: executor lost")


TASKS = [writer, reader, sparky]


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _script() -> Iterator[None]:
    SCRIPT.__init__()  # type: ignore[misc]
    yield
    SCRIPT.__init__()  # type: ignore[misc]


def settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "worker_id": "w1",
        "work_dir": tmp_path / "work",
        "poll_interval": timedelta(milliseconds=5),
        "janitor_on_start": False,
        "shutdown_grace": timedelta(seconds=1),
        "concurrency": 2,
        "transfer_parallelism": 2,
        **overrides,
    }
    return load(env={}, **values)


class Clock:
    """The branch leases' clock: a waiting taker's sleep moves it forward at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def memory_leases(clock: Clock) -> BranchLeases:
    manager = LeaseManager(
        CoordMemory(), ttl=timedelta(seconds=10), clock=lambda: clock.now, sleep=clock.sleep
    )
    return BranchLeases.shared(manager, wait=timedelta(seconds=60))


@contextmanager
def running(
    stub: StubOrchestrator,
    store: MemoryStore,
    tmp_path: Path,
    *,
    leases: BranchLeases | None = None,
    spark: Any = None,
    **overrides: Any,
) -> Iterator[Worker]:
    """A real Worker polling the stub from a thread; stopped (drained) on exit."""
    values = {
        "worker_id": "w1",
        "work_dir": tmp_path / "work",
        "concurrency": 2,
        "transfer_parallelism": 2,
        "wap_sweep_interval": timedelta(minutes=2),
        **overrides,
    }
    with running_worker(
        TASKS, store=store, orchestrator=stub, leases=leases, spark=spark, **values
    ) as worker:
        yield worker


def ws(ref: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"repository": "repo", "branch": "main", **({"ref": ref} if ref else {}), **extra}


def step(
    stub: StubOrchestrator,
    *,
    task_type: str = "writer",
    retries: int = 0,
    workspace: dict[str, Any] | None = None,
    response_timeout_seconds: int = 0,
    **params: Any,
) -> str:
    """Submit one workflow step; returns its workflow id."""
    wid = f"wf-{len(stub.updates)}-{id(params)}"
    stub.submit(
        task_type,
        {"workspace": workspace or ws(), "params": params},
        workflow_id=wid,
        reference_name="step",
        retries=retries,
        response_timeout_seconds=response_timeout_seconds,
    )
    return wid


def settle(stub: StubOrchestrator, wid: str) -> Outcome:
    """Wait until the step ended for good; its last attempt's outcome."""
    stub.wait_for(lambda s: s.settled(wid))
    outcome = stub.outcome(stub.final(wid).task_id)
    assert outcome is not None, f"the last attempt of {wid} ended without a report"
    return outcome


def publications(store: MemoryStore, base: str) -> list[Commit]:
    """Perago publications on main's first-parent history above ``base``."""
    out = []
    for c in store.log("repo", "main", amount=100):
        if c.id == base:
            break
        out.append(c)
    assert all(c.metadata.get("perago.kind") in ("publication", "staged") for c in out), out
    return out


def staging(store: MemoryStore) -> list[str]:
    return [b for b, _ in store.list_branches("repo", prefix="perago-stg-")]


class Freezer:
    """Failpoint hooks: freeze the attempt thread at a boundary, as a kill or SIGSTOP does.

    ``at(point, nth)`` freezes the ``nth`` hit of ``point`` (the first attempt to reach it,
    by default). A frozen thread waits until :meth:`resume` (then goes on, as after SIGCONT)
    or until the worker's drain interrupts it when the test ends.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.points: dict[str, int] = {}
        self.hits: list[str] = []
        self.frozen = threading.Event()
        self.hooks: dict[str, Callable[[], None]] = {}
        self._resume = threading.Event()
        monkeypatch.setattr(failpoints, "hit", self.hit)

    def at(self, point: str, nth: int = 1) -> Freezer:
        self.points[point] = nth
        return self

    def hit(self, name: str) -> None:
        self.hits.append(name)
        hook = self.hooks.get(name)
        if hook is not None:
            hook()
        if self.points.get(name) != self.hits.count(name):
            return
        self.frozen.set()
        while not self._resume.wait(0.01):
            pass

    def resume(self) -> None:
        self._resume.set()


# -- the failure matrix -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workspace", "params", "needle"),
    [
        (ws(), {"mode": 3}, "invalid params"),
        ({"repository": "nope", "branch": "main"}, {}, "does not exist"),
        (ws(branch="gone"), {}, "branch 'gone' does not exist"),
        (ws(ref="0" * 64), {}, "does not exist"),
        ({"repository": "repo"}, {}, "invalid workspace input"),
        (ws(), {"txet": "typo"}, "unknown params ['txet'] for writer"),
    ],
    ids=["params", "repository", "branch", "ref", "workspace-input", "unknown-param"],
)
def test_pre_guardrail_failures_are_terminal(
    stub: StubOrchestrator,
    store: MemoryStore,
    tmp_path: Path,
    workspace: dict[str, Any],
    params: dict[str, Any],
    needle: str,
) -> None:
    base = store.branch_head("repo", "main")
    with running(stub, store, tmp_path):
        wid = step(stub, retries=2, workspace=workspace, **params)
        outcome = settle(stub, wid)
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert needle in outcome.reason and outcome.reason.startswith("pre-guardrail")
    assert len(stub.attempts(wid)) == 1  # no retry
    assert SCRIPT.bodies == 0
    assert store.branch_head("repo", "main") == base


def test_pinned_siblings_read_the_target_branch_and_the_input_commit_once_per_process(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pinned fan-out's attempts on one worker ask lakeFS once whether the target branch
    exists and what the input commit is (a commit id never changes); a branch name given as
    ``ref`` is read every time, and a branch not seen lately is read again."""
    from perago.worker import runtime

    reads: list[str] = []
    for name in ("branch_head", "get_commit"):
        real = getattr(store, name)
        monkeypatch.setattr(
            store, name, lambda *a, _real=real, _name=name: (reads.append(_name), _real(*a))[1]
        )
    runner = AttemptRunner(store, stub, settings(tmp_path))
    base = store.branch_head("repo", "main")
    reads.clear()

    def run_reader(ref: str) -> None:
        stub.submit("reader", {"workspace": ws(ref=ref), "params": {}}, workflow_id=f"wf{ref}")
        (delivery,) = stub.poll("reader", worker_id="w1", count=1)
        assert runner.run(reader, delivery).outcome.status == "COMPLETED"

    run_reader(base)
    assert reads.count("branch_head") == 1 and reads.count("get_commit") == 1
    run_reader(base)
    run_reader(base)
    assert reads.count("branch_head") == 1 and reads.count("get_commit") == 1
    run_reader("main")  # a name: resolved every time
    run_reader("main")
    assert reads.count("branch_head") == 1 and reads.count("get_commit") == 3
    monkeypatch.setattr(runtime, "BRANCH_SEEN_SECONDS", 0.0)
    run_reader(base)
    assert reads.count("branch_head") == 2


def test_missing_workspace_input_is_terminal(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    with running(stub, store, tmp_path):
        stub.submit("writer", {"params": {}}, workflow_id="wf-bare", retries=1)
        outcome = settle(stub, "wf-bare")
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR" and '"workspace"' in outcome.reason


@pytest.mark.parametrize(
    ("task_type", "mode", "status", "where"),
    [
        ("writer", "raise", "FAILED", "task body: RuntimeError: the body failed"),
        ("writer", "terminal", "FAILED_WITH_TERMINAL_ERROR", "task body: bad data"),
        ("writer", "invalid", "FAILED", "post-guardrail: the result of writer"),
        ("writer", "symlink", "FAILED", "diff: "),
        ("sparky", "write", "FAILED", "task body: RuntimeError: Job aborted"),
    ],
    ids=["body-error", "task-error-terminal", "invalid-result", "symlink-escape", "spark-job"],
)
def test_failures_publish_nothing(
    stub: StubOrchestrator,
    store: MemoryStore,
    tmp_path: Path,
    task_type: str,
    mode: str,
    status: str,
    where: str,
) -> None:
    base = store.branch_head("repo", "main")
    with running(stub, store, tmp_path, spark=FailingSpark):
        wid = step(stub, task_type=task_type, retries=1, mode=mode)
        outcome = settle(stub, wid)
    assert outcome.status == status and outcome.reason.startswith(where), outcome.reason
    # FAILED is retried (and fails again), the terminal error is not.
    assert len(stub.attempts(wid)) == (1 if status == "FAILED_WITH_TERMINAL_ERROR" else 2)
    assert store.branch_head("repo", "main") == base
    assert staging(store) == []
    assert not list((tmp_path / "work").iterdir())  # attempt directories removed


class _SeesWorkDir(StubOrchestrator):
    """Records, at each report, the attempt directories the worker still has."""

    def __init__(self, work: Path) -> None:
        super().__init__(gate_timeout=20)
        self.work = work
        self.at_report: list[list[str]] = []

    def report(self, task: Any, outcome: Outcome, **kw: Any) -> None:
        self.at_report.append(
            sorted(str(p.relative_to(self.work)) for p in self.work.glob("*/workspace/**/*.txt"))
        )
        super().report(task, outcome, **kw)


@pytest.mark.parametrize("task_type", ["writer", "reader"])
def test_attempt_directory_is_removed_after_the_report(
    store: MemoryStore, tmp_path: Path, task_type: str
) -> None:
    # Deleting the workspace is not part of the task's duration in Conductor: the report
    # goes first, the directory next, then the attempt record (whose recovery removes a
    # directory a crash in between leaves: test_recovery).
    stub = _SeesWorkDir(tmp_path / "work")
    with running(stub, store, tmp_path):
        assert settle(stub, step(stub, task_type=task_type)).status == "COMPLETED"
    (seen,) = stub.at_report
    assert "in.txt" in [Path(p).name for p in seen]
    assert not [p for p in (tmp_path / "work").iterdir() if p.name != "attempts"]


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.downloads: list[str] = []

    def download(self, repository: str, ref: str, path: str, dest: Any, *, url: str = "") -> Any:
        self.downloads.append(path)
        return super().download(repository, ref, path, dest, url=url)


def test_the_cache_adopts_an_attempts_files_after_its_report(tmp_path: Path) -> None:
    # The writer's upload and the reader's download go to the cache once each attempt is
    # reported; the next attempt on the worker borrows them. What a body changed does not.
    store = _CountingStore()
    store.create_repository("repo")
    store.upload_bytes("repo", "main", "data/in.txt", b"input")
    store.commit("repo", "main", message="seed", metadata={})
    stub = StubOrchestrator(gate_timeout=20)
    with running(stub, store, tmp_path, concurrency=1, cache_dir=tmp_path / "cache") as worker:
        for _ in range(2):
            assert settle(stub, step(stub, task_type="reader")).status == "COMPLETED"
        assert store.downloads == ["data/in.txt"]  # the second read borrowed it
        # (written 20 ms before the body returns: a file changed in the clock tick its upload
        # starts in is never adopted)
        assert settle(stub, step(stub, mode="write-settled", text="new")).status == "COMPLETED"
        assert settle(stub, step(stub, task_type="reader")).status == "COMPLETED"
        assert store.downloads == ["data/in.txt"]  # out.txt came from the writer's upload
        stub.wait_for(lambda _: worker.in_flight() == 0)  # every attempt's adoption is done
        entries = sorted(p.read_bytes() for p in tmp_path.glob("cache/proc-*/*"))
        assert entries == [b"input", b"new from retry 0"]  # scratch.txt, a body's write, is not
        assert not [p for p in (tmp_path / "work").iterdir() if p.name != "attempts"]
    assert list((tmp_path / "cache").iterdir()) == []  # the stopped worker closed its cache


def test_read_only_discards_writes_and_keeps_ref(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    with running(stub, store, tmp_path):
        outcome = settle(stub, step(stub, task_type="reader"))
    assert outcome.status == "COMPLETED"
    assert outcome.output == {
        "workspace": {"repository": "repo", "branch": "main", "ref": base},
        "result": {"files": 2},
    }
    assert store.branch_head("repo", "main") == base
    assert "data/scratch.txt" not in store.tree("repo", "main")
    assert len(stub.gets) == 1  # no attempt fence: only the read-back of the report


def test_writable_success_publishes_once_and_reports_the_ref(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    with running(stub, store, tmp_path):
        wid = step(stub)
        outcome = settle(stub, wid)
    head = store.branch_head("repo", "main")
    assert outcome.status == "COMPLETED" and outcome.output["workspace"]["ref"] == head
    assert store.tree("repo", "main")["data/out.txt"] == b"hello from retry 0"
    assert len(publications(store, base)) == 1
    assert staging(store) == []
    task_id = stub.final(wid).task_id
    assert stub.gets.count(task_id) == 3  # attempt fences #1 and #2, the report's read-back
    assert [u.kind for u in stub.updates] == ["report"]


def test_writable_noop_makes_no_commit(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    with running(stub, store, tmp_path):
        outcome = settle(stub, step(stub, mode="noop"))
    assert outcome.status == "COMPLETED" and outcome.output["workspace"]["ref"] == base
    assert store.branch_head("repo", "main") == base and staging(store) == []


def test_noop_retry_relocates_abandoned_publication(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    """The first attempt publishes and its report is lost; the retry writes nothing."""
    base = store.branch_head("repo", "main")
    stub.fail("report")
    with running(stub, store, tmp_path):
        wid = step(stub, retries=1, mode="write-first")
        stub.wait_for(lambda s: len(s.reports()) == 1)
        abandoned = store.branch_head("repo", "main")
        stub.time_out(stub.attempts(wid)[0].task_id)
        outcome = settle(stub, wid)
    assert abandoned != base
    assert outcome.status == "COMPLETED" and outcome.output["workspace"]["ref"] == base
    assert store.branch_head("repo", "main") == base
    assert store.get_tag("repo", f"perago-replaced-{abandoned[:16]}-r1") == abandoned


def test_stale_attempt_fails_its_fence_and_publishes_nothing(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    """Paused past its response timeout: the retry completes, the stale attempt wakes up."""
    base = store.branch_head("repo", "main")
    wake = threading.Event()
    SCRIPT.hooks[0] = lambda: wake.wait(30) or None
    with running(stub, store, tmp_path):
        wid = step(stub, retries=1)
        stub.wait_for(lambda s: SCRIPT.bodies == 1)
        first = stub.attempts(wid)[0].task_id
        stub.time_out(first)
        retry = stub.wait_for(lambda s: len(s.attempts(wid)) == 2) or stub.final(wid).task_id
        stub.wait_for(lambda s: s.outcome(retry) is not None)
        wake.set()
        stub.wait_for(lambda s: len(s.reports(first)) == 1)
    stale = stub.reports(first)[0].outcome
    assert stale is not None and stale.status == "FAILED"
    assert "attempt fence" in stale.reason and "status is TIMED_OUT" in stale.reason
    assert stub.outcome(retry) == Outcome(
        "COMPLETED",
        {
            "workspace": {
                "repository": "repo",
                "branch": "main",
                "ref": store.branch_head("repo", "main"),
            },
            "result": {"files": 2},
        },
    )
    assert [c.metadata["perago.task_id"] for c in publications(store, base)] == [retry]
    assert staging(store) == []


def test_foreign_head_is_never_replaced(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    def foreign_commit() -> None:
        store.upload_bytes("repo", "main", "other/x.txt", b"foreign")
        store.commit("repo", "main", message="not perago", metadata={})

    SCRIPT.hooks[0] = foreign_commit
    with running(stub, store, tmp_path):
        outcome = settle(stub, step(stub))
    foreign = store.branch_head("repo", "main")
    assert outcome.status == "FAILED" and "refusing to replace" in outcome.reason
    assert store.get_commit("repo", foreign).message == "not perago"
    assert staging(store) == []


def test_foreign_commit_between_fence_and_merge_is_detected(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No expected-head hook in memory: the post-publish check catches it."""
    freezer = Freezer(monkeypatch)

    def foreign_commit() -> None:
        store.upload_bytes("repo", "main", "other/x.txt", b"foreign")
        store.commit("repo", "main", message="not perago", metadata={})

    freezer.hooks["after_publish_fence"] = foreign_commit
    with running(stub, store, tmp_path):
        outcome = settle(stub, step(stub))
    assert outcome.status == "FAILED" and "foreign writer" in outcome.reason


def test_published_then_dead_the_retry_replaces_the_abandoned_publication(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = store.branch_head("repo", "main")
    freezer = Freezer(monkeypatch).at("after_publish")
    with running(stub, store, tmp_path):
        wid = step(stub, retries=1)
        assert freezer.frozen.wait(30)
        abandoned = store.branch_head("repo", "main")
        stub.time_out(stub.attempts(wid)[0].task_id)
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED"
    head = store.branch_head("repo", "main")
    assert outcome.output["workspace"]["ref"] == head != abandoned
    assert [c.id for c in publications(store, base)] == [head]  # once
    assert store.tree("repo", "main")["data/out.txt"] == b"hello from retry 1"


@pytest.mark.parametrize("point", [p for p in failpoints.POINTS if p != "before_reset"])
def test_killed_at_a_step_boundary_the_retry_completes_once(
    stub: StubOrchestrator,
    store: MemoryStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
) -> None:
    base = store.branch_head("repo", "main")
    clock = Clock()
    leases = memory_leases(clock)
    freezer = Freezer(monkeypatch).at(point)
    with running(stub, store, tmp_path, leases=leases):
        wid = step(stub, retries=1)
        assert freezer.frozen.wait(30)
        first = stub.attempts(wid)[0]
        if point != "after_complete":
            stub.time_out(first.task_id)
        outcome = settle(stub, wid)
        # The janitor removes what the frozen attempt left (it is over for Conductor).
        sweep(store, stub, repositories=["repo"])
        assert staging(store) == []
    assert outcome.status == "COMPLETED"
    assert len(publications(store, base)) == 1
    assert outcome.output["workspace"]["ref"] == store.branch_head("repo", "main")
    assert not leases.held("repo", "main")


def test_the_worker_tells_its_lease_groups_which_deliveries_ran_and_ended_here(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    """What lets a re-delivery on the same worker stop waiting out report windows once its
    earlier delivery has ended (perago.publish.deliveries): the worker records each delivery
    it starts and ends, in the object its publisher's lease groups read."""
    leases = memory_leases(Clock())
    with running(stub, store, tmp_path, leases=leases) as worker:
        local = worker._deliveries
        groups = worker._runner._publisher._groups
        assert groups is not None and groups.deliveries is local
        wid = step(stub)
        assert settle(stub, wid).status == "COMPLETED"
        task_id = stub.final(wid).task_id
        stub.wait_for(lambda s: worker.in_flight() == 0)
    assert local.earlier_ended_here(task_id, 2)
    assert not local.earlier_ended_here(task_id, 3)  # poll count 2 was never seen here


def _replacement_frozen_before_its_reset(stub: StubOrchestrator, freezer: Freezer) -> str:
    """The first attempt frozen after publishing and timed out; its retry, replacing that
    publication, frozen under the branch lease just before the hard reset."""
    wid = step(stub, retries=2)
    stub.wait_for(lambda s: freezer.hits.count("after_publish") == 1)
    stub.time_out(stub.attempts(wid)[0].task_id)
    stub.wait_for(lambda s: freezer.hits.count("before_reset") == 1)
    return wid


def test_killed_before_the_reset_of_a_replacement_the_next_retry_completes_once(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after publishing, then the retry killed under the lease before its reset."""
    base = store.branch_head("repo", "main")
    leases = memory_leases(Clock())
    freezer = Freezer(monkeypatch).at("after_publish").at("before_reset")
    with running(stub, store, tmp_path, leases=leases, concurrency=3):
        wid = _replacement_frozen_before_its_reset(stub, freezer)
        stub.time_out(stub.attempts(wid)[1].task_id)
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED" and stub.final(wid).retry_count == 2
    assert len(publications(store, base)) == 1
    assert store.tree("repo", "main")["data/out.txt"] == b"hello from retry 2"


def test_a_paused_lease_holder_loses_to_the_taker(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = store.branch_head("repo", "main")
    leases = memory_leases(Clock())
    freezer = Freezer(monkeypatch).at("after_publish").at("before_reset")
    with running(stub, store, tmp_path, leases=leases, concurrency=3):
        wid = _replacement_frozen_before_its_reset(stub, freezer)
        sleeper = stub.attempts(wid)[1].task_id
        stub.time_out(sleeper)
        settle(stub, wid)
        taker_head = store.branch_head("repo", "main")
        freezer.resume()  # SIGCONT: the sleeper goes on, under a lease it lost
        stub.wait_for(lambda s: len(s.reports(sleeper)) == 1)
    late = stub.reports(sleeper)[0].outcome
    assert late is not None and late.status == "FAILED" and "lease lost" in late.reason
    assert store.branch_head("repo", "main") == taker_head
    assert len(publications(store, base)) == 1


def test_two_publications_from_one_input_ref_exactly_one_lands(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both pass the publish fence on the same head; lakeFS's merge rejects the second."""
    base = store.branch_head("repo", "main")
    barrier = threading.Barrier(2, timeout=30)
    Freezer(monkeypatch).hooks["after_publish_fence"] = lambda: barrier.wait() and None
    with running(stub, store, tmp_path):
        a = step(stub, workspace=ws(ref=base), text="a")
        b = step(stub, workspace=ws(ref=base), text="b")
        outcomes = sorted([settle(stub, a), settle(stub, b)], key=lambda o: o.status)
    # Both pinned the input ref: a retry would start from it again, so no retry is spent.
    assert [o.status for o in outcomes] == ["COMPLETED", "FAILED_WITH_TERMINAL_ERROR"]
    assert "rejected the merge" in outcomes[1].reason
    assert "pinned its input ref" in outcomes[1].reason
    assert len(publications(store, base)) == 1


# -- drain, interrupts, lost reports ----------------------------------------------------------


def test_drain_lets_an_in_flight_attempt_finish_within_the_grace(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    release = threading.Event()
    SCRIPT.hooks[0] = lambda: release.wait(30) or None
    with running(stub, store, tmp_path, shutdown_grace=timedelta(seconds=30)) as worker:
        wid = step(stub)
        stub.wait_for(lambda s: SCRIPT.bodies == 1)
        worker.stop()
        assert worker.draining and worker.in_flight() == 1
        step(stub)  # submitted while draining: never polled
        release.set()
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED"
    assert SCRIPT.bodies == 1 and len(stub.reports()) == 1


def _until_cancelled(stopped: threading.Event) -> Callable[[], None]:
    """A body's loop that checks for cancellation between chunks of work."""

    def body() -> None:
        chunk = 0
        while not perago.wait_cancelled(0.05):
            chunk += 1
            perago.progress(f"{chunk} chunks done")
        stopped.set()

    return body


def test_a_body_is_cancelled_once_conductor_timed_its_task_out(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    stopped = threading.Event()
    SCRIPT.hooks[0] = _until_cancelled(stopped)
    fast = {"extension_interval": timedelta(milliseconds=100)}
    with running(stub, store, tmp_path, **fast):
        wid = step(stub, retries=1, response_timeout_seconds=60)
        stub.wait_for(lambda s: SCRIPT.bodies == 1)
        assert not stopped.wait(0.5)  # extended, still ours: it runs on
        stub.time_out(stub.attempts(wid)[0].task_id)
        assert stopped.wait(5)
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED"  # the retry
    assert len(publications(store, base)) == 1


def test_progress_notes_travel_with_the_next_extension(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    release = threading.Event()

    def body() -> None:
        perago.progress("1 of 3 files")
        release.wait(30)

    SCRIPT.hooks[0] = body
    fast = {"extension_interval": timedelta(milliseconds=100)}
    with running(stub, store, tmp_path, **fast):
        wid = step(stub, response_timeout_seconds=60)

        def sent(s: StubOrchestrator) -> bool:
            return any(u.kind == "extend" and u.progress == "1 of 3 files" for u in s.updates)

        stub.wait_for(sent)
        stub.wait_for(lambda s: sum(u.kind == "extend" for u in s.updates) >= 3)
        release.set()
        assert settle(stub, wid).status == "COMPLETED"
    notes = [u.progress for u in stub.updates if u.kind == "extend"]
    assert notes.count("1 of 3 files") == 1 and set(notes) == {"1 of 3 files", None}


def test_an_attempt_outliving_the_grace_fails_with_worker_shutdown_and_is_retried(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")

    def forever() -> None:
        while True:
            threading.Event().wait(0.01)

    SCRIPT.hooks[0] = forever
    with running(stub, store, tmp_path, shutdown_grace=timedelta(milliseconds=200)) as worker:
        wid = step(stub, retries=1)
        stub.wait_for(lambda s: SCRIPT.bodies == 1)
        worker.stop()
        first = stub.attempts(wid)[0].task_id
        stub.wait_for(lambda s: s.outcome(first) is not None)
    assert stub.outcome(first) == Outcome(
        "FAILED", reason="worker shutdown: the attempt was interrupted"
    )
    assert store.branch_head("repo", "main") == base and staging(store) == []
    with running(stub, store, tmp_path):  # a fresh worker takes the retry
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED" and len(publications(store, base)) == 1


def test_an_interrupt_during_the_report_stops_the_worker_and_the_retry_recovers(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    gate = stub.hold("report")
    with running(stub, store, tmp_path, shutdown_grace=timedelta(milliseconds=200)) as worker:
        wid = step(stub, retries=1)
        assert gate.arrived.wait(30)
        worker.stop()  # the report never comes back: the drain interrupts it
    first = stub.attempts(wid)[0]
    assert len(stub.reports(first.task_id)) == 1 and not gate.released
    assert stub.task(first.task_id).status == "IN_PROGRESS"  # Conductor never heard
    stub.time_out(first.task_id)
    with running(stub, store, tmp_path):
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED"
    assert [c.id for c in publications(store, base)] == [outcome.output["workspace"]["ref"]]


@pytest.mark.parametrize("applied", [False, True], ids=["request-lost", "answer-lost"])
def test_a_lost_report(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, applied: bool
) -> None:
    """Lost on the way: Conductor times the attempt out and the retry replaces the
    publication. Only the answer lost: the task is COMPLETED and nothing runs again."""
    base = store.branch_head("repo", "main")
    stub.fail("report", applied=applied)
    with running(stub, store, tmp_path):
        wid = step(stub, retries=1)
        first = stub.attempts(wid)[0].task_id
        stub.wait_for(lambda s: len(s.reports(first)) == 1)
        if not applied:
            assert stub.task(first).status == "IN_PROGRESS"
            stub.time_out(first)
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED"
    assert len(stub.attempts(wid)) == (1 if applied else 2)
    assert [c.id for c in publications(store, base)] == [outcome.output["workspace"]["ref"]]


def test_response_timeout_extensions_are_sent_while_the_body_runs(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    release = threading.Event()
    SCRIPT.hooks[0] = lambda: release.wait(30) or None
    with running(stub, store, tmp_path):
        wid = step(stub, response_timeout_seconds=3)
        stub.wait_for(lambda s: any(u.kind == "extend" for u in s.updates))
        release.set()
        settle(stub, wid)
    kinds = [u.kind for u in stub.updates]
    assert kinds[-1] == "report" and set(kinds[:-1]) == {"extend"}


def test_an_extension_in_flight_never_undoes_the_final_report(
    store: MemoryStore, tmp_path: Path
) -> None:
    """The stub's racy Conductor lets a held extension write its stale IN_PROGRESS back after
    the report; the worker never overlaps the two (perago.worker.report), so the report stands."""
    stub = StubOrchestrator(racy_updates=True, gate_timeout=10)
    # The extension has read the task and is slow to write: the report is sent meanwhile.
    gate = stub.hold("extend", release_after=0.5)
    SCRIPT.hooks[0] = lambda: gate.arrived.wait(30) and None
    with running(stub, store, tmp_path):
        wid = step(stub, response_timeout_seconds=3)
        assert gate.done.wait(30)  # the held extension has written
        settle(stub, wid)
    assert stub.final(wid).status == "COMPLETED"
    assert [u.kind for u in stub.updates] == ["extend", "report"]


class _FastWaits(threading.Event):
    """The worker's drain event, recording each wait's timeout and waiting 10 ms at most."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return super().wait(0.01 if timeout is None else min(timeout, 0.01))


def test_a_failed_poll_backs_off_and_polls_again(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    """Each failed poll in a row doubles the wait before the next (1, 2, 4 s), and the first
    poll that answers resets it."""
    stub.fail("poll", times=3)
    quiet = settings(tmp_path, wap_sweep_interval=timedelta(0))  # its waits are not polls
    worker = Worker(TASKS, settings=quiet, store=store, orchestrator=stub)
    waits = worker._draining = _FastWaits()
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    with structlog.testing.capture_logs() as logs:
        thread.start()
        try:
            assert settle(stub, step(stub)).status == "COMPLETED"
        finally:
            worker.stop()
            thread.join(10)
    retries = [e["retry_in"] for e in logs if e["event"] == "poll_failed"]
    assert retries == [1.0, 2.0, 4.0]
    backoffs = [t for t in waits.timeouts if t is not None and t >= 1.0]
    assert backoffs == [1.0, 2.0, 4.0]  # waited each time, and not again once polls answered


# -- the runner alone -------------------------------------------------------------------------


def test_the_runner_alone_maps_a_delivery_to_an_outcome(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    runner = AttemptRunner(store, stub, settings(tmp_path))
    stub.submit("writer", {"workspace": ws(), "params": {"mode": "raise"}}, workflow_id="wf")
    (delivery,) = stub.poll("writer", worker_id="w1", count=1)
    outcome = runner.run(writer, delivery).outcome
    assert outcome.status == "FAILED" and "the body failed" in outcome.reason
    assert stub.updates == []  # the runner decides; the worker reports


def test_every_event_of_an_attempt_carries_its_context(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    """The log context is bound once (structlog contextvars) and reaches the publisher's
    events without a logger passed along."""
    import structlog

    capture = structlog.testing.LogCapture()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture])
    base = store.branch_head("repo", "main")
    try:
        with running(stub, store, tmp_path):
            wid = step(stub)
            settle(stub, wid)
    finally:
        structlog.reset_defaults()
    task_id = stub.final(wid).task_id
    steps = {
        "pre_guardrails_passed",
        "materialized",
        "body_finished",
        "diffed",
        "attempt_fence_passed",
        "staging_branch_created",
        "staged",
        "publish_fence_passed",
        "published",
        "staging_branch_deleted",
        "attempt_finished",
    }
    events = [e for e in capture.entries if e["event"] in steps]
    assert {e["event"] for e in events} == steps
    for e in events:
        assert (e["workflow_id"], e["task_id"], e["task_ref"], e["retry_count"]) == (
            wid,
            task_id,
            "step",
            0,
        ), e
        assert (e["repository"], e["branch"], e["input_ref"]) == ("repo", "main", base), e


def test_observers_see_every_step_boundary_of_a_publication_in_order(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    """Failpoints and metrics are observers of `perago.telemetry.steps`; any other observer sees the
    same boundaries, in the order of the protocol, each with the attempt that reached it."""
    seen: list[Boundary] = []
    attempts: set[tuple[str, str, int, int]] = set()

    def observer(boundary: Boundary, attempt: steps.Attempt) -> None:
        seen.append(boundary)
        attempts.add(
            (attempt.workflow_id, attempt.task_id, attempt.retry_count, attempt.poll_count)
        )

    remove = steps.observe(observer)
    try:
        with running(stub, store, tmp_path):
            workflow_id = step(stub)
            outcome = settle(stub, workflow_id)
    finally:
        remove()
    assert outcome.status == "COMPLETED"
    assert len(attempts) == 1 and next(iter(attempts))[0] == workflow_id, attempts
    assert seen == [
        Boundary.AFTER_MATERIALIZE,
        Boundary.AFTER_BODY,
        Boundary.AFTER_FENCE1,
        Boundary.AFTER_STAGE,
        Boundary.AFTER_FENCE2,
        Boundary.AFTER_PUBLISH_FENCE,
        Boundary.AFTER_PUBLISH,
        Boundary.AFTER_COMPLETE,
    ]
    assert list(Boundary) == [Boundary(p) for p in failpoints.POINTS]


def test_unknown_params_are_dropped_when_the_setting_says_ignore(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    with running(stub, store, tmp_path, params_extra="ignore"):
        outcome = settle(stub, step(stub, txet="typo"))
    assert outcome.status == "COMPLETED"


def test_a_missing_module_is_terminal_and_says_what_to_install(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    with running(stub, store, tmp_path):
        wid = step(stub, retries=3, mode="import")
        outcome = settle(stub, wid)
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "module 'perago_no_such_module'" in outcome.reason and "install it" in outcome.reason
    assert len(stub.attempts(wid)) == 1  # no retry spent


def test_a_pinned_ref_that_moved_is_terminal_an_unpinned_one_retries(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    store.upload_bytes("repo", "main", "elsewhere/x.txt", b"foreign")
    store.commit("repo", "main", message="a foreign writer", metadata={})
    with running(stub, store, tmp_path):
        pinned = step(stub, retries=3, workspace=ws(ref=base))
        outcome = settle(stub, pinned)
        unpinned = step(stub, retries=3)
        assert settle(stub, unpinned).status == "COMPLETED"
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "not Perago" in outcome.reason and "pinned its input ref" in outcome.reason
    assert len(stub.attempts(pinned)) == 1


class ClusterSpark:
    """A session provider whose master is a cluster (``target`` as SparkSessions has it)."""

    def __init__(self, url: str) -> None:
        from perago.worker.spark import SparkTarget

        self.target = SparkTarget(url, "MASTER")
        self.tags: list[str] = []

    def __call__(self) -> Any:
        return self

    def addTag(self, tag: str) -> None:
        self.tags.append(tag)

    def removeTag(self, tag: str) -> None:
        pass

    def sql(self, query: str) -> Any:
        return self

    def collect(self) -> list[Any]:
        return []


def test_a_local_projection_spark_task_on_a_cluster_is_refused_unless_the_disk_is_shared(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    cluster = ClusterSpark("spark://m:7077")
    with running(stub, store, tmp_path, spark=cluster):
        refused = settle(stub, step(stub, task_type="sparky", retries=2))
    assert refused.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "in_place=True" in refused.reason and "PERAGO_SPARK_SHARED_FILESYSTEM" in refused.reason
    assert cluster.tags == []  # the body never ran
    with running(stub, store, tmp_path, spark=cluster, spark_shared_filesystem=True):
        wid = step(stub, task_type="sparky")
        shared = settle(stub, wid)
    assert shared.status == "COMPLETED"
    assert cluster.tags == [f"perago-{stub.final(wid).task_id}"]  # its jobs carried its tag
