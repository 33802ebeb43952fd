"""Tasks with named inputs for tests/integration/test_inputs.py; names carry the test suffix."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from perago import Inputs, WorkspaceSpec, info, task

SUFFIX = os.environ.get("PERAGO_TEST_SUFFIX", "local")
RESPONSE_TIMEOUT = timedelta(seconds=float(os.environ.get("PERAGO_TEST_RESPONSE_TIMEOUT", "8")))
RETRIES = int(os.environ.get("PERAGO_TEST_RETRIES", "2"))


class Part(BaseModel):
    part: str
    #: Retry 0 waits (up to this long) until the target branch moves past its input ref.
    wait_for_a_sibling: float = 0.0


class Summary(BaseModel):
    part: str
    rows: int
    dimension: str


def _wait_for_a_sibling(seconds: float) -> None:
    """Block the first attempt until someone publishes on the branch it read (a sibling)."""
    me = info()
    if not seconds or me.retry_count > 0:
        return
    from perago import config, wiring

    store = wiring.lakefs_store(config.load())
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if store.branch_head(me.repository, me.branch) != me.input_ref:
                return
            time.sleep(0.2)
    finally:
        store.close()


def summarise(workspace: Path, params: Part, inputs: Inputs[Path]) -> Summary:
    _wait_for_a_sibling(params.wait_for_a_sibling)
    rows = (inputs["part"] / "rows.csv").read_text().splitlines()
    dimension = (inputs["dim"] / "dim.csv").read_text().strip()
    (workspace / "summary.txt").write_text(f"{len(rows)} rows, dimension {dimension}\n")
    return Summary(part=params.part, rows=len(rows), dimension=dimension)


INPUTS = {"part": "parts/p={part}/", "dim": "dims/d/"}


@task(
    f"in_summary_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="summaries/p={part}/", inputs=INPUTS),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
def summary(workspace: Path, params: Part, inputs: Inputs[Path]) -> Summary:
    """One partition joined with the shared dimension (snapshot isolation)."""
    return summarise(workspace, params, inputs)


@task(
    f"in_summary_ser_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="summaries/p={part}/", inputs=INPUTS, isolation="serializable"),
    retry_count=RETRIES,
    retry_delay=timedelta(seconds=0),
    response_timeout=RESPONSE_TIMEOUT,
)
def summary_serializable(workspace: Path, params: Part, inputs: Inputs[Path]) -> Summary:
    """The same under serializable isolation."""
    return summarise(workspace, params, inputs)


class PartRows(BaseModel):
    part: str
    rows: int = 3
    sleep: float = 0.0


@task(
    f"in_part_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="parts/p={part}/"),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
def part(workspace: Path, params: PartRows) -> Summary:
    """(Re)write one partition: the sibling that publishes what a summary reads."""
    time.sleep(params.sleep)
    (workspace / "rows.csv").write_text("".join(f"{params.part},{i}\n" for i in range(params.rows)))
    return Summary(part=params.part, rows=params.rows, dimension="")


class Scaled(BaseModel):
    part: str
    scale: int = 1


class Counted(BaseModel):
    part: str
    rows: int
    dimension: str  # its first line


@task(
    f"in_summary_inc_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="summaries/p={part}/", inputs=INPUTS),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
    incremental=True,
    code_version=os.environ.get("PERAGO_TEST_CODE_VERSION", "v1"),
)
def summary_incremental(workspace: Path, params: Scaled, inputs: Inputs[Path]) -> Counted:
    """One partition with the dimension, incremental: its output is a function of its two
    inputs, its params and its code version."""
    rows = len((inputs["part"] / "rows.csv").read_text().splitlines()) * params.scale
    dimension = (inputs["dim"] / "dim.csv").read_text().splitlines()[0]
    version = os.environ.get("PERAGO_TEST_CODE_VERSION", "v1")
    (workspace / "summary.txt").write_text(f"{rows} rows, dimension {dimension}, {version}\n")
    return Counted(part=params.part, rows=rows, dimension=dimension)
