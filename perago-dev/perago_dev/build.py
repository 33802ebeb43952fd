"""Build lakeFS and lakectl from the Go module proxy and fetch Conductor from Maven Central.

Each artifact is cached in the stack folder next to a stamp of the files that pin it, so a
rebuild happens only when a pin changes. Conductor 3.32 needs a JDK >= 21, which may not be
the default ``java`` (Spark wants 17), so the newest suitable JDK installed is looked up.

Helm (to render and lint the worker chart) is built the same way but only on request
(:func:`build_helm`, ``perago dev build --helm``): the stack does not need it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from perago.errors import StackError
from perago_dev.paths import StackPaths, exclusive, stack_paths

__all__ = [
    "JDK_SEARCH_DIRS",
    "build",
    "build_helm",
    "build_toxiproxy",
    "build_versitygw",
    "conductor_jar",
    "find_java",
    "java_version",
    "parse_java_version",
    "step",
]

#: Modules the Go checksum database does not know; their hashes are pinned in the committed
#: go.sum files and match lakeFS's own go.sum at the pinned tag.
GONOSUMDB = "github.com/treeverse/delta-go,github.com/treeverse/secret-detector"

#: Where JDKs are installed by Debian/Ubuntu, RPM distributions, tarballs and macOS.
JDK_SEARCH_DIRS = (
    "/usr/lib/jvm",
    "/usr/java",
    "/opt/java",
    "/opt/jdk",
    "/Library/Java/JavaVirtualMachines",
    "~/Library/Java/JavaVirtualMachines",
    "~/.sdkman/candidates/java",
)

CONDUCTOR_MIN_JAVA = 21
_TAIL_LINES = 20


# -- progress ----------------------------------------------------------------------------


@contextmanager
def step(message: str, *, progress: bool) -> Iterator[None]:
    """Show one step: a rich spinner with elapsed time on a terminal, plain lines otherwise."""
    if not progress:
        yield
        return
    started = time.monotonic()
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            bar.add_task(message, total=None)
            yield
        console.print(
            f"[green]✓[/green] {message} ({time.monotonic() - started:.1f}s)", highlight=False
        )
    else:
        print(f"{message} ...", file=sys.stderr, flush=True)
        yield
        print(f"{message}: done in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)


# -- tools ---------------------------------------------------------------------------------


def _stamp(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _fresh(artifact: Path | None, stamp_file: Path, stamp: str) -> bool:
    return (
        artifact is not None
        and artifact.exists()
        and stamp_file.is_file()
        and stamp_file.read_text().strip() == stamp
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _require_go(module: Path, what: str = "lakeFS", rerun: str = "make install") -> str:
    wanted_match = re.search(r"^go (\S+)", (module / "go.mod").read_text(), re.MULTILINE)
    wanted = wanted_match.group(1) if wanted_match else "1.26"
    go = shutil.which("go")
    if go is None:
        raise StackError(
            f"Go >= {wanted} is required to build {what} but `go` is not on PATH: install it "
            f"(https://go.dev/doc/install) and re-run `{rerun}`"
        )
    found = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if found and _version_tuple(found) < _version_tuple(wanted):
        raise StackError(
            f"Go >= {wanted} is required to build {what} but {go} is {found}: install a newer "
            f"Go (https://go.dev/doc/install) and re-run `{rerun}`"
        )
    return go


def _require_mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            "Maven is required to fetch the Conductor server but `mvn` is not on PATH: install "
            "it (e.g. `apt-get install maven`, `brew install maven`) and re-run `make install`"
        )
    return mvn


def _run(cmd: list[str], *, cwd: Path, env: Mapping[str, str], log: Path) -> None:
    """Run a build command with its output in ``log``; fail quoting the command and the tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write(f"$ (cd {shlex.quote(str(cwd))} && {shlex.join(cmd)})\n")
        out.flush()
        done = subprocess.run(
            cmd, cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[1:][-_TAIL_LINES:])
        raise StackError(
            f"build step failed (exit {done.returncode}): (cd {shlex.quote(str(cwd))} && "
            f"{shlex.join(cmd)})\n{tail}\nfull log: {log}; fix the cause and re-run "
            "`perago dev build`"
        )


# -- Go binaries: lakeFS, lakectl, helm --------------------------------------------------------


