"""A Kubernetes control plane on this machine, without a container runtime.

KWOK's ``kwokctl`` starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler
as processes (its "binary" runtime), each built by :mod:`perago_dev.build` from pinned Go
modules; KWOK's controller plays the nodes and the pods' lifecycles (scheduled pods turn
Running and Ready, deleted pods go). So the API server's validation, the Deployment,
ReplicaSet and disruption controllers, evictions and the scheduler are real; no container
runs: probes, images and processes are checked elsewhere (docs/operations.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perago.errors import StackError
from perago_dev.build import build_control_plane
from perago_dev.paths import stack_paths

__all__ = ["Cluster", "kwok_cluster"]


@dataclass(frozen=True)
class Cluster:
    """A running control plane: its kubeconfig and the kubectl of its version."""

    name: str
    kubeconfig: Path
    kubectl_binary: Path
    env: Mapping[str, str]

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` against this cluster; a failure (with ``check``) says what it
        printed."""
        done = subprocess.run(
            [str(self.kubectl_binary), f"--kubeconfig={self.kubeconfig}", *args],
            env=dict(self.env),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise StackError(
                f"kubectl {' '.join(args)} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[:2000]}"
            )
        return done

    def get(self, *args: str) -> Any:
        """``kubectl get ARGS -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


def _config(bins: Mapping[str, Path]) -> str:
    """kwokctl's configuration: every binary from this machine (nothing is downloaded) and
    the API server on the loopback interface only."""
    options = {
        "runtime": "binary",
        "bindAddress": "127.0.0.1",
        "etcdBinary": str(bins["etcd"]),
        "kubeApiserverBinary": str(bins["kube-apiserver"]),
        "kubeControllerManagerBinary": str(bins["kube-controller-manager"]),
        "kubeSchedulerBinary": str(bins["kube-scheduler"]),
        "kubectlBinary": str(bins["kubectl"]),
        "kwokControllerBinary": str(bins["kwok"]),
    }
    return json.dumps(
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": options,
        },
        indent=2,
    )


@contextmanager
def kwok_cluster(
    name: str = "perago", *, nodes: int = 3, progress: bool = False
) -> Iterator[Cluster]:
    """Start a control plane with ``nodes`` simulated nodes; removed when the block ends.

    A cluster of the same name left by an earlier run is removed first (kwokctl would
    otherwise continue it). The first call builds the binaries (several minutes)."""
    bins = build_control_plane(progress=progress)
    paths = stack_paths()
    workdir = paths.stack / "kwok"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "kwok.yaml"
    config.write_text(_config(bins))
    env = {
        **os.environ,
        "KWOK_WORKDIR": str(workdir),
        # kwokctl runs the first kubectl on PATH: the one of the cluster's version
        "PATH": f"{bins['kubectl'].parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("KUBECONFIG", None)
    log = paths.logs / f"kwokctl-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)

    def kwokctl(*args: str, check: bool = True, timeout: float = 600) -> None:
        with log.open("a") as out:
            done = subprocess.run(
                [str(bins["kwokctl"]), "--config", str(config), "--name", name, *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        if check and done.returncode != 0:
            raise StackError(
                f"kwokctl {' '.join(args)} failed ({done.returncode}); its output is in {log}"
            )

    kwokctl("delete", "cluster", check=False)
    kwokctl("create", "cluster", "--kubeconfig=", "--wait", "3m", "--timeout", "10m")
    try:
        kwokctl("scale", "node", "--replicas", str(nodes))
        kubeconfig = workdir / "clusters" / name / "kubeconfig.yaml"
        yield Cluster(name, kubeconfig, bins["kubectl"], env)
    finally:
        kwokctl("delete", "cluster", check=False)
