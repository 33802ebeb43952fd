"""Conductor task domains: which domain a worker polls each task in, and bad domains."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from perago import WorkspaceSpec, task
from perago.config import load
from perago.errors import ConfigError, TaskDefinitionError
from perago.testing import MemoryStore, StubOrchestrator
from perago.worker.loop import Worker, task_domain


class P(BaseModel):
    pass


class R(BaseModel):
    pass


@task("plain", workspace=WorkspaceSpec(prefix="a/"))
def plain(workspace: Path, params: P) -> R:
    return R()


@task("routed", workspace=WorkspaceSpec(prefix="b/"), domain="team-a")
def routed(workspace: Path, params: P) -> R:
    return R()


def test_the_task_setting_wins_then_the_task_then_the_worker() -> None:
    none = load(env={})
    assert task_domain(plain, none) is None
    assert task_domain(routed, none) == "team-a"
    worker_wide = load(env={"CONDUCTOR_WORKER_DOMAIN": "blue"})
    assert task_domain(plain, worker_wide) == "blue"
    assert task_domain(routed, worker_wide) == "team-a"
    per_task = load(
        env={"CONDUCTOR_WORKER_DOMAIN": "blue", "PERAGO_TASK_DOMAINS": '{"routed": "x"}'}
    )
    assert task_domain(routed, per_task) == "x"
    assert task_domain(plain, per_task) == "blue"


def test_a_bad_domain_is_refused_where_it_is_declared() -> None:
    with pytest.raises(TaskDefinitionError, match="not a Conductor task domain"):
        task("t", workspace=WorkspaceSpec(prefix="a/"), domain="team a")
    with pytest.raises(ConfigError, match="task_domains"):
        load(env={"PERAGO_TASK_DOMAINS": "team-a"})


def test_the_worker_polls_each_task_in_its_domain(tmp_path: Path) -> None:
    stub = StubOrchestrator()
    settings = load(
        env={"CONDUCTOR_WORKER_DOMAIN": "blue", "PERAGO_WORK_DIR": str(tmp_path)},
        janitor_on_start=False,
    )
    worker = Worker([plain, routed], settings=settings, store=MemoryStore(), orchestrator=stub)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    deadline = time.monotonic() + 10
    while len(stub.polled_domains) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    worker.stop()
    thread.join(timeout=10)
    assert stub.polled_domains == {("plain", "blue"), ("routed", "team-a")}
