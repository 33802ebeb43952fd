"""The tasks of the chaos run: a writer that can fail on purpose, a fan-out partition writer,
and a reader."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from perago import TaskError, WorkspaceSpec, info, task

RESPONSE_TIMEOUT = timedelta(seconds=float(os.environ.get("CHAOS_RESPONSE_TIMEOUT", "20")))


class WriteParams(BaseModel):
    sleep: float = 0.0
    fail_first: bool = False  # the body's first try fails (tried again inside the attempt)
    terminal: bool = False  # every attempt fails, non-retryable


class WriteResult(BaseModel):
    path: str


@task(
    "chaos_write",
    workspace=WorkspaceSpec(prefix="data/"),
    retry_count=4,
    retry_delay=timedelta(seconds=1),
    response_timeout=RESPONSE_TIMEOUT,
)
def write(workspace: Path, params: WriteParams) -> WriteResult:
    """One file per step plus a line in a shared log: every step changes the workspace."""
    attempt = info()
    deadline = time.monotonic() + params.sleep
    while time.monotonic() < deadline:
        time.sleep(0.05)
    if params.terminal:
        raise TaskError("this step always fails (chaos mix)", non_retryable=True)
    if params.fail_first and attempt.retry_count == 0 and attempt.body_try == 0:
        raise TaskError("this step fails its first try (chaos mix)")
    name = f"{attempt.workflow_id}-{attempt.reference_name}.txt"
    (workspace / name).write_text(f"{attempt.workflow_id} {attempt.reference_name}\n")
    log = workspace / "log.txt"
    previous = log.read_text() if log.exists() else ""
    log.write_text(previous + f"{attempt.workflow_id} {attempt.reference_name}\n")
    return WriteResult(path=name)


class PartParams(BaseModel):
    part: str
    sleep: float = 0.0
    fail_first: bool = False


@task(
    "chaos_part",
    workspace=WorkspaceSpec(prefix="parts/p={part}/"),
    retry_count=4,
    retry_delay=timedelta(seconds=1),
    response_timeout=RESPONSE_TIMEOUT,
)
def part(workspace: Path, params: PartParams) -> WriteResult:
    """One partition of a fan-out: its own scope, published beside its siblings."""
    attempt = info()
    time.sleep(params.sleep)
    if params.fail_first and attempt.retry_count == 0 and attempt.body_try == 0:
        raise TaskError("this partition fails its first try (chaos mix)")
    (workspace / "rows.txt").write_text(f"{attempt.workflow_id} {params.part}\n")
    return WriteResult(path="rows.txt")


class ReadParams(BaseModel):
    sleep: float = 0.0


class ReadResult(BaseModel):
    files: int


@task(
    "chaos_read",
    workspace=WorkspaceSpec(prefix="data/", read_only=True),
    retry_count=4,
    retry_delay=timedelta(seconds=1),
    response_timeout=RESPONSE_TIMEOUT,
)
def read(workspace: Path, params: ReadParams) -> ReadResult:
    time.sleep(params.sleep)
    return ReadResult(files=sum(1 for p in workspace.rglob("*") if p.is_file()))
