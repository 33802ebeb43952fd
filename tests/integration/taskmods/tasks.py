"""Tasks the runtime tests drive; names carry PERAGO_TEST_SUFFIX so tests never share queues."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, Field

from perago import TaskError, WorkspaceSpec, info, progress, task, wait_cancelled

SUFFIX = os.environ.get("PERAGO_TEST_SUFFIX", "local")
RESPONSE_TIMEOUT = timedelta(seconds=float(os.environ.get("PERAGO_TEST_RESPONSE_TIMEOUT", "8")))
RETRIES = int(os.environ.get("PERAGO_TEST_RETRIES", "2"))


class WriteParams(BaseModel):
    files: dict[str, str] = Field(default_factory=dict)
    delete: list[str] = Field(default_factory=list)
    only_on_first_attempt: bool = False
    symlink: dict[str, str] = Field(default_factory=dict)
    fail: str | None = None  # "error", "terminal"
    sleep: float = 0.0
    bad_result: bool = False
    bad_name: bool = False
    stamp_retry: bool = False  # content differs per attempt, like real non-deterministic output
    many: int = 0
    import_missing: bool = False  # the body needs a module that is not installed
    patient: float = 0.0  # then work this long in steps, noting progress, until cancelled


class WriteResult(BaseModel):
    written: int = Field(ge=0)
    retry_count: int


@task(
    f"pt_write_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="data/"),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
    body_retries=0,  # its tests are about Conductor's retries of a failed attempt
)
def write(workspace: Path, params: WriteParams) -> WriteResult:
    """Write, delete or link files as the params say; optionally fail."""
    attempt = info()
    deadline = time.monotonic() + params.sleep
    while time.monotonic() < deadline:  # Python-level work: interruptible at shutdown
        time.sleep(0.05)
    if params.import_missing:
        import perago_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    if params.fail == "error":
        raise RuntimeError("the body failed on purpose")
    if params.fail == "terminal":
        raise TaskError("the body refused on purpose", non_retryable=True)
    written = 0
    if not (params.only_on_first_attempt and attempt.retry_count > 0):
        for rel, text in params.files.items():
            path = workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written += 1
        for rel in params.delete:
            (workspace / rel).unlink()
    if params.stamp_retry:
        (workspace / "attempt.txt").write_text(f"written by retry {attempt.retry_count}")
        written += 1
    if params.bad_name:
        (workspace / os.fsdecode(b"latin1-\xe9t\xe9.txt")).write_text("not utf-8 named")
    if params.many:
        for i in range(params.many):
            sub = workspace / "many" / f"{i // 1000:03d}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"f{i:06d}.txt").write_text(str(i))
        written += params.many
    for rel, target in params.symlink.items():
        (workspace / rel).symlink_to(target)
    for tenth in range(int(params.patient * 10)):  # cooperative: stops once cancelled
        if tenth % 10 == 0:
            progress(f"{tenth // 10} of {params.patient:g} s")
        if wait_cancelled(0.1):
            break
    if params.bad_result:
        return WriteResult.model_construct(written=-1, retry_count=attempt.retry_count)
    return WriteResult(written=written, retry_count=attempt.retry_count)


class ReadParams(BaseModel):
    scribble: bool = False
    require: dict[str, str] = Field(default_factory=dict)  # an audit: these files, this text


class ReadResult(BaseModel):
    files: dict[str, str]


@task(
    f"pt_read_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="data/", read_only=True),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
def read(workspace: Path, params: ReadParams) -> ReadResult:
    """Return every file's text; `scribble` writes too, which a read-only task must discard."""
    files = {
        p.relative_to(workspace).as_posix(): p.read_text()
        for p in sorted(workspace.rglob("*"))
        if p.is_file()
    }
    if params.scribble:
        (workspace / "scribble.txt").write_text("discarded")
    wrong = {k: files.get(k) for k, v in params.require.items() if files.get(k) != v}
    if wrong:
        raise TaskError(f"audit failed: {wrong}", non_retryable=True)
    return ReadResult(files=files)


