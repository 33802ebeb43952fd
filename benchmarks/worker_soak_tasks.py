"""The tasks of the worker soak: light writers and readers, a failing writer, a Spark task
capped at one attempt at a time, and a cancellable slow task (drained at the end)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import perago
from perago import TaskError, WorkspaceSpec, task


class Part(BaseModel):
    part: str
    fail_first: bool = False


class Done(BaseModel):
    files: int


@task("soak_write", workspace=WorkspaceSpec(prefix="soak/p={part}/"), retry_count=2)
def soak_write(workspace: Path, params: Part) -> Done:
    if params.fail_first and perago.info().retry_count == 0:
        raise TaskError("the soak's failing writer fails its first attempt on purpose")
    for i in range(3):
        (workspace / f"f{i}.bin").write_bytes(os.urandom(2048))
    return Done(files=3)


@task("soak_read", workspace=WorkspaceSpec(prefix="soak_ref/", read_only=True), retry_count=2)
def soak_read(workspace: Path, params: Part) -> Done:
    return Done(files=sum(1 for p in workspace.rglob("*") if p.is_file()))


@task("soak_spark", workspace=WorkspaceSpec(prefix="spark/p={part}/"), retry_count=2, concurrency=1)
def soak_spark(workspace: Path, params: Part, spark: Any) -> Done:
    rows = spark.range(2000).selectExpr("id", "id * 2 AS twice").collect()
    (workspace / "sum.txt").write_text(str(sum(r.twice for r in rows)))
    return Done(files=1)


@task("soak_slow", workspace=WorkspaceSpec(prefix="slow/p={part}/"), retry_count=0)
def soak_slow(workspace: Path, params: Part) -> Done:
    """Works until cancelled (the soak drains the worker while these run)."""
    while not perago.wait_cancelled(0.2):
        perago.progress("still working")
    return Done(files=0)
