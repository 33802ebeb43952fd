"""The poll loop fills a free place as soon as any of its task types has a task, whatever
the number of types (issue 41): a round asks every type without waiting, and only a round
that found nothing waits, in one long-poll of one type."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from perago import WorkspaceSpec, task
from perago.testing import MemoryStore, StubOrchestrator, running_worker


class P(BaseModel):
    pass


RAN: list[str] = []
LOCK = threading.Lock()


def _body(workspace: Path, params: P) -> P:
    with LOCK:
        RAN.append(workspace.name)
    return P()


TYPES = [
    task(f"poll_t{i:02d}", workspace=WorkspaceSpec(prefix="x/", read_only=True))(_body)
    for i in range(50)
]


def test_a_task_of_the_last_of_fifty_types_is_taken_in_the_next_round(tmp_path: Path) -> None:
    store = MemoryStore()
    store.create_repository("repo")
    stub = StubOrchestrator()
    # a long-poll of 200 ms, as the default: the old loop waited one per type, 10 s a round
    with running_worker(
        TYPES,
        store=store,
        orchestrator=stub,
        work_dir=tmp_path,
        poll_interval=timedelta(milliseconds=200),
    ):
        stub.wait_for(lambda s: sum(1 for _, w in s.polls if w > 0) >= 3)  # idle, waiting
        before = len(stub.polls)
        stub.submit(
            "poll_t49", {"workspace": {"repository": "repo", "branch": "main"}}, workflow_id="w"
        )
        stub.wait_for(lambda s: s.settled("w"))
        polls = stub.polls[before:]
    delivered = next(i for i, (name, _) in enumerate(polls) if name == "poll_t49")
    long_polls = [name for name, wait in polls[:delivered] if wait > 0]
    assert len(long_polls) <= 1, long_polls  # at most the long-poll already under way
    # a quiet worker asks each type once per round, then waits in one long-poll
    quiet = stub.polls[:before]
    first_long = next(i for i, (_, w) in enumerate(quiet) if w > 0)
    assert sorted(name for name, _ in quiet[:first_long]) == sorted(t.name for t in TYPES)
