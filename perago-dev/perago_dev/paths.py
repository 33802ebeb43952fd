"""Where the local stack lives: binaries, jars, data, pids and logs under one folder.

The build recipes ship inside this package (``perago_dev/recipes/``: the Go wrapper modules
of lakeFS, lakectl, Helm and Toxiproxy, the Maven poms of Conductor and DynamoDB Local), so a
pip-installed perago-dev builds and runs the stack as a checkout does. The stack folder is
``PERAGO_STACK_DIR``; else ``<checkout>/.stack`` in a source checkout (git-ignored), else a
per-user cache folder (``$XDG_CACHE_HOME/perago/stack``, ``~/.cache/perago/stack``)::

    .stack/bin/{lakefs,lakectl,helm}     built from recipes/{lakefs,lakectl,helm}
    .stack/conductor/*.jar               fetched with recipes/conductor/pom.xml
    .stack/data/{lakefs,conductor}       server state (``perago dev down --wipe`` deletes it)
    .stack/data/production/*             the production profile's (PostgreSQL's: see production)
    .stack/run/{lakefs,conductor}.pid    the processes ``up`` started, plus lakefs.yaml
    .stack/logs/*.log                    server and build output
    .stack/credentials.json              lakeFS keys, generated once (mode 0600)
    .stack/ports.json                    the ports the stack runs on
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "RECIPES",
    "SERVICES",
    "StackPaths",
    "exclusive",
    "find_project_root",
    "stack_paths",
    "user_stack_dir",
]

#: Every service of either profile, in start order; ``down`` stops in reverse.
SERVICES = ("postgres", "s3", "lakefs", "conductor")

#: The build recipes, shipped as package data.
RECIPES = Path(__file__).resolve().parent / "recipes"


def _is_root(path: Path) -> bool:
    """A Perago source checkout: its package and its project file side by side."""
    return (path / "perago-dev" / "perago_dev" / "recipes").is_dir() and (
        path / "pyproject.toml"
    ).is_file()


def find_project_root(candidates: Iterable[Path] | None = None) -> Path | None:
    """The source checkout: the editable install's folder, else the current folder or above;
    None for an installed package used from one's own project."""
    if candidates is None:
        cwd = Path.cwd().resolve()
        candidates = [Path(__file__).resolve().parents[2], cwd, *cwd.parents]
    return next((c for c in candidates if _is_root(c)), None)


def user_stack_dir(env: Mapping[str, str]) -> Path:
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(cache).expanduser() / "perago" / "stack"


@dataclass(frozen=True)
class StackPaths:
    """The stack folder's layout; ``root`` is the checkout (None if only the stack is known)."""

    root: Path | None
    stack: Path

    @property
    def deploy(self) -> Path:
        """The build recipes (package data)."""
        return RECIPES

    @property
    def bin(self) -> Path:
        return self.stack / "bin"

    @property
    def conductor_jars(self) -> Path:
        return self.stack / "conductor"

    @property
    def spark_jars(self) -> Path:
        """The S3A connector's jars for in-place Spark tasks (``PERAGO_SPARK_JARS_DIR``)."""
        return self.stack / "spark-jars"

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
    def profile_file(self) -> Path:
        """The profile of the last ``up``: ``embedded`` or ``production``."""
        return self.run / "profile"

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
    """The stack folder: ``PERAGO_STACK_DIR``, else ``<checkout>/.stack``, else the user's
    cache folder (an installed package used from another project)."""
    env = os.environ if env is None else env
    root = find_project_root()
    override = env.get("PERAGO_STACK_DIR")
    if override:
        return StackPaths(root=root, stack=Path(override).expanduser().resolve())
    if root is None:
        return StackPaths(root=None, stack=user_stack_dir(env))
    return StackPaths(root=root, stack=root / ".stack")


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """One holder at a time of ``lock_file`` across processes: two terminals, or test
    processes side by side, each wait while another starts, stops or builds."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
