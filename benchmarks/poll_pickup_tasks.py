"""Tasks for the pick-up benchmark: ``BENCH_PICKUP_TYPES`` read-only no-op task types, as a
module of many task types has (the worker polls them all; the chain uses the last one)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from perago import WorkspaceSpec, task

TYPES = int(os.environ.get("BENCH_PICKUP_TYPES", "1"))
PREFIX = os.environ.get("BENCH_PICKUP_PREFIX", "bench_pickup")


class Nothing(BaseModel):
    pass


def _nothing(workspace: Path, params: Nothing) -> Nothing:
    return Nothing()


TASKS = [
    task(f"{PREFIX}_{i:02d}", workspace=WorkspaceSpec(prefix="x/", read_only=True), retry_count=0)(
        _nothing
    )
    for i in range(TYPES)
]
globals().update({t.name: t for t in TASKS})
