"""Where the local stack lives: binaries, jars, data, pids and logs under one git-ignored folder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from perago.errors import StackError

__all__ = ["StackPaths", "project_root", "stack_paths"]


def project_root() -> Path:
    """The Perago checkout: the folder holding ``deploy/local`` (editable install or cwd)."""
    candidates = [Path(__file__).resolve().parents[2], *Path.cwd().resolve().parents]
    candidates.insert(1, Path.cwd().resolve())
    for c in candidates:
        if (c / "deploy" / "local" / "lakefs" / "go.mod").is_file():
            return c
    raise StackError(
        "perago dev needs a Perago source checkout (deploy/local not found); run it from the "
        "checkout, or set PERAGO_STACK_DIR and run from the checkout"
    )


@dataclass(frozen=True)
class StackPaths:
    root: Path  # the checkout
    stack: Path  # .stack

    @property
    def bin(self) -> Path:
        return self.stack / "bin"

    @property
    def conductor_jars(self) -> Path:
        return self.stack / "conductor"

    @property
    def data(self) -> Path:
        return self.stack / "data"

    @property
    def run(self) -> Path:
        return self.stack / "run"

    @property
    def logs(self) -> Path:
        return self.stack / "logs"

    @property
    def credentials(self) -> Path:
        return self.stack / "credentials.json"

    def pid_file(self, service: str) -> Path:
        return self.run / f"{service}.pid"

    def log_file(self, service: str) -> Path:
        return self.logs / f"{service}.log"

    def make(self) -> None:
        for d in (self.bin, self.conductor_jars, self.data, self.run, self.logs):
            d.mkdir(parents=True, exist_ok=True)


def stack_paths() -> StackPaths:
    root = project_root()
    override = os.environ.get("PERAGO_STACK_DIR")
    return StackPaths(root=root, stack=Path(override).resolve() if override else root / ".stack")
