"""The task the fan-out-at-scale benchmark runs: no work, 5 x 1 KiB of output per partition."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel

from perago import WorkspaceSpec, task

FILES = 5
SIZE = 1024


class Part(BaseModel):
    part: str


class Written(BaseModel):
    files: int


@task("bench_scale_part", workspace=WorkspaceSpec(prefix="parts/p={part}/"), retry_count=0)
def bench_scale_part(workspace: Path, params: Part) -> Written:
    """Write the partition's files (fresh bytes every run): all the cost is publication,
    unless ``BENCH_SCALE_BODY_SECONDS`` gives the body work to do (a sleep)."""
    time.sleep(float(os.environ.get("BENCH_SCALE_BODY_SECONDS", "0")))
    for i in range(FILES):
        (workspace / f"f{i}.bin").write_bytes(os.urandom(SIZE))
    return Written(files=FILES)


@task(
    "bench_scale_read",
    workspace=WorkspaceSpec(prefix="parts/p={part}/", read_only=True),
    retry_count=0,
)
def bench_scale_read(workspace: Path, params: Part) -> Written:
    """The same fan-out publishing nothing: what Conductor and the workers cost alone."""
    return Written(files=0)
