"""A failing body is tried again inside its attempt (issue 39, item 2): each try in a fresh
workspace at the same input ref, every try in the task log, terminal once the tries run out,
the worker's place held while it waits; ``body_retries=0`` leaves retries to Conductor."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

import perago
from perago import TaskDefinitionError, WorkspaceSpec, task
from perago.core.orchestrator import Outcome
from perago.telemetry import metrics
from perago.testing import MemoryStore, StubOrchestrator, running_worker


class P(BaseModel):
    fails: int = 0  # the first `fails` runs of the body raise
    key: str = "a"


class R(BaseModel):
    body_try: int
    leftovers: list[str]


#: Tries seen per params key: (body_try, retry_count).
SEEN: dict[str, list[tuple[int, int]]] = {}
ORDER: list[tuple[str, int]] = []
WAITING = threading.Event()
NOW = timedelta(0)


def _flaky(workspace: Path, params: P) -> R:
    me = perago.info()
    SEEN.setdefault(params.key, []).append((me.body_try, me.retry_count))
    ORDER.append((params.key, me.body_try))
    leftovers = sorted(p.name for p in workspace.iterdir())
    (workspace / f"try-{me.body_try}.txt").write_text(str(me.body_try))
    if len(SEEN[params.key]) <= params.fails:  # tries of the body so far, in any attempt
        WAITING.set()
        raise ConnectionError(f"try {me.body_try} lost its connection")
    return R(body_try=me.body_try, leftovers=leftovers)


flaky = task("br_flaky", workspace=WorkspaceSpec(prefix="out/"), retry_count=2, retry_delay=NOW)(
    _flaky
)
to_conductor = task(
    "br_conductor",
    workspace=WorkspaceSpec(prefix="out/"),
    retry_count=2,
    retry_delay=NOW,
    body_retries=0,
)(_flaky)
patient = task(
    "br_patient",
    workspace=WorkspaceSpec(prefix="out/"),
    retry_count=1,
    retry_delay=timedelta(minutes=5),
)(_flaky)


@task("br_async", workspace=WorkspaceSpec(prefix="out/"), retry_count=1, retry_delay=NOW)
async def flaky_async(workspace: Path, params: P) -> R:
    await asyncio.sleep(0)
    return _flaky(workspace, params)


TASKS = [flaky, to_conductor, patient, flaky_async]


@pytest.fixture
def store() -> MemoryStore:
    SEEN.clear()
    ORDER.clear()
    WAITING.clear()
    s = MemoryStore()
    s.create_repository("repo")
    s.upload_bytes("repo", "main", "out/kept.txt", b"from the input ref")
    s.commit("repo", "main", message="seed", metadata={})
    return s


def _run(
    store: MemoryStore, tmp_path: Path, name: str, params: dict[str, object], **settings: object
) -> tuple[StubOrchestrator, list[Outcome]]:
    stub = StubOrchestrator()
    with running_worker(TASKS, store=store, orchestrator=stub, work_dir=tmp_path, **settings):
        stub.submit(
            name,
            {"workspace": {"repository": "repo", "branch": "main"}, "params": params},
            workflow_id="wf",
            retries=2,
        )
        stub.wait_for(lambda s: s.settled("wf"))
    outcomes = [stub.outcome(a.task_id) for a in stub.attempts("wf")]
    assert all(o is not None for o in outcomes)
    return stub, [o for o in outcomes if o is not None]


def _retries(name: str) -> float:
    return metrics.BODY_RETRIES.labels(name)._value.get()  # type: ignore[attr-defined, no-any-return]


def test_a_failing_body_is_tried_again_in_a_fresh_workspace_of_the_same_attempt(
    store: MemoryStore, tmp_path: Path
) -> None:
    before = _retries("br_flaky")
    head = store.branch_head("repo", "main")
    _, [outcome] = _run(store, tmp_path, "br_flaky", {"fails": 2})  # one Conductor attempt
    assert outcome.status == "COMPLETED", outcome.reason
    assert SEEN["a"] == [(0, 0), (1, 0), (2, 0)]
    # the third try saw only what the input ref holds, nothing the failed tries wrote
    assert outcome.output["result"] == {"body_try": 2, "leftovers": ["kept.txt"]}
    published = store.branch_head("repo", "main")
    assert store.get_commit("repo", published).parents[0] == head
    files = sorted(o.path for o in store.list_objects("repo", published, "out/"))
    assert files == ["out/kept.txt", "out/try-2.txt"]
    # each failed try's traceback is in the task log, before the outcome's own
    assert "try 1 of 3 failed:" in outcome.details and "try 2 of 3 failed:" in outcome.details
    assert "ConnectionError: try 1 lost its connection" in outcome.details
    assert _retries("br_flaky") - before == 2


def test_the_tries_run_out_into_a_terminal_failure_with_every_try_in_the_task_log(
    store: MemoryStore, tmp_path: Path
) -> None:
    head = store.branch_head("repo", "main")
    _, [outcome] = _run(store, tmp_path, "br_flaky", {"fails": 9})
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "ConnectionError: try 2 lost its connection" in outcome.reason
    assert "the body failed all 3 tries of this attempt" in outcome.reason
    assert "body_retries" in outcome.reason
    log = outcome.details
    assert log.index("try 1 of 3 failed:") < log.index("try 2 of 3 failed:")
    assert "try 3 of 3" not in log and log.rstrip().endswith("try 2 lost its connection")
    assert len(SEEN["a"]) == 3 and store.branch_head("repo", "main") == head


def test_body_retries_zero_leaves_a_failing_body_to_conductor(
    store: MemoryStore, tmp_path: Path
) -> None:
    _, outcomes = _run(store, tmp_path, "br_conductor", {"fails": 1})
    assert [o.status for o in outcomes] == ["FAILED", "COMPLETED"]
    assert SEEN["a"] == [(0, 0), (0, 1)]


def test_an_async_body_is_tried_again_too(store: MemoryStore, tmp_path: Path) -> None:
    _, [outcome] = _run(store, tmp_path, "br_async", {"fails": 1})
    assert outcome.status == "COMPLETED", outcome.reason
    assert SEEN["a"] == [(0, 0), (1, 0)]


def test_a_drain_while_it_waits_for_the_next_try_stops_it_and_publishes_nothing(
    store: MemoryStore, tmp_path: Path
) -> None:
    head = store.branch_head("repo", "main")
    stub = StubOrchestrator()
    with running_worker(TASKS, store=store, orchestrator=stub, work_dir=tmp_path) as worker:
        stub.submit(
            "br_patient",
            {"workspace": {"repository": "repo", "branch": "main"}, "params": {"fails": 1}},
            workflow_id="wf",
        )
        assert WAITING.wait(20)
        worker.stop()  # the next try is 5 minutes away: the drain must not wait for it
        stub.wait_for(lambda s: s.settled("wf"), timeout=10)
    (attempt,) = stub.attempts("wf")
    outcome = stub.outcome(attempt.task_id)
    assert outcome is not None and outcome.status == "FAILED"
    assert "while it waited to try the body again" in outcome.reason
    assert SEEN["a"] == [(0, 0)] and store.branch_head("repo", "main") == head


def test_a_body_waiting_for_its_next_try_keeps_its_place(
    store: MemoryStore, tmp_path: Path
) -> None:
    """With one place, a second task waits until the first one's tries are over."""
    stub = StubOrchestrator()
    with running_worker(TASKS, store=store, orchestrator=stub, work_dir=tmp_path, concurrency=1):
        body = {"workspace": {"repository": "repo", "branch": "main"}}
        stub.submit("br_flaky", {**body, "params": {"fails": 2, "key": "a"}}, workflow_id="a")
        assert WAITING.wait(20)
        stub.submit("br_flaky", {**body, "params": {"key": "b"}}, workflow_id="b")
        stub.wait_for(lambda s: s.settled("a") and s.settled("b"))
    assert ORDER == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]


def test_body_retries_must_be_a_whole_number() -> None:
    with pytest.raises(TaskDefinitionError, match="body_retries must be a whole number"):
        task("br_bad", workspace=WorkspaceSpec(prefix="x/"), body_retries=-1)
    assert flaky.options.body_tries == 3 and to_conductor.options.body_tries == 1
