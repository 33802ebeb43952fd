"""A finished body frees its place: the worker polls for the next body while the attempt is
still publishing (up to ``publications_in_flight`` of them), and only then."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from perago import WorkspaceSpec, task
from perago.telemetry import steps
from perago.telemetry.steps import Boundary
from perago.testing import MemoryStore, StubOrchestrator, running_worker


class P(BaseModel):
    n: int = 0


class R(BaseModel):
    n: int = 0


class Bodies:
    """How many bodies ran; the test holds every publication at its first fence."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = 0
        self.publishing = 0
        self.release = threading.Event()


BODIES = Bodies()


@task("pp_writer", workspace=WorkspaceSpec(prefix="parts/p={n}/"))
def writer(workspace: Path, params: P) -> R:
    with BODIES.lock:
        BODIES.started += 1
    (workspace / "rows.csv").write_text(f"{params.n}\n")
    return R(n=params.n)


@pytest.fixture
def held_publications() -> Iterator[None]:
    """Every publication waits after its first attempt fence until the test releases it."""
    BODIES.__init__()  # type: ignore[misc]

    def hold(boundary: Boundary, _attempt: steps.Attempt) -> None:
        if boundary is Boundary.AFTER_FENCE1:
            with BODIES.lock:
                BODIES.publishing += 1
            BODIES.release.wait(20)

    remove = steps.observe(hold)
    try:
        yield
    finally:
        BODIES.release.set()
        remove()


@pytest.mark.parametrize("extra", [0, 2])
def test_publishing_attempts_free_their_places_up_to_the_setting(
    tmp_path: Path, held_publications: None, extra: int
) -> None:
    """Concurrency 1: with no room for publications the second body waits for the first
    attempt's report; with room for 2, three bodies run one after the other and all three
    publish at once, and the fourth waits (3 in flight: 1 place + 2 publications)."""
    store = MemoryStore()
    store.create_repository("repo")
    stub = StubOrchestrator(gate_timeout=20)
    ws = {"repository": "repo", "branch": "main"}
    with running_worker(
        [writer],
        store=store,
        orchestrator=stub,
        work_dir=tmp_path / "w",
        concurrency=1,
        publications_in_flight=extra,
    ) as worker:
        for i in range(5):
            stub.submit("pp_writer", {"workspace": ws, "params": {"n": i}}, workflow_id=f"f{i}")
        stub.wait_for(lambda _: BODIES.publishing == extra + 1)
        _poll_loop_turned(worker)  # it looked for a free place again: nothing more started
        assert BODIES.started == extra + 1
        assert worker.in_flight() == extra + 1
        BODIES.release.set()
        stub.wait_for(lambda s: all(s.settled(f"f{i}") for i in range(5)))
    assert all(stub.final(f"f{i}").status == "COMPLETED" for i in range(5))
    assert BODIES.started == 5


def _poll_loop_turned(worker: Any) -> None:
    """Until the worker's poll loop has begun two rounds after now, so one round (count
    its free places, poll if any) ran wholly after the caller's observation."""
    seen = time.monotonic()
    for _ in range(2):
        deadline = time.monotonic() + 10
        while worker._last_loop <= seen:
            assert time.monotonic() < deadline, "the poll loop stopped"
            time.sleep(0.001)
        seen = worker._last_loop
