"""The worker image, built without a container registry, and checked in a chroot.

``deploy/docker/Dockerfile`` builds the image where a Docker engine and Docker Hub are at
hand. This builds the same image from Debian's packages and PyPI's wheels only, as root:

1. a Debian root filesystem made with ``debootstrap`` (minbase, Python, a headless Java 17
   for Spark's driver), cached until its package list changes;
2. a copy of it with Perago and its dependencies in a virtualenv (``/opt/perago``) from
   wheels built here, the example task modules in ``/app/workers``, the S3A connector's jars
   in ``/opt/perago/spark-jars``, the user ``perago`` (uid/gid 10001);
3. an OCI image assembled from that folder with ``buildah`` (``from scratch``, the
   environment, user, working folder, port and entrypoint of the Dockerfile), written as an
   OCI archive for ``skopeo``/``podman``/a registry to take.

:func:`check` runs the image's entrypoint in a chroot of that root filesystem as uid 10001,
with the root mounted read-only and a fresh ``/tmp`` (as the Helm chart runs it:
``readOnlyRootFilesystem`` and an ``emptyDir`` at ``/tmp``), against a running stack: the
version, the probes, one workflow completed and published, a drain on SIGTERM.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from perago.errors import StackError
from perago_dev.build import step
from perago_dev.paths import StackPaths, find_project_root, stack_paths
from perago_dev.s3_stack import free_port

__all__ = ["ENTRYPOINT", "IMAGE_ENV", "UID", "Image", "build", "check", "current"]

SUITE = "bookworm"  # Debian 12: Python 3.11, OpenJDK 17
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "ca-certificates", "openjdk-17-jre-headless", "procps")
UID = 10001
VENV = "/opt/perago"
SPARK_JARS = "/opt/perago/spark-jars"
#: The image's environment (the Dockerfile's ENV lines), also the chroot check's.
IMAGE_ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/home/perago",
    "PYTHONPATH": "/app",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PERAGO_SPARK_JARS_DIR": SPARK_JARS,
    "LANG": "C.UTF-8",
}
ENTRYPOINT = ["perago", "worker"]
#: What the Helm chart's ConfigMap sets besides the servers (deploy/helm/perago-worker).
CHART_CONFIG = {"PERAGO_WORK_DIR": "/tmp/perago", "PERAGO_SPARK_IVY_DIR": "/tmp/ivy"}
PORT = 8000


@dataclass(frozen=True)
class Image:
    """What :func:`build` made: the root filesystem, the OCI archive, the image's name."""

    rootfs: Path
    archive: Path
    name: str


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise StackError(
            f"{what} needs root (debootstrap, chroot and mounts); run it as root, or build "
            "with Docker: docker build -f deploy/docker/Dockerfile ."
        )


def _tool(name: str, package: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        raise StackError(f"{name} is missing: install it (Debian: apt-get install {package})")
    return found


def _run(cmd: list[str], log: Path, *, env: Mapping[str, str] | None = None) -> None:
    with log.open("ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise StackError(f"`{' '.join(cmd[:4])} ...` failed (exit {done.returncode}):\n{tail}")


def _version(root: Path) -> str:
    import tomllib

    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


@contextlib.contextmanager
def _mounted(rootfs: Path, *binds: tuple[Path, str]) -> Iterator[None]:
    """``/proc`` and the given host folders mounted inside ``rootfs`` for a while."""
    mounted: list[Path] = []
    try:
        (rootfs / "proc").mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "proc", "proc", str(rootfs / "proc")], check=True)
        mounted.append(rootfs / "proc")
        for host, inside in binds:
            target = rootfs / inside.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(host), str(target)], check=True)
            mounted.append(target)
        yield
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", str(target)], check=False)


def _base(paths: StackPaths, log: Path, *, progress: bool) -> Path:
    """The debootstrapped Debian root filesystem, cached by its suite and package list."""
    base = paths.stack / "image" / "base"
    stamp = hashlib.sha256(f"{SUITE} {MIRROR} {' '.join(PACKAGES)}".encode()).hexdigest()
    stamp_file = paths.stack / "image" / ".base.stamp"
    if base.is_dir() and stamp_file.is_file() and stamp_file.read_text() == stamp:
        return base
    shutil.rmtree(base, ignore_errors=True)
    debootstrap = _tool("debootstrap", "debootstrap")
    with step(f"debootstrap Debian {SUITE} ({', '.join(PACKAGES)})", progress=progress):
        cmd = [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}"]
        _run([*cmd, SUITE, str(base), MIRROR], log)
    # what apt left behind is no part of an image
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (base / junk).glob("*"):
            if entry.is_file():
                entry.unlink()
    stamp_file.write_text(stamp)
    return base


