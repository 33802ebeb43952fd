"""A one-file task used by the smoke workflow and the runtime's tests."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from perago import WorkspaceSpec, task


class GreetParams(BaseModel):
    name: str = "world"


class GreetResult(BaseModel):
    path: str
    bytes_written: int


@task("perago_smoke_greet", workspace=WorkspaceSpec(prefix="smoke/"))
def greet(workspace: Path, params: GreetParams) -> GreetResult:
    """Write ``hello-<name>.txt`` into the workspace; Perago publishes it."""
    target = workspace / f"hello-{params.name}.txt"
    text = f"hello, {params.name}\n"
    target.write_text(text)
    return GreetResult(path=f"smoke/{target.name}", bytes_written=len(text.encode()))
