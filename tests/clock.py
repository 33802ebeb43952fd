"""Waiting for a filesystem's clock, for tests of what the kernel's ctime proves."""

from __future__ import annotations

import os
import time
from pathlib import Path

from perago.workspace.manifest import filesystem_now


def tick_past(root: Path) -> None:
    """Return once the filesystem under ``root`` stamps a newer ctime than any file there has.

    The content cache never adopts a file changed in the clock tick its upload started in
    (racy-git's rule); a test that writes files and uploads them at once waits here first.
    """
    newest = max(
        (os.stat(os.path.join(d, f)).st_ctime_ns for d, _, fs in os.walk(root) for f in fs),
        default=0,
    )
    while filesystem_now(root) <= newest:
        time.sleep(0.001)
