"""Build lakeFS and lakectl from the Go module proxy and fetch Conductor from Maven Central.

Each artifact is cached in the stack folder with a stamp of the inputs that pinned it, so a
rebuild happens only when a pin changes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perago.dev.paths import StackPaths, stack_paths
from perago.errors import StackError

__all__ = ["build", "conductor_jar", "find_java"]

#: Modules the Go checksum database does not know; their hashes are pinned in the committed
#: go.sum files and match lakeFS's own go.sum at the pinned tag.
GONOSUMDB = "github.com/treeverse/delta-go,github.com/treeverse/secret-detector"


def _stamp(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise StackError(f"`{tool}` was not found on PATH: {hint}, then re-run `make install`")
    return path


@contextmanager
def _step(message: str, progress: bool) -> Iterator[None]:
    started = time.monotonic()
    if progress and sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status(message + "..."):
            yield
    else:
        print(message + "...", file=sys.stderr, flush=True)
        yield
    print(f"{message}: done in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise StackError(
            f"command failed (exit {done.returncode}) in {cwd}: {' '.join(cmd)}\n{tail}\n"
            f"(full log: {log})"
        )


def _lakefs_version(module_dir: Path) -> str:
    m = re.search(r"github\.com/treeverse/lakefs (v\S+)", (module_dir / "go.mod").read_text())
    if not m:
        raise StackError(f"{module_dir}/go.mod does not require github.com/treeverse/lakefs")
    return m.group(1)


def _build_go_binary(paths: StackPaths, name: str, progress: bool) -> None:
    module = paths.root / "deploy" / "local" / name
    binary = paths.bin / name
    stamp_file = paths.bin / f".{name}.stamp"
    stamp = _stamp(module / "go.mod", module / "go.sum", module / "main.go")
    if binary.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return
    go = _require("go", "install Go >= 1.26.4 (it builds lakeFS from the Go module proxy)")
    version = _lakefs_version(module)
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GONOSUMDB": GONOSUMDB,
        "GOFLAGS": "-mod=mod",
    }
    cmd = [
        go,
        "build",
        "-o",
        str(binary),
        "-ldflags",
        f"-X github.com/treeverse/lakefs/pkg/version.Version={version}",
        ".",
    ]
    with _step(f"building {name} {version} from the Go module proxy", progress):
        _run(cmd, cwd=module, env=env, log=paths.logs / f"build-{name}.log")
    stamp_file.write_text(stamp)


def conductor_jar(paths: StackPaths) -> Path | None:
    jars = sorted(paths.conductor_jars.glob("conductor-server-*-boot.jar"))
    return jars[-1] if jars else None


def _fetch_conductor(paths: StackPaths, progress: bool) -> None:
    pom = paths.root / "deploy" / "local" / "conductor" / "pom.xml"
    stamp_file = paths.conductor_jars / ".stamp"
    stamp = _stamp(pom)
    if conductor_jar(paths) and stamp_file.exists() and stamp_file.read_text() == stamp:
        return
    mvn = _require("mvn", "install Maven (it fetches the Conductor server from Maven Central)")
    for old in paths.conductor_jars.glob("*.jar"):
        old.unlink()
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={paths.conductor_jars}",
    ]
    with _step("fetching the Conductor server from Maven Central", progress):
        _run(cmd, cwd=pom.parent, env=dict(os.environ), log=paths.logs / "build-conductor.log")
    if conductor_jar(paths) is None:
        raise StackError(f"Maven ran but no conductor-server boot jar is in {paths.conductor_jars}")
    stamp_file.write_text(stamp)


def _java_version(java_home: Path) -> int | None:
    release = java_home / "release"
    if not release.is_file() or not (java_home / "bin" / "java").exists():
        return None
    m = re.search(r'JAVA_VERSION="(\d+)', release.read_text(errors="replace"))
    return int(m.group(1)) if m else None


def find_java(minimum: int = 21, env: dict[str, str] | None = None) -> Path:
    """The newest installed JDK >= ``minimum`` (PERAGO_CONDUCTOR_JAVA overrides)."""
    env = dict(os.environ) if env is None else env
    override = env.get("PERAGO_CONDUCTOR_JAVA")
    if override:
        return Path(override)
    homes: list[Path] = []
    if env.get("JAVA_HOME"):
        home = Path(env["JAVA_HOME"])
        version = _java_version(home)
        if version is not None and version >= minimum:
            return home / "bin" / "java"  # the user's explicit choice wins when it fits
        homes.append(home)
    for base in ("/usr/lib/jvm", "/usr/java", "/opt/java", "/Library/Java/JavaVirtualMachines"):
        if Path(base).is_dir():
            for d in sorted(Path(base).iterdir()):
                homes.extend([d, d / "Contents" / "Home"])
    found = [(v, h) for h in homes if (v := _java_version(h)) is not None and v >= minimum]
    if not found:
        raise StackError(
            f"Conductor needs a JDK >= {minimum} and none was found (looked at JAVA_HOME and "
            "/usr/lib/jvm); install one (e.g. `apt-get install openjdk-21-jdk-headless`) or "
            "point PERAGO_CONDUCTOR_JAVA at its bin/java"
        )
    return max(found)[1] / "bin" / "java"


def build(*, progress: bool = True) -> StackPaths:
    """Make every stack binary present and current; idempotent and cheap when nothing changed."""
    paths = stack_paths()
    paths.make()
    _build_go_binary(paths, "lakefs", progress)
    _build_go_binary(paths, "lakectl", progress)
    _fetch_conductor(paths, progress)
    find_java()
    return paths
