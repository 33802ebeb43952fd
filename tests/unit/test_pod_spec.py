"""What a kubelet would start for a worker pod (perago_dev.pod), from the objects alone; the
run itself is in tests/k8s (a real API server, the built image, a chroot)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from perago.errors import StackError
from perago_dev.pod import Probe, container_process


def _pod(**container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "w-1", "namespace": "workers"},
        "spec": {
            "terminationGracePeriodSeconds": 50,
            "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": True},
            "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {}}],
            "containers": [
                {
                    "name": "worker",
                    "args": ["mod.tasks", "--http-port", "8123"],
                    "ports": [{"name": "http", "containerPort": 8123}],
                    "envFrom": [{"configMapRef": {"name": "cm"}}],
                    "env": [
                        {"name": "PERAGO_SHUTDOWN_GRACE", "value": "30"},
                        {"name": "FROM_CM", "value": "explicit wins"},
                        {
                            "name": "KEY",
                            "valueFrom": {"secretKeyRef": {"name": "sec", "key": "KEY"}},
                        },
                        {
                            "name": "MAYBE",
                            "valueFrom": {
                                "secretKeyRef": {"name": "sec", "key": "NONE", "optional": True}
                            },
                        },
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8123}},
                    "securityContext": {"readOnlyRootFilesystem": True},
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/tmp"},
                        {"name": "cfg", "mountPath": "/etc/cfg"},
                    ],
                    **container,
                }
            ],
        },
    }


CONFIG_MAPS = [{"metadata": {"name": "cm"}, "data": {"FROM_CM": "cm", "PERAGO_X": "1"}}]
SECRETS = [{"metadata": {"name": "sec"}, "data": {"KEY": base64.b64encode(b"s3cret").decode()}}]


def test_the_process_is_what_the_pod_spec_says() -> None:
    p = container_process(
        _pod(), CONFIG_MAPS, SECRETS, entrypoint=["perago", "worker"], image_env={"PATH": "/bin"}
    )
    assert p.argv == ("perago", "worker", "mod.tasks", "--http-port", "8123")
    assert p.env == {
        "PATH": "/bin",
        "FROM_CM": "explicit wins",  # env after envFrom, as a kubelet does
        "PERAGO_X": "1",
        "PERAGO_SHUTDOWN_GRACE": "30",
        "KEY": "s3cret",
        "POD": "w-1",
    }
    assert (p.uid, p.gid, p.read_only_root) == (10001, 10001, True)
    assert p.scratch == ("/tmp",), "only emptyDir volumes become scratch mounts"
    assert set(p.probes) == {
        Probe("liveness", "/healthz", 8123),
        Probe("readiness", "/readyz", 8123),
    }
    assert p.grace_seconds == 50


def test_a_command_replaces_the_entrypoint() -> None:
    p = container_process(
        _pod(command=["python", "-m", "perago"]), CONFIG_MAPS, SECRETS, entrypoint=["x"],
        image_env={},
    )  # fmt: skip
    assert p.argv[:3] == ("python", "-m", "perago")


def test_what_a_kubelet_would_refuse_is_refused() -> None:
    with pytest.raises(StackError, match="CreateContainerConfigError"):
        container_process(_pod(), CONFIG_MAPS, [], entrypoint=["x"], image_env={})
    root = _pod(securityContext={"runAsUser": 0})
    with pytest.raises(StackError, match="runAsNonRoot"):
        container_process(root, CONFIG_MAPS, SECRETS, entrypoint=["x"], image_env={})
