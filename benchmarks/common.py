"""What every benchmark needs: the stack to talk to, test trees and timed child processes."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LAKECTL_VAR",
    "MIB",
    "ROOT",
    "STACK_VARS",
    "BenchmarkError",
    "ChildRun",
    "Lakectl",
    "Stack",
    "Trash",
    "TreeSpec",
    "fanout_workflow",
    "percentile",
    "rel_path",
    "resolve_stack",
    "run_child",
    "scenario_command",
    "tree_stats",
    "write_tree",
]

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
STACK_VARS = (
    "CONDUCTOR_SERVER_URL",
    "LAKECTL_SERVER_ENDPOINT_URL",
    "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
    "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
)
#: Path of the lakectl binary when the stack comes from the environment.
LAKECTL_VAR = "PERAGO_BENCH_LAKECTL"
#: lakectl keeps its index in the synced directory; it is not data.
_LAKECTL_FILES = (".lakefs_ref.yaml",)


def fanout_workflow(name: str, *, timeout_seconds: int = 900) -> dict[str, Any]:
    """A workflow of one FORK_JOIN_DYNAMIC over ``${workflow.input.tasks}`` (with
    ``${workflow.input.inputs}``), then its JOIN."""
    dyn = {
        "name": "fan",
        "taskReferenceName": "fan",
        "type": "FORK_JOIN_DYNAMIC",
        "inputParameters": {
            "dynamicTasks": "${workflow.input.tasks}",
            "dynamicTasksInput": "${workflow.input.inputs}",
        },
        "dynamicForkTasksParam": "dynamicTasks",
        "dynamicForkTasksInputParamName": "dynamicTasksInput",
    }
    join = {"name": "fan_join", "taskReferenceName": "fan_join", "type": "JOIN"}
    return {
        "name": name,
        "version": 1,
        "schemaVersion": 2,
        "ownerEmail": "perago@example.com",
        "inputParameters": ["workspace"],
        "timeoutSeconds": timeout_seconds,
        "tasks": [dyn, join],
    }


class BenchmarkError(Exception):
    """A benchmark step failed; the message says which and why."""


@dataclass(frozen=True)
class Stack:
    env: dict[str, str]
    lakectl: Path
    source: str


def resolve_stack() -> Stack:
    """The stack named by the environment, else the local stack from ``perago_dev.stack.up()``.

    The environment wins only when it names all four endpoints/credentials and a lakectl
    binary (``PERAGO_BENCH_LAKECTL``, or ``lakectl`` on ``PATH``).
    """
    lakectl = os.environ.get(LAKECTL_VAR) or shutil.which("lakectl")
    if lakectl and all(os.environ.get(k) for k in STACK_VARS):
        if not os.access(lakectl, os.X_OK):
            raise BenchmarkError(f"{LAKECTL_VAR}={lakectl} is not an executable lakectl binary")
        return Stack({k: os.environ[k] for k in STACK_VARS}, Path(lakectl), "environment")
    from perago_dev.stack import up

    info = up()
    return Stack(dict(info.env()), Path(info.lakectl), "perago_dev.stack.up()")


# -- test trees -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeSpec:
    files: int
    size: int

    @property
    def total_bytes(self) -> int:
        return self.files * self.size

    def describe(self) -> str:
        size = f"{self.size // MIB} MiB" if self.size >= MIB else f"{self.size // 1024} KiB"
        return f"{self.files:,} x {size}"


def rel_path(i: int) -> str:
    """Path of file ``i``: 100 files per directory, like partitioned data."""
    return f"part-{i // 100:03d}/file-{i:05d}.bin"


def write_tree(root: Path, spec: TreeSpec, *, seed: int) -> None:
    """Incompressible, reproducible content: the same seed writes the same bytes."""
    rng = random.Random(seed)
    for i in range(spec.files):
        path = root / rel_path(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(spec.size))


def tree_stats(root: Path) -> tuple[int, int]:
    """(files, bytes) of the data under ``root``, lakectl's index file left out."""
    files = size = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name in _LAKECTL_FILES:
                continue
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