class PartParams(BaseModel):
    part: str
    rows: int = 3
    sleep: float = 0.0
    fail_first: bool = False  # the body's first run fails (retryable)
    typo: bool = False  # a NameError in the body (terminal: an error of the code)
    hold: str = ""  # a file: the body waits until the test creates it


class PartResult(BaseModel):
    part: str
    rows: int


@task(
    f"pt_part_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="parts/p={part}/"),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
def part(workspace: Path, params: PartParams) -> PartResult:
    """Write one partition (a templated prefix): a fan-out writer."""
    time.sleep(params.sleep)
    while params.hold and not Path(params.hold).exists():
        time.sleep(0.05)
    me = info()
    if params.fail_first and me.retry_count == 0 and me.body_try == 0:
        raise RuntimeError(f"partition {params.part} fails its first try on purpose")
    if params.typo:
        return PartResult(part=parms.part, rows=0)  # type: ignore[name-defined]  # noqa: F821
    (workspace / "rows.csv").write_text("".join(f"{params.part},{i}\n" for i in range(params.rows)))
    return PartResult(part=params.part, rows=params.rows)


#: The same writer leaving a failed body to Conductor's retries (no tries inside an attempt).
part_plain = task(
    f"pt_part_plain_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="parts/p={part}/"),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
    body_retries=0,
)(part.fn)


@task(
    f"pt_parts_all_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="parts/"),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
def parts_all(workspace: Path, params: PartParams) -> PartResult:
    """Rewrite every partition at once: overlaps every `pt_part` scope."""
    time.sleep(params.sleep)
    (workspace / "all.csv").write_text(params.part)
    return PartResult(part=params.part, rows=0)


class JoinResult(BaseModel):
    parts: list[str]
    rows: int


@task(
    f"pt_join_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="parts/", read_only=True),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
def join(workspace: Path, params: ReadParams) -> JoinResult:
    """Read every partition after a fan-out (the join step)."""
    files = sorted(workspace.glob("p=*/rows.csv"))
    rows = sum(len(f.read_text().splitlines()) for f in files)
    return JoinResult(parts=[f.parent.name.removeprefix("p=") for f in files], rows=rows)


class GateParams(BaseModel):
    sentinel: str


@task(
    f"pt_gate_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="parts/", read_only=True),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
def gate(workspace: Path, params: GateParams) -> PartResult:
    """Fail terminally the first time (no sentinel file yet): fails its whole sub-workflow."""
    sentinel = Path(params.sentinel)
    if not sentinel.exists():
        sentinel.write_text("failed once")
        raise TaskError("the gate fails its workflow once, on purpose", non_retryable=True)
    return PartResult(part="gate", rows=0)


@task(
    f"pt_heavy_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="heavy/", read_only=True),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
    concurrency=1,
)
def heavy(workspace: Path, params: PartParams) -> PartResult:
    """A task type one worker runs one at a time (`concurrency=1`), like a Spark job."""
    time.sleep(params.sleep)
    return PartResult(part=params.part, rows=0)


@task(
    f"pt_light_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="light/", read_only=True),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
def light(workspace: Path, params: PartParams) -> PartResult:
    """A light task type beside it."""
    time.sleep(params.sleep)
    return PartResult(part=params.part, rows=0)


class AsyncPartParams(BaseModel):
    part: str
    go: str  # a file the test creates once every body is waiting


@task(
    f"pt_async_part_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="parts/p={part}/"),
    retry_count=RETRIES,
    response_timeout=RESPONSE_TIMEOUT,
)
async def async_part(workspace: Path, params: AsyncPartParams) -> PartResult:
    """An `async def` fan-out writer: notes it is waiting, awaits the go file, writes."""
    progress("waiting for the go file")
    while not Path(params.go).exists():
        await asyncio.sleep(0.05)
    (workspace / "rows.csv").write_text(f"{params.part},0\n")
    return PartResult(part=params.part, rows=1)
