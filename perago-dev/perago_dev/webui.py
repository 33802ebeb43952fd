"""lakeFS's own web UI for the local stack: built with npm from the pinned module's lockfile.

The lakeFS module on the Go module proxy ships the UI's source (``webui/``, with its
``package-lock.json``) but not the built assets, so a plain ``go build`` serves "lakeFS UI
Not Built". lakeFS embeds ``webui/dist`` with ``go:embed``; this module makes a writable copy
of the pinned module, runs ``npm ci`` and ``npm run build`` in its ``webui/`` (lakeFS's own
build), and hands back a go.mod that replaces the module with that copy, so the lakefs binary
is built from exactly the pinned source plus its built UI.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from perago.errors import StackError
from perago_dev.paths import StackPaths

__all__ = ["LAKEFS_MODULE", "prepared_modfile"]

LAKEFS_MODULE = "github.com/treeverse/lakefs"


def _writable(path: Path) -> None:
    """The module cache is read-only; the copy must not be."""
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(root) / name
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | stat.S_IWUSR)
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


def _module_dir(go: str, version: str, *, cwd: Path, env: Mapping[str, str]) -> Path:
    done = subprocess.run(
        [go, "mod", "download", "-json", f"{LAKEFS_MODULE}@{version}"],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        found = json.loads(done.stdout)
    except json.JSONDecodeError:
        found = {}
    if done.returncode != 0 or not found.get("Dir"):
        raise StackError(
            f"cannot download {LAKEFS_MODULE}@{version} from the Go module proxy "
            f"({(found.get('Error') or done.stderr).strip()}); check GOPROXY and the network, "
            "then re-run `perago dev build`"
        )
    return Path(found["Dir"])


def prepared_modfile(
    paths: StackPaths,
    module: Path,
    version: str,
    *,
    go: str,
    env: Mapping[str, str],
    run: Callable[..., None],
) -> Path:
    """A go.mod for ``module`` (the lakefs wrapper) whose lakeFS has its UI built; cached."""
    npm = shutil.which("npm")
    if npm is None:
        raise StackError(
            "npm is required to build lakeFS's web UI but is not on PATH: install Node.js >= 18 "
            "with npm (e.g. `apt-get install nodejs npm`) and re-run `make install`, or build "
            "without the UI: `perago dev build --no-webui`"
        )
    work = paths.stack / "src"
    source = work / f"lakefs-{version}"
    webui = source / "webui"
    if not (webui / "dist" / "index.html").is_file():
        if source.exists():
            _writable(source)
            shutil.rmtree(source)
        shutil.copytree(_module_dir(go, version, cwd=module, env=env), source, symlinks=True)
        _writable(source)
        logs = paths.logs
        run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=webui,
            env=env,
            log=logs / "build-lakefs-webui-npm-ci.log",
        )
        run([npm, "run", "build"], cwd=webui, env=env, log=logs / "build-lakefs-webui.log")
        if not (webui / "dist" / "index.html").is_file():
            raise StackError(
                f"lakeFS's web UI build left no {webui}/dist/index.html; see "
                f"{logs / 'build-lakefs-webui.log'}"
            )
        shutil.rmtree(webui / "node_modules", ignore_errors=True)  # ~700 MB, not needed again
    build_dir = work / "lakefs-build"
    build_dir.mkdir(parents=True, exist_ok=True)
    modfile = build_dir / "go.mod"
    modfile.write_text(
        (module / "go.mod").read_text()
        + f"\n// Added by perago dev build: the pinned module with its web UI built.\n"
        f"replace {LAKEFS_MODULE} => {source}\n"
    )
    shutil.copyfile(module / "go.sum", build_dir / "go.sum")
    return modfile