def _inputs_stamp(root: Path) -> str:
    """What the image is built from: the lock, the runtime's and the examples' sources."""
    files = [root / "pyproject.toml", root / "requirements" / "constraints.txt"]
    for folder in ("perago", "workers"):
        files += sorted(p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def current(*, progress: bool = False) -> Image:
    """The image built from this checkout as it is now: the last one if nothing it is built
    from changed since, else a new build (root only)."""
    _require_root("building the worker image")
    root = find_project_root()
    if root is None:
        raise StackError("the worker image is built from a Perago checkout: run it in one")
    work = stack_paths().stack / "image"
    version = _version(root)
    image = Image(
        rootfs=work / "rootfs",
        archive=work / f"perago-worker-{version}.oci.tar",
        name=f"localhost/perago-worker:{version}",
    )
    stamp_file, stamp = work / ".inputs.stamp", _inputs_stamp(root)
    if (
        image.archive.is_file()
        and (image.rootfs / VENV.lstrip("/")).is_dir()
        and stamp_file.is_file()
        and stamp_file.read_text() == stamp
    ):
        return image
    image = build(progress=progress)
    stamp_file.write_text(stamp)
    return image


def build(*, progress: bool = False) -> Image:
    """Build the root filesystem and the OCI image (see the module's note); root only."""
    _require_root("building the worker image")
    paths = stack_paths()
    root = find_project_root()
    if root is None:
        raise StackError("the worker image is built from a Perago checkout: run it in one")
    version = _version(root)
    work = paths.stack / "image"
    work.mkdir(parents=True, exist_ok=True)
    log = paths.logs / "build-image.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    base = _base(paths, log, progress=progress)
    rootfs = work / "rootfs"
    with step("copying the base root filesystem", progress=progress):
        shutil.rmtree(rootfs, ignore_errors=True)
        _run(["cp", "-a", str(base), str(rootfs)], log)
    wheels = work / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    with step(
        "building wheels of Perago and its dependencies (the lock's versions)", progress=progress
    ):
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--wheel-dir",
                str(wheels),
                "-c",
                str(root / "requirements" / "constraints.txt"),
                f"{root}[spark]",
            ],
            log,
        )
    with (
        step(f"installing them into {VENV}", progress=progress),
        _mounted(rootfs, (wheels, "/wheels")),
    ):
        install = (
            f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --no-cache-dir --no-index "
            "--find-links /wheels 'perago-runtime[spark]'"
        )
        _run(["chroot", str(rootfs), "/bin/sh", "-c", install], log, env=IMAGE_ENV)
    shutil.copytree(
        root / "workers", rootfs / "app" / "workers", ignore=shutil.ignore_patterns("__pycache__")
    )
    jars = rootfs / SPARK_JARS.lstrip("/")
    jars.mkdir(parents=True, exist_ok=True)
    for jar in sorted(paths.spark_jars.glob("*.jar")):  # fetched by `perago dev build`
        shutil.copy2(jar, jars / jar.name)
    if not any(jars.glob("*.jar")):
        raise StackError(f"no S3A jars in {paths.spark_jars}: run `perago dev build` first")
    useradd = (
        f"groupadd --gid {UID} perago && useradd --uid {UID} --gid {UID} --create-home "
        "--home-dir /home/perago --shell /usr/sbin/nologin perago"
    )
    _run(["chroot", str(rootfs), "/bin/sh", "-c", useradd], log, env=IMAGE_ENV)
    name = f"localhost/perago-worker:{version}"
    archive = work / f"perago-worker-{version}.oci.tar"
    with step(f"assembling {name} with buildah", progress=progress):
        _assemble(rootfs, name, archive, log)
    return Image(rootfs=rootfs, archive=archive, name=name)


def _assemble(rootfs: Path, name: str, archive: Path, log: Path) -> None:
    buildah = _tool("buildah", "buildah")
    # vfs needs no overlay support; chroot isolation needs no user namespaces or cgroups.
    env = {**os.environ, "STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}
    ctr = subprocess.run(
        [buildah, "from", "scratch"], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    try:
        _run([buildah, "copy", ctr, str(rootfs), "/"], log, env=env)
        config = [buildah, "config", "--user", f"{UID}:{UID}", "--workingdir", "/app"]
        config += ["--port", str(PORT), "--entrypoint", json.dumps(ENTRYPOINT)]
        config += ["--label", "org.opencontainers.image.title=perago-worker"]
        for key, value in IMAGE_ENV.items():
            config += ["--env", f"{key}={value}"]
        _run([*config, ctr], log, env=env)
        _run([buildah, "commit", "-q", "--rm", ctr, name], log, env=env)
    except BaseException:
        subprocess.run([buildah, "rm", ctr], env=env, check=False, capture_output=True)
        raise
    archive.unlink(missing_ok=True)
    try:
        _run(
            [buildah, "push", name, f"oci-archive:{archive}:{name.rsplit(':', 1)[1]}"], log, env=env
        )
    finally:  # the archive is the product; vfs storage would keep a full copy per build
        subprocess.run([buildah, "rmi", name], env=env, check=False, capture_output=True)


# -- the check --------------------------------------------------------------------------------


def _get(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=3) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


@contextlib.contextmanager
def _read_only_root(rootfs: Path) -> Iterator[Path]:
    """``rootfs`` mounted read-only at a fresh folder, with a writable tmpfs at ``/tmp``."""
    top = Path(tempfile.mkdtemp(prefix="perago-image-"))
    mounts: list[Path] = []
    try:
        subprocess.run(["mount", "--bind", str(rootfs), str(top)], check=True)
        mounts.append(top)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(top)], check=True)
        for kind, target in (("proc", top / "proc"), ("tmpfs", top / "tmp")):
            subprocess.run(["mount", "-t", kind, kind, str(target)], check=True)
            mounts.append(target)
        yield top
    finally:
        for target in reversed(mounts):
            subprocess.run(["umount", "-l", str(target)], check=False)
        with contextlib.suppress(OSError):
            top.rmdir()


