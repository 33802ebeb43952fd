"""A fresh, private directory per attempt; the worker removes it once the attempt is reported."""

from __future__ import annotations

import os
import re
import shutil
import stat
import uuid
from pathlib import Path

import structlog

__all__ = ["AttemptDirectory"]

log = structlog.get_logger("perago.workspace")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _force_remove(func: object, path: str, _exc: object) -> None:
    # A task may leave read-only files or directories behind; make them writable and retry.
    try:
        parent = os.path.dirname(path)
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IRWXU)
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


class AttemptDirectory:
    """``<work_dir>/<task_id>-<random>/`` holding ``workspace/`` and the manifest (outside it)."""

    def __init__(self, work_dir: Path, task_id: str) -> None:
        work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"{_UNSAFE.sub('_', task_id)[:64]}-{uuid.uuid4().hex[:8]}"
        self.root = work_dir / name
        self.root.mkdir(mode=0o700)
        self.workspace = self.root / "workspace"
        self.workspace.mkdir(mode=0o700)
        self.manifest_path = self.root / "manifest.json"

    def empty_workspace(self) -> None:
        """Remove what a failed try left in ``workspace/``, for the next try to start fresh."""
        shutil.rmtree(self.workspace, onerror=_force_remove)
        self.workspace.mkdir(mode=0o700)

    def remove(self) -> None:
        try:
            shutil.rmtree(self.root, onerror=_force_remove)
        except OSError as e:
            log.warning("workspace_cleanup_failed", path=str(self.root), error=str(e))
