"""Per-task concurrency: a heavy task type capped at 1 beside light ones on one worker."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pydantic import BaseModel

from perago import TaskDefinitionError, WorkspaceSpec, task
from perago.config import load
from perago.errors import ConfigError
from perago.testing import MemoryStore, StubOrchestrator, running_worker


class P(BaseModel):
    n: int = 0


class R(BaseModel):
    n: int = 0


class Gauge:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.release = threading.Event()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *_: object) -> None:
        with self.lock:
            self.now -= 1


HEAVY = Gauge()


@task("tc_heavy", workspace=WorkspaceSpec(prefix="heavy/", read_only=True), concurrency=1)
def heavy(workspace: Path, params: P) -> R:
    with HEAVY:
        HEAVY.release.wait(20)
    return R(n=params.n)


@task("tc_light", workspace=WorkspaceSpec(prefix="light/", read_only=True))
def light(workspace: Path, params: P) -> R:
    return R(n=params.n)


@pytest.mark.parametrize("from_settings", [False, True])
def test_a_capped_task_type_runs_one_at_a_time_and_light_ones_keep_flowing(
    tmp_path: Path, from_settings: bool
) -> None:
    HEAVY.__init__()  # type: ignore[misc]
    store = MemoryStore()
    store.create_repository("repo")
    stub = StubOrchestrator(gate_timeout=20)
    ws = {"repository": "repo", "branch": "main"}
    heavy_task = heavy
    overrides = {}
    if from_settings:  # the worker's setting caps a task that has no limit of its own
        heavy_task = task("tc_heavy", workspace=heavy.workspace)(heavy.fn)
        overrides = {"task_concurrency": {"tc_heavy": 1}}
    with running_worker(
        [heavy_task, light],
        store=store,
        orchestrator=stub,
        work_dir=tmp_path / "w",
        concurrency=4,
        **overrides,
    ):
        for i in range(3):
            stub.submit("tc_heavy", {"workspace": ws, "params": {"n": i}}, workflow_id=f"h{i}")
        for i in range(6):
            stub.submit("tc_light", {"workspace": ws, "params": {"n": i}}, workflow_id=f"l{i}")
        # every light task completes while one heavy attempt blocks the others (the heavy
        # body may start after the light ones are done: wait for it, never for a sleep)
        stub.wait_for(lambda s: all(s.settled(f"l{i}") for i in range(6)))
        stub.wait_for(lambda s: HEAVY.now == 1)
        assert HEAVY.now == 1 and HEAVY.most == 1
        assert not any(stub.settled(f"h{i}") for i in range(3))
        HEAVY.release.set()
        stub.wait_for(lambda s: all(s.settled(f"h{i}") for i in range(3)))
    assert HEAVY.most == 1
    assert all(stub.final(f"h{i}").status == "COMPLETED" for i in range(3))


def test_bad_limits_are_refused() -> None:
    with pytest.raises(TaskDefinitionError, match="concurrency must be a whole number"):
        task("tc_bad", workspace=WorkspaceSpec(prefix="x/"), concurrency=-1)
    with pytest.raises(ConfigError, match="at least 1"):
        load(env={"PERAGO_TASK_CONCURRENCY": '{"tc_heavy": 0}'})
