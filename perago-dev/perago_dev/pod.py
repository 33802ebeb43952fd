"""A worker pod's container, started on this machine as its spec says, with no container
runtime: what a kubelet would run, in a chroot of the image's root filesystem.

:func:`container_process` reads the Pod the API server made (defaults filled in) and the
ConfigMaps and Secrets it names, and works out the command (the image's entrypoint and the
container's args), the environment (the image's, then ``envFrom``, then ``env``, references
resolved), the user and group, whether the root filesystem is read-only, the ``emptyDir``
mounts, the probes' HTTP paths and ports and the termination grace period.
:func:`started` runs it. What this cannot show (no seccomp filter, no cgroup limits, the
host's network): docs/operations.md.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perago.errors import StackError

__all__ = ["ContainerProcess", "Probe", "container_process", "started"]


@dataclass(frozen=True)
class Probe:
    kind: str  # startup, liveness, readiness
    path: str
    port: int


@dataclass(frozen=True)
class ContainerProcess:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    uid: int
    gid: int
    read_only_root: bool
    #: Where an emptyDir is mounted (a fresh tmpfs each).
    scratch: tuple[str, ...]
    probes: tuple[Probe, ...]
    grace_seconds: int


def _reference(
    kind: str, ref: Mapping[str, Any], sources: Mapping[str, Mapping[str, str]]
) -> str | None:
    source = sources.get(ref["name"])
    if source is None or ref["key"] not in source:
        if ref.get("optional"):
            return None
        raise StackError(
            f"the pod needs {kind} {ref['name']!r} key {ref['key']!r}, which does not exist: "
            "a kubelet would not start it (CreateContainerConfigError)"
        )
    return source[ref["key"]]


def _secret_data(secret: Mapping[str, Any]) -> dict[str, str]:
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    return {**data, **(secret.get("stringData") or {})}


def container_process(
    pod: Mapping[str, Any],
    config_maps: Sequence[Mapping[str, Any]],
    secrets: Sequence[Mapping[str, Any]],
    *,
    entrypoint: Sequence[str],
    image_env: Mapping[str, str],
) -> ContainerProcess:
    """What a kubelet would start for the pod's only container."""
    spec = pod["spec"]
    (container,) = spec["containers"]
    maps = {m["metadata"]["name"]: dict(m.get("data") or {}) for m in config_maps}
    keys = {s["metadata"]["name"]: _secret_data(s) for s in secrets}
    env = dict(image_env)
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(maps.get(source["configMapRef"]["name"], {}))
        elif "secretRef" in source:
            env.update(keys.get(source["secretRef"]["name"], {}))
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"].get("namespace", ""),
    }
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        source = var.get("valueFrom", {})
        value: str | None
        if "configMapKeyRef" in source:
            value = _reference("config map", source["configMapKeyRef"], maps)
        elif "secretKeyRef" in source:
            value = _reference("secret", source["secretKeyRef"], keys)
        elif "fieldRef" in source:
            value = fields.get(source["fieldRef"]["fieldPath"])
        else:
            raise StackError(f"env {var['name']}: {source} is not supported here")
        if value is not None:
            env[var["name"]] = value
    pod_security = spec.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    uid, gid = int(security.get("runAsUser", 0)), int(security.get("runAsGroup", 0))
    if security.get("runAsNonRoot") and uid == 0:
        raise StackError("the pod asks runAsNonRoot but runs as uid 0")
    empty = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    scratch = tuple(m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in empty)
    ports = {p.get("name"): int(p["containerPort"]) for p in container.get("ports", [])}
    probes = []
    for kind in ("startup", "liveness", "readiness"):
        get = container.get(f"{kind}Probe", {}).get("httpGet")
        if get is not None:
            port = get["port"]
            probes.append(Probe(kind, get["path"], ports[port] if isinstance(port, str) else port))
    return ContainerProcess(
        argv=(*(container.get("command") or entrypoint), *container.get("args", [])),
        env=env,
        uid=uid,
        gid=gid,
        read_only_root=bool(security.get("readOnlyRootFilesystem")),
        scratch=scratch,
        probes=tuple(probes),
        grace_seconds=int(spec.get("terminationGracePeriodSeconds", 30)),
    )


@contextlib.contextmanager
def started(
    rootfs: Path, process: ContainerProcess, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """``process`` running in a chroot of ``rootfs`` (root only): the root bind-mounted
    (read-only if the pod says so), /proc, a fresh tmpfs at each emptyDir; everything is
    unmounted and the process killed when the block ends."""
    top = Path(tempfile.mkdtemp(prefix="perago-pod-"))
    mounts: list[Path] = []

    def mount(*args: str) -> None:
        subprocess.run(["mount", *args], check=True)

    try:
        mount("--bind", str(rootfs), str(top))
        mounts.append(top)
        if process.read_only_root:
            mount("-o", "remount,bind,ro", str(top))
        mount("-t", "proc", "proc", str(top / "proc"))
        mounts.append(top / "proc")
        for path in process.scratch:
            target = top / path.lstrip("/")
            if not target.is_dir():
                raise StackError(f"the image has no folder {path} to mount the emptyDir on")
            mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(target))
            mounts.append(target)
        with log.open("w") as out:
            proc = subprocess.Popen(
                ["chroot", f"--userspec={process.uid}:{process.gid}", str(top), *process.argv],
                env=dict(process.env),
                cwd="/",
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        for target in reversed(mounts):
            subprocess.run(["umount", "-l", str(target)], check=False)
        with contextlib.suppress(OSError):
            top.rmdir()
