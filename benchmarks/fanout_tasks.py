"""The task the fan-out benchmark runs: 2 s of work and 100 x 64 KiB of output per partition."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel

from perago import WorkspaceSpec, task

SECONDS = float(os.environ.get("PERAGO_BENCH_BODY_SECONDS", "2"))
FILES = int(os.environ.get("PERAGO_BENCH_FILES", "100"))
SIZE = 64 * 1024


class Part(BaseModel):
    part: str


class Written(BaseModel):
    files: int


@task("bench_fanout_part", workspace=WorkspaceSpec(prefix="bench/p={part}/"), retry_count=0)
def bench_part(workspace: Path, params: Part) -> Written:
    """Sleep (the work), then write the partition's files (fresh bytes every run)."""
    time.sleep(SECONDS)
    for i in range(FILES):
        (workspace / f"f{i:03d}.bin").write_bytes(os.urandom(SIZE))
    return Written(files=FILES)
