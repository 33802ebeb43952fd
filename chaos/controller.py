"""Worker processes and the faults done to them and to the servers, on a seeded schedule."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

__all__ = ["Fault", "Workers", "fault_schedule"]

log = structlog.get_logger("chaos")
ROOT = Path(__file__).resolve().parents[1]

#: action -> weight; server restarts are rarer (a Conductor restart takes ~45 s here)
ACTIONS = {
    "kill_worker": 4,
    "pause_worker": 4,
    "restart_lakefs": 1,
    "restart_conductor": 0.6,
    "foreign_commit": 1,
    "proxy_fault": 3,
}


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start
    action: str
    target: int  # a worker slot, a proxy, or a run index (foreign commit)
    seconds: float  # pause length, fault duration
    detail: str = ""  # the toxic, for proxy faults


def fault_schedule(
    rng: random.Random, *, duration: float, workers: int, mean_gap: float, proxies: bool
) -> list[Fault]:
    """Every fault of the run, drawn from the seed alone (so a seed names one schedule)."""
    actions = [a for a in ACTIONS if proxies or a != "proxy_fault"]
    faults: list[Fault] = []
    t = rng.uniform(5, mean_gap)
    while t < duration:
        action = rng.choices(actions, weights=[ACTIONS[a] for a in actions])[0]
        toxic = rng.choice(["latency", "bandwidth", "reset_peer", "timeout", "slow_close"])
        faults.append(
            Fault(
                at=round(t, 2),
                action=action,
                target=rng.randrange(10_000),
                seconds=round(rng.uniform(2, 25), 1),
                detail=toxic if action == "proxy_fault" else "",
            )
        )
        t += rng.expovariate(1 / mean_gap)
    return faults


class Workers:
    """``n`` `perago worker chaos.tasks` processes, restartable by slot."""

    def __init__(self, n: int, *, concurrency: int, env: dict[str, str], logs: Path) -> None:
        self._n, self._concurrency, self._env, self._logs = n, concurrency, env, logs
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self._generation = Counter[int]()
        self._lock = threading.Lock()
        self.paused: set[int] = set()

    def start_all(self) -> None:
        for slot in range(self._n):
            self.start(slot)

    def start(self, slot: int) -> None:
        with self._lock:
            self._generation[slot] += 1
            gen = self._generation[slot]
            out = (self._logs / f"worker-{slot}.log").open("ab")
            self._procs[slot] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "perago",
                    "worker",
                    "chaos.tasks",
                    "--concurrency",
                    str(self._concurrency),
                ],
                cwd=ROOT,
                env={
                    **os.environ,
                    **self._env,
                    "PERAGO_WORKER_ID": f"chaos-{slot}-{gen}",
                    "PERAGO_WORK_DIR": str(self._logs / f"work-{slot}"),
                },
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            out.close()

    def pid(self, slot: int) -> int | None:
        p = self._procs[slot]
        return p.pid if p is not None and p.poll() is None else None

    def kill(self, slot: int) -> None:
        pid = self.pid(slot)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            self._procs[slot].wait()  # type: ignore[union-attr]
        self.paused.discard(slot)

    def pause(self, slot: int, seconds: float, wait: Callable[[float], object]) -> None:
        pid = self.pid(slot)
        if pid is None or slot in self.paused:
            return
        self.paused.add(slot)
        os.kill(pid, signal.SIGSTOP)
        wait(seconds)
        self.resume(slot)

    def resume(self, slot: int) -> None:
        pid = self.pid(slot)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        self.paused.discard(slot)

    def ensure_running(self) -> None:
        for slot in range(self._n):
            self.resume(slot)
            if self.pid(slot) is None:
                self.start(slot)

    def stop_all(self, *, timeout: float = 60) -> None:
        for slot in range(self._n):
            self.resume(slot)
            pid = self.pid(slot)
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self._procs:
            if p is None:
                continue
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