def _required_version(module: Path, path: str) -> str:
    m = re.search(
        rf"^\s*(?:require\s+)?{re.escape(path)} (v\S+)",
        (module / "go.mod").read_text(),
        re.MULTILINE,
    )
    if m is None:
        raise StackError(f"{module}/go.mod does not require {path}")
    return m.group(1)


def _lakefs_ldflags(module: Path) -> tuple[str, str]:
    version = _required_version(module, "github.com/treeverse/lakefs")
    return version, f"-X github.com/treeverse/lakefs/pkg/version.Version={version}"


def _helm_ldflags(module: Path) -> tuple[str, str]:
    """What Helm's own Makefile stamps in: its version, and the Kubernetes version it assumes
    (``.Capabilities.KubeVersion``, lint's deprecation checks) from the client-go it uses."""
    version = _required_version(module, "helm.sh/helm/v3")
    client_go = _version_tuple(_required_version(module, "k8s.io/client-go"))
    major, minor = client_go[0] + 1, client_go[1]
    flags = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={version}"]
    for pkg in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
        flags += [f"-X {pkg}.k8sVersionMajor={major}", f"-X {pkg}.k8sVersionMinor={minor}"]
    return version, " ".join(flags)


def _toxiproxy_ldflags(module: Path) -> tuple[str, str]:
    version = _required_version(module, "github.com/Shopify/toxiproxy/v2")
    return version, f"-s -w -X github.com/Shopify/toxiproxy/v2.Version={version}"


def _versitygw_ldflags(module: Path) -> tuple[str, str]:
    version = _required_version(module, "github.com/versity/versitygw")
    return version, f"-s -w -X main.Version={version}"


def _kubernetes_ldflags(module: Path) -> tuple[str, str]:
    """What Kubernetes' own build stamps in (hack/lib/version.sh): the version the API server
    reports at /version, which Helm's ``kubeVersion`` check and kubectl's skew rules read."""
    version = _required_version(module, "k8s.io/kubernetes")
    major, minor = _version_tuple(version)[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return version, " ".join(flags)


def _etcd_ldflags(module: Path) -> tuple[str, str]:
    version = _required_version(module, "go.etcd.io/etcd/server/v3")
    return version, f"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA={version}"


def _kwok_ldflags(module: Path) -> tuple[str, str]:
    version = _required_version(module, "sigs.k8s.io/kwok")
    # kwokctl spells its own version without the "v"
    return version, f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={version.removeprefix('v')}"


#: name -> (its wrapper module under recipes/, the package to build there, what to stamp)
_GO_BINARIES: dict[str, tuple[str, str, Callable[[Path], tuple[str, str]]]] = {
    "lakefs": ("lakefs", ".", _lakefs_ldflags),
    "lakectl": ("lakectl", ".", _lakefs_ldflags),
    # Helm 3's command is a main package (not importable): the wrapper names it as a tool.
    "helm": ("helm", "helm.sh/helm/v3/cmd/helm", _helm_ldflags),
    # The fault-injecting proxy of the chaos tests and `make chaos` (not part of the stack).
    "toxiproxy": ("toxiproxy", "github.com/Shopify/toxiproxy/v2/cmd/server", _toxiproxy_ldflags),
    # The S3 server under the production profile's lakeFS (`perago dev up --profile production`).
    "versitygw": ("versitygw", "github.com/versity/versitygw/cmd/versitygw", _versitygw_ldflags),
    # A Kubernetes control plane without a container runtime, for `make test-k8s`: etcd, the
    # API server, controller manager and scheduler, kubectl of the same version, and KWOK
    # (kwokctl starts them as processes; the kwok controller simulates nodes and pods).
    "etcd": ("etcd", ".", _etcd_ldflags),
    "kube-apiserver": ("k8s", "k8s.io/kubernetes/cmd/kube-apiserver", _kubernetes_ldflags),
    "kube-controller-manager": (
        "k8s",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        _kubernetes_ldflags,
    ),
    "kube-scheduler": ("k8s", "k8s.io/kubernetes/cmd/kube-scheduler", _kubernetes_ldflags),
    "kubectl": ("k8s", "k8s.io/kubernetes/cmd/kubectl", _kubernetes_ldflags),
    "kwok": ("kwok", "sigs.k8s.io/kwok/cmd/kwok", _kwok_ldflags),
    "kwokctl": ("kwok", "sigs.k8s.io/kwok/cmd/kwokctl", _kwok_ldflags),
}

#: The binaries of the control plane `make test-k8s` runs (see perago_dev.kube).
CONTROL_PLANE = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
)


