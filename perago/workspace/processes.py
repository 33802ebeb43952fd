"""Whether a process recorded on disk is still the same process (pids are reused).

A worker restarted in a container is PID 1 again, and a work directory on a volume outlives
it: a pid alone would name the dead process's files as the living one's. The kernel's start
time of the process, recorded beside its pid, tells the two apart.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["is_running", "process_start"]


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux ``/proc``), None if not running; "" where
    the platform cannot say (then a live pid counts as the same process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, someone else's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # Field 22 (starttime), counted after the command name, which may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def is_running(pid: int, started: str) -> bool:
    """True if ``pid`` still runs as the process that started at ``started`` ("" unknown)."""
    now = process_start(pid)
    return now is not None and (not started or not now or now == started)
