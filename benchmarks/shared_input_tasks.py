"""The task the shared-input benchmark runs: one partition joined with one big dimension."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from perago import Inputs, WorkspaceSpec, task


class Part(BaseModel):
    part: str


class Read(BaseModel):
    part_bytes: int
    dim_bytes: int


@task(
    "bench_shared_input",
    workspace=WorkspaceSpec(
        prefix="bench/out/p={part}/",
        inputs={"part": "bench/in/p={part}/", "dim": "bench/dim/"},
    ),
    retry_count=0,
)
def bench_shared_input(workspace: Path, params: Part, inputs: Inputs[Path]) -> Read:
    """Read every byte of both inputs (the join), write a one-line summary."""
    sizes = {}
    for name in ("part", "dim"):
        total = 0
        for f in sorted(inputs[name].rglob("*")):
            if f.is_file():
                with f.open("rb") as src:
                    while chunk := src.read(1 << 20):
                        total += len(chunk)
        sizes[name] = total
    (workspace / "summary.txt").write_text(f"{sizes}\n")
    return Read(part_bytes=sizes["part"], dim_bytes=sizes["dim"])