def check(image: Image, stack_env: Mapping[str, str], *, say: bool = True) -> list[str]:
    """Run the image's entrypoint in a chroot against the stack; what was verified, in
    order. Raises StackError on the first thing that does not hold."""
    _require_root("checking the worker image")
    from perago.adapters.conductor import ConductorClient
    from perago.adapters.lakefs import LakeFSStore
    from perago.config import load

    done: list[str] = []

    def ok(what: str) -> None:
        done.append(what)
        if say:
            print(f"ok: {what}", file=sys.stderr, flush=True)

    settings = load(env=dict(stack_env))
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    chroot = ["chroot", f"--userspec={UID}:{UID}"]
    env = {
        **IMAGE_ENV,
        **{k: v for k, v in stack_env.items() if not k.startswith("PERAGO_")},
        **CHART_CONFIG,
    }
    with _read_only_root(image.rootfs) as top:
        version = subprocess.run(
            [*chroot, str(top), "perago", "--version"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if version.returncode != 0:
            raise StackError(f"`perago --version` in the image failed: {version.stderr[-2000:]}")
        ok(f"`perago --version` as uid {UID}: {version.stdout.strip()}")
        probe = "touch /tmp/w && ! touch /app/w 2>/dev/null && ! touch /home/perago/w 2>/dev/null"
        if subprocess.run([*chroot, str(top), "/bin/sh", "-c", probe], env=env).returncode != 0:
            raise StackError("the chroot's root is writable or its /tmp is not: check the mounts")
        ok("the root filesystem refuses writes, /tmp takes them")
        repo = f"image-check-{uuid.uuid4().hex[:8]}"
        store.create_repository(repo)
        from perago.conductor.registry import discover, register

        root = find_project_root()
        assert root is not None
        sys.path.insert(0, str(root))
        register(conductor, discover(["workers.smoke.tasks"]))
        conductor.put_workflow_defs([json.loads((root / "workflows" / "smoke.json").read_text())])
        port = free_port()
        log = image.rootfs.parent / "check-worker.log"
        with log.open("w") as out:
            worker = subprocess.Popen(
                [*chroot, str(top), *ENTRYPOINT, "workers.smoke.tasks", "--http-port", str(port)],
                env=env,
                cwd="/",
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 90
            while _get(f"http://127.0.0.1:{port}/readyz") != 200:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise StackError(f"the worker in the image never got ready; see {log}")
                time.sleep(0.5)
            ok(f"probes: /healthz {_get(f'http://127.0.0.1:{port}/healthz')}, /readyz 200")
            name = f"image {uuid.uuid4().hex[:6]}"
            wid = conductor.start_workflow(
                "perago_smoke",
                {"workspace": {"repository": repo, "branch": "main"}, "name": name},
            )
            deadline = time.monotonic() + 120
            while (wf := conductor.get_workflow(wid)).get("status") == "RUNNING":
                if time.monotonic() > deadline:
                    raise StackError(f"workflow {wid} still RUNNING after 120 s; see {log}")
                time.sleep(0.5)
            if wf.get("status") != "COMPLETED":
                raise StackError(
                    f"workflow {wid} {wf.get('status')}: {wf.get('reasonForIncompletion')}"
                )
            written = [o.path for o in store.list_objects(repo, "main", "smoke/")]
            if written != [f"smoke/hello-{name}.txt"]:
                raise StackError(f"expected smoke/hello-{name}.txt on {repo}/main, found {written}")
            ok(f"workflow perago_smoke COMPLETED, {written[0]} published on {repo}/main")
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=60)
            text = log.read_text()
            drained = '"shutdown_requested"' in text and '"worker_stopped"' in text
            if code != 0 or not drained:
                raise StackError(
                    f"the worker did not drain cleanly on SIGTERM (exit {code}); see {log}"
                )
            ok("SIGTERM: drained, exit status 0")
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            store.delete_repository(repo)
    return done