def _build_go_binary(paths: StackPaths, name: str, *, progress: bool, webui: bool = False) -> Path:
    """Build ``name`` from its wrapper module; ``webui`` (lakefs only) embeds lakeFS's web
    UI built with npm (:mod:`perago_dev.webui`)."""
    recipe, package, ldflags = _GO_BINARIES[name]
    module = paths.deploy / recipe
    binary = paths.bin / name
    stamp_file = paths.bin / f".{name}.stamp"
    pins = [module / f for f in ("go.mod", "go.sum", "main.go") if (module / f).is_file()]
    stamp = _stamp(*pins) + (":webui" if webui else "")
    if _fresh(binary, stamp_file, stamp):
        return binary
    how = {
        "helm": "perago dev build --helm",
        "toxiproxy": "make chaos",
        "versitygw": "perago dev build --profile production",
        **{binary: "make test-k8s" for binary in CONTROL_PLANE},
    }.get(name, "make install")
    go = _require_go(module, name, how)
    version, flags = ldflags(module)
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GONOSUMDB": GONOSUMDB,
        "GOFLAGS": "-mod=mod",
    }
    # Built beside the target and renamed: a running lakefs keeps its (old) file.
    partial = paths.bin / f".{name}.partial"
    cmd = [go, "build", "-o", str(partial), "-ldflags", flags, package]
    if webui:
        from perago_dev.webui import prepared_modfile

        with step(f"building lakeFS's web UI {version} (npm)", progress=progress):
            modfile = prepared_modfile(paths, module, version, go=go, env=env, run=_run)
        cmd.insert(2, f"-modfile={modfile}")
    with step(f"building {name} {version} (Go module proxy)", progress=progress):
        _run(cmd, cwd=module, env=env, log=paths.logs / f"build-{name}.log")
    os.replace(partial, binary)
    stamp_file.write_text(stamp)
    return binary


# -- Conductor ----------------------------------------------------------------------------------


def conductor_jar(paths: StackPaths) -> Path | None:
    """The fetched Conductor boot jar, if any."""
    jars = sorted(paths.conductor_jars.glob("conductor-server-*-boot.jar"))
    return jars[-1] if jars else None


def _maven_copy(pom: Path, incoming: Path, *options: str) -> list[str]:
    """The Maven command that copies ``pom``'s dependencies into a fresh ``incoming``."""
    shutil.rmtree(incoming, ignore_errors=True)
    return [
        _require_mvn(),
        "-q",
        "-B",
        "-f",
        str(pom),
        *options,
        "dependency:copy-dependencies",
        f"-DoutputDirectory={incoming}",
    ]


def _fetch_conductor(paths: StackPaths, *, progress: bool) -> None:
    pom = paths.deploy / "conductor" / "pom.xml"
    stamp_file = paths.conductor_jars / ".stamp"
    stamp = _stamp(pom)
    if _fresh(conductor_jar(paths), stamp_file, stamp):
        return
    incoming = paths.conductor_jars / ".incoming"
    cmd = _maven_copy(pom, incoming)
    with step("fetching the Conductor server (Maven Central)", progress=progress):
        _run(cmd, cwd=pom.parent, env=os.environ, log=paths.logs / "build-conductor.log")
    jars = sorted(incoming.glob("conductor-server-*-boot.jar"))
    if not jars:
        raise StackError(
            f"Maven ran but left no conductor-server-*-boot.jar in {incoming}; check "
            f"{paths.logs / 'build-conductor.log'} and {pom}"
        )
    for old in paths.conductor_jars.glob("*.jar"):
        old.unlink()
    os.replace(jars[-1], paths.conductor_jars / jars[-1].name)
    shutil.rmtree(incoming, ignore_errors=True)
    stamp_file.write_text(stamp)