class Trash:
    """Where finished trees go until the run ends, instead of being deleted between steps.

    On ext4, creating files right after many were deleted is slow for a minute or more: each
    new inode skips every recently deleted one (``recently_deleted`` in ``find_inode_bit``;
    measured here with ``perf``: 16 us per file quiet, 750 us after a large delete). Deleting
    one side's output before the other side's step would charge that to the next step.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def discard(self, path: Path) -> None:
        """Move ``path`` out of the way (a rename: no inode is freed yet)."""
        path.rename(self.root / f"{path.name}-{uuid.uuid4().hex[:8]}")

    def empty(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def create_cost_us(self, files: int = 500) -> float:
        """Microseconds to create one empty file here now (the disk's state, see above)."""
        folder = self.root / f"probe-{uuid.uuid4().hex[:8]}"
        folder.mkdir()
        started = time.perf_counter()
        for i in range(files):
            os.close(os.open(folder / f"p{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return (time.perf_counter() - started) / files * 1e6


# -- child processes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildRun:
    seconds: float  # wall clock, process start to exit
    max_rss_kib: int  # the child's own peak resident set (Linux reports KiB)
    cpu_s: float  # user + system CPU time of the child
    stdout: str


# Linux carries the peak RSS of the process that forks across exec into the child's
# ru_maxrss, so a child of this (large) driver would report at least the driver's peak. The
# measured command is therefore started by a fresh, minimal interpreter (about 9 MiB), which
# reads the child's rusage with wait4 and writes "<seconds> <ru_maxrss KiB> <CPU seconds>" to
# argv[1].
_LAUNCHER = """\
import os, sys, time
report, cmd = sys.argv[1], sys.argv[2:]
started = time.perf_counter()
pid = os.posix_spawnp(cmd[0], cmd, os.environ)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - started
with open(report, "w") as f:
    f.write(f"{seconds} {usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_child(cmd: Sequence[str], *, env: dict[str, str], what: str) -> ChildRun:
    """Run ``cmd`` to completion from ``ROOT``; time and peak RSS are this child's alone."""
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r", suffix=".rusage") as report,
    ):
        done = subprocess.run(
            [sys.executable, "-S", "-c", _LAUNCHER, report.name, *cmd],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=err,
            check=False,
        )
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        if done.returncode != 0:
            tail = err.read().decode(errors="replace")[-2000:] or stdout[-2000:]
            raise BenchmarkError(f"{what} exited with {done.returncode}:\n{tail}")
        seconds, max_rss, cpu = report.read().split()
    return ChildRun(float(seconds), int(max_rss), float(cpu), stdout)


def scenario_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.scenario", *args]


class Lakectl:
    """``lakectl local`` configured only through the environment, with default parallelism."""

    def __init__(self, binary: Path, env: dict[str, str]) -> None:
        self._binary = str(binary)
        self._env = env

    def _run(self, *args: str) -> ChildRun:
        return run_child([self._binary, *args], env=self._env, what=f"lakectl {' '.join(args)}")

    def init(self, uri: str, directory: Path) -> ChildRun:
        return self._run("local", "init", uri, str(directory), "--gitignore=false")

    def commit(self, directory: Path, message: str) -> ChildRun:
        return self._run("local", "commit", str(directory), "-m", message, "--no-progress", "-y")

    def clone(self, uri: str, directory: Path) -> ChildRun:
        return self._run(
            "local", "clone", uri, str(directory), "--no-progress", "--gitignore=false"
        )


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) that a process and its live descendants have used so far,
    from ``/proc`` (Linux): PostgreSQL's work is done by its postmaster's children."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # after the command, which may hold spaces and parentheses
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
    children: dict[int, list[int]] = {}
    for child, stat in stats.items():
        children.setdefault(int(stat[1]), []).append(child)
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        fields = stats.get(current)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
            todo += children.get(current, [])
    return total / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def start_workers(
    module: str, logs: Sequence[Path], *, concurrency: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    """One ``perago worker MODULE --concurrency N`` process per log file, run from the
    checkout; stop them with :func:`stop_workers`."""
    logs[0].parent.mkdir(parents=True, exist_ok=True)
    workers = []
    for log in logs:
        with log.open("w") as out:
            workers.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "perago", "worker"),
                        *(module, "--concurrency", str(concurrency)),
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    return workers


def stop_workers(workers: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (a drain) to each, then wait for all."""
    for w in workers:
        w.terminate()
    for w in workers:
        w.wait(timeout=60)
