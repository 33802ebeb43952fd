"""Where the local stack lives: binaries, jars, data, pids and logs under one git-ignored folder.

::

    .stack/bin/{lakefs,lakectl,helm}     built from deploy/local/{lakefs,lakectl,helm}
    .stack/conductor/*.jar               fetched with deploy/local/conductor/pom.xml
    .stack/data/{lakefs,conductor}       server state (``perago dev down --wipe`` deletes it)
    .stack/run/{lakefs,conductor}.pid    the processes ``up`` started, plus lakefs.yaml
    .stack/logs/*.log                    server and build output
    .stack/credentials.json              lakeFS keys, generated once (mode 0600)
    .stack/ports.json                    the ports the stack runs on
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from perago.errors import StackError

__all__ = ["SERVICES", "StackPaths", "find_project_root", "stack_paths"]

#: Start order; ``down`` stops in reverse.
SERVICES = ("lakefs", "conductor")

_NO_CHECKOUT = (
    "perago dev needs a Perago source checkout (deploy/local not found); "
    "set PERAGO_STACK_DIR and run from the checkout"
)


def _is_root(path: Path) -> bool:
    return (path / "deploy" / "local").is_dir()


def find_project_root(candidates: Iterable[Path] | None = None) -> Path | None:
    """The checkout holding ``deploy/local``: the editable install's folder, else cwd upwards."""
    if candidates is None:
        cwd = Path.cwd().resolve()
        candidates = [Path(__file__).resolve().parents[2], cwd, *cwd.parents]
    return next((c for c in candidates if _is_root(c)), None)


@dataclass(frozen=True)
class StackPaths:
    """The stack folder's layout; ``root`` is the checkout (None if only the stack is known)."""

    root: Path | None
    stack: Path

    @property
    def deploy(self) -> Path:
        """``deploy/local``: only building needs the checkout."""
        if self.root is None:
            raise StackError(_NO_CHECKOUT)
        return self.root / "deploy" / "local"

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

    @property
    def ports(self) -> Path:
        return self.stack / "ports.json"

    @property
    def lakefs_config(self) -> Path:
        return self.run / "lakefs.yaml"

    def pid_file(self, service: str) -> Path:
        return self.run / f"{service}.pid"

    def log_file(self, service: str) -> Path:
        return self.logs / f"{service}.log"

    def make(self) -> None:
        for d in (self.bin, self.conductor_jars, self.data, self.run, self.logs):
            d.mkdir(parents=True, exist_ok=True)


def stack_paths(env: Mapping[str, str] | None = None) -> StackPaths:
    """The stack folder: ``PERAGO_STACK_DIR``, else ``<checkout>/.stack``."""
    env = os.environ if env is None else env
    root = find_project_root()
    override = env.get("PERAGO_STACK_DIR")
    if override:
        return StackPaths(root=root, stack=Path(override).expanduser().resolve())
    if root is None:
        raise StackError(_NO_CHECKOUT)
    return StackPaths(root=root, stack=root / ".stack")