def pyspark_hadoop_version() -> str | None:
    """The Hadoop version the installed pyspark was built with (its hadoop-client-api jar);
    None without pyspark."""
    try:
        import pyspark
    except ImportError:
        return None
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        return None
    return jars[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def _fetch_spark_jars(paths: StackPaths, *, progress: bool) -> None:
    """hadoop-aws (at pyspark's Hadoop version) and its runtime dependencies, fetched with
    Maven into ``<stack>/spark-jars``: in-place tasks never resolve packages at run time."""
    hadoop = pyspark_hadoop_version()
    if hadoop is None:
        return  # no Spark on this machine: nothing needs the connector
    pom = paths.deploy / "spark-s3a" / "pom.xml"
    stamp_file = paths.spark_jars / ".stamp"
    stamp = _stamp(pom) + ":" + hadoop
    if _fresh(paths.spark_jars, stamp_file, stamp) and any(paths.spark_jars.glob("*.jar")):
        return
    incoming = paths.stack / ".spark-jars.incoming"
    cmd = _maven_copy(pom, incoming, f"-Dhadoop.version={hadoop}", "-DincludeScope=runtime")
    what = f"fetching hadoop-aws {hadoop} and the AWS SDK bundle (Maven Central)"
    with step(what, progress=progress):
        _run(cmd, cwd=pom.parent, env=os.environ, log=paths.logs / "build-spark-jars.log")
    if not list(incoming.glob(f"hadoop-aws-{hadoop}.jar")):
        raise StackError(
            f"Maven ran but left no hadoop-aws-{hadoop}.jar in {incoming}; check "
            f"{paths.logs / 'build-spark-jars.log'} and {pom}"
        )
    shutil.rmtree(paths.spark_jars, ignore_errors=True)
    os.replace(incoming, paths.spark_jars)
    stamp_file.write_text(stamp)


# -- Java ------------------------------------------------------------------------------------


def parse_java_version(release_text: str) -> int | None:
    """The feature version in a JDK ``release`` file: ``"21.0.2"`` -> 21, ``"1.8.0_392"`` -> 8."""
    m = re.search(r'^JAVA_VERSION="?(\d+)(?:\.(\d+))?', release_text, re.MULTILINE)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def java_version(home: Path) -> int | None:
    """The version of the JDK at ``home``, or None if it is not a JDK with a ``java``."""
    release = home / "release"
    if not release.is_file() or not (home / "bin" / "java").is_file():
        return None
    return parse_java_version(release.read_text(errors="replace"))


def _homes(search_dirs: Iterable[str | Path]) -> Iterator[Path]:
    for base in search_dirs:
        base_path = Path(base).expanduser()
        if not base_path.is_dir():
            continue
        for child in sorted(base_path.iterdir()):
            yield child
            yield child / "Contents" / "Home"  # macOS bundle layout


def find_java(
    *,
    minimum: int = CONDUCTOR_MIN_JAVA,
    env: Mapping[str, str] | None = None,
    search_dirs: Iterable[str | Path] = JDK_SEARCH_DIRS,
) -> Path:
    """The ``java`` to run Conductor with: PERAGO_CONDUCTOR_JAVA, JAVA_HOME, or the newest JDK.

    JAVA_HOME wins when it is new enough (the user chose it); otherwise the newest JDK >=
    ``minimum`` under the usual install folders.
    """
    env = os.environ if env is None else env
    override = env.get("PERAGO_CONDUCTOR_JAVA")
    if override:
        java = Path(override).expanduser()
        if java.is_dir():
            java = java / "bin" / "java"
        if not java.is_file():
            raise StackError(
                f"PERAGO_CONDUCTOR_JAVA={override} is not a java executable or JDK folder; "
                f"point it at a JDK >= {minimum} (its bin/java) or unset it"
            )
        return java
    java_home = env.get("JAVA_HOME")
    if java_home:
        version = java_version(Path(java_home))
        if version is not None and version >= minimum:
            return Path(java_home) / "bin" / "java"
    found: dict[Path, int] = {}
    for home in _homes(search_dirs):
        version = java_version(home)
        if version is not None and version >= minimum:
            found.setdefault(home.resolve(), version)
    if not found:
        looked = ", ".join(str(d) for d in search_dirs)
        raise StackError(
            f"Conductor needs a JDK >= {minimum} and none was found (JAVA_HOME, {looked}); "
            f"install one (e.g. `apt-get install openjdk-{minimum}-jdk-headless`, "
            f"`brew install openjdk@{minimum}`) or set PERAGO_CONDUCTOR_JAVA to its bin/java"
        )
    newest = max(found.items(), key=lambda item: (item[1], str(item[0])))[0]
    return newest / "bin" / "java"


# -- PostgreSQL (the production profile) ---------------------------------------------------------

#: Where Debian and Ubuntu (``/usr/lib/postgresql/<major>/bin``) and Homebrew keep the server.
_POSTGRES_DIRS = ("/usr/lib/postgresql/*/bin", "/opt/homebrew/opt/postgresql@*/bin")
POSTGRES_MINIMUM = 13


def postgres_bin(env: Mapping[str, str] | None = None) -> Path:
    """The folder of PostgreSQL's server binaries (``initdb``, ``postgres``, ``pg_isready``):
    ``PERAGO_POSTGRES_BIN``, else the newest packaged one, else the one on ``PATH``."""
    env = os.environ if env is None else env
    if override := env.get("PERAGO_POSTGRES_BIN"):
        folder = Path(override).expanduser()
        if not (folder / "initdb").is_file():
            raise StackError(
                f"PERAGO_POSTGRES_BIN={override} has no initdb; point it at the folder of "
                "PostgreSQL's server binaries (e.g. /usr/lib/postgresql/15/bin)"
            )
        return folder
    found = [Path(p) for pattern in _POSTGRES_DIRS for p in sorted(Path("/").glob(pattern[1:]))]
    if on_path := shutil.which("initdb"):
        found.append(Path(on_path).resolve().parent)
    usable = [f for f in found if (f / "initdb").is_file() and (f / "postgres").is_file()]
    if not usable:
        raise StackError(
            f"the production profile needs PostgreSQL >= {POSTGRES_MINIMUM} and none was found; "
            "install it (Debian: `apt-get install postgresql`, macOS: `brew install "
            "postgresql@15`) or set PERAGO_POSTGRES_BIN to the folder holding initdb"
        )
    return max(usable, key=lambda f: _version_tuple(f.parent.name if f.name == "bin" else ""))


# -- all of it ----------------------------------------------------------------------------------


def _building(paths: StackPaths) -> AbstractContextManager[None]:
    """One build at a time per stack folder: a process finds the binaries current, or waits
    while another makes them so."""
    paths.make()
    return exclusive(paths.run / ".build-lock")


def build(
    *,
    progress: bool = False,
    helm: bool = False,
    webui: bool = True,
    production: bool = False,
    k8s: bool = False,
) -> None:
    """Make every stack binary present and current; idempotent and cheap when nothing changed.

    ``helm`` also builds Helm (not part of the stack; the chart tests build it on demand);
    ``webui`` embeds lakeFS's web UI in the lakefs binary (needs npm); ``production`` also
    builds the production profile's S3 server and checks for PostgreSQL's binaries; ``k8s``
    the Kubernetes control plane and KWOK (``make test-k8s``).
    """
    paths = stack_paths()
    with _building(paths):
        _build_go_binary(paths, "lakefs", progress=progress, webui=webui)
        _build_go_binary(paths, "lakectl", progress=progress)
        _fetch_conductor(paths, progress=progress)
        _fetch_spark_jars(paths, progress=progress)
        find_java()
        if production:
            _build_go_binary(paths, "versitygw", progress=progress)
            postgres_bin()
        if helm:
            _build_go_binary(paths, "helm", progress=progress)
        if k8s:
            for name in CONTROL_PLANE:
                _build_go_binary(paths, name, progress=progress)


def build_helm(*, progress: bool = False) -> Path:
    """Helm built from ``perago-dev/perago_dev/recipes/helm`` (cached like lakectl); its path."""
    paths = stack_paths()
    with _building(paths):
        return _build_go_binary(paths, "helm", progress=progress)


def build_versitygw(*, progress: bool = False) -> Path:
    """The production profile's S3 server from ``recipes/versitygw`` (cached); its path."""
    paths = stack_paths()
    with _building(paths):
        return _build_go_binary(paths, "versitygw", progress=progress)


def build_control_plane(*, progress: bool = False) -> dict[str, Path]:
    """The Kubernetes control plane and KWOK from ``recipes/{etcd,k8s,kwok}`` (cached like
    Helm; the first build takes several minutes on two cores); name -> path."""
    paths = stack_paths()
    with _building(paths):
        return {name: _build_go_binary(paths, name, progress=progress) for name in CONTROL_PLANE}


def build_toxiproxy(*, progress: bool = False) -> Path:
    """Toxiproxy's server from ``recipes/toxiproxy`` (cached like Helm); its path."""
    paths = stack_paths()
    with _building(paths):
        return _build_go_binary(paths, "toxiproxy", progress=progress)
