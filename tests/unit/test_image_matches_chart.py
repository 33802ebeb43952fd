"""The worker image (perago_dev.image, deploy/docker/Dockerfile) and the Helm chart agree on
the user, the port, the writable folders and the Spark jars."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from perago_dev import image

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "perago-worker"


def test_the_chart_runs_the_image_s_user_on_the_image_s_port() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    pod = values["podSecurityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (image.UID,) * 3
    assert values["securityContext"]["readOnlyRootFilesystem"] is True
    assert values["http"]["port"] == image.PORT


def test_the_chart_s_writable_folders_are_under_its_tmp_volume() -> None:
    configmap = (CHART / "templates" / "configmap.yaml").read_text()
    for name, value in image.CHART_CONFIG.items():
        assert f'"{name}" "{value}"' in configmap  # what the chroot check runs with
        assert value.startswith("/tmp/")
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert re.search(r"- name: scratch\s+mountPath: /tmp\b", deployment)


def test_the_dockerfile_builds_the_same_image() -> None:
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert f"--uid {image.UID}" in dockerfile and f"USER {image.UID}" in dockerfile
    assert f"PERAGO_SPARK_JARS_DIR={image.SPARK_JARS}" in dockerfile
    assert f"EXPOSE {image.PORT}" in dockerfile
    assert 'ENTRYPOINT ["perago", "worker"]' in dockerfile
    assert image.ENTRYPOINT == ["perago", "worker"]
    assert "PYTHONPATH=/app" in dockerfile and image.IMAGE_ENV["PYTHONPATH"] == "/app"
