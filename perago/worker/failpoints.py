"""Named step boundaries where crash tests kill, pause or fail a worker on purpose.

Enabled by ``PERAGO_FAILPOINTS="after_publish=kill,after_stage=pause:30,after_body=error"``,
read once when the worker starts; ``after_publish=kill@4`` acts on the process's fourth
arrival there (the earlier ones pass), to strike while several attempts are in flight.
``stop`` sends the worker SIGSTOP, freezing every thread (Conductor lease extension
included) until the test sends SIGCONT. ``pause:SECONDS`` ends early once the file named
by ``PERAGO_FAILPOINTS_RELEASE`` exists (a test releases it when it has seen enough). When
unset, :func:`hit` is a dict lookup on an empty dict.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping

import structlog

from perago.errors import ConfigError, FailpointError
from perago.telemetry.steps import Attempt, Boundary, observe

__all__ = ["POINTS", "FailpointError", "configure", "hit"]

#: The step boundaries (``perago.telemetry.steps.Boundary``), in the order an attempt passes them.
POINTS = tuple(b.value for b in Boundary)

log = structlog.get_logger("perago.failpoints")
_active: dict[str, str] = {}
#: Arrivals at each failpoint with an ``@N`` count, in this process.
_arrivals: dict[str, int] = {}
_arrivals_lock = threading.Lock()


def parse(spec: str) -> dict[str, str]:
    actions: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        if nth and (not nth.isdigit() or int(nth) < 1):
            raise ConfigError(f"failpoint {name}: @{nth} must be a count of arrivals >= 1")
        if name not in POINTS:
            raise ConfigError(f"unknown failpoint {name!r} in PERAGO_FAILPOINTS; known: {POINTS}")
        if action not in ("kill", "stop", "error") and not action.startswith("pause:"):
            raise ConfigError(
                f"failpoint {name}: action {action!r} must be kill, stop, error or pause:SECONDS"
            )
        if action.startswith("pause:"):
            try:
                float(action.removeprefix("pause:"))
            except ValueError:
                raise ConfigError(
                    f"failpoint {name}: {action!r} needs a number of seconds"
                ) from None
        actions[name] = f"{action}@{nth}" if nth else action
    return actions


def configure(env: Mapping[str, str] | None = None) -> None:
    """(Re)read ``PERAGO_FAILPOINTS``; called by the worker at start-up."""
    source = os.environ if env is None else env
    _active.clear()
    _arrivals.clear()
    _active.update(parse(source.get("PERAGO_FAILPOINTS", "")))
    if _active:
        log.warning("failpoints_enabled", failpoints=dict(_active))


def hit(name: str) -> None:
    action = _active.get(name)
    if action is None:
        return
    action, _, nth = action.partition("@")
    if nth:
        with _arrivals_lock:
            _arrivals[name] = _arrivals.get(name, 0) + 1
            if _arrivals[name] != int(nth):
                return
    log.warning("failpoint_hit", failpoint=name, action=action)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        # Directed at this thread: a process-directed SIGSTOP lets the sender run on a while.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    elif action == "error":
        raise FailpointError(f"failpoint {name} raised an error on purpose (PERAGO_FAILPOINTS)")
    else:
        deadline = time.monotonic() + float(action.removeprefix("pause:"))
        release = os.environ.get("PERAGO_FAILPOINTS_RELEASE", "")
        while time.monotonic() < deadline and not (release and os.path.exists(release)):
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _on_boundary(boundary: Boundary, _attempt: Attempt) -> None:
    hit(boundary.value)  # looked up at call time: tests may stand in for ``hit``


observe(_on_boundary)
