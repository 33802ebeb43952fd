"""The deployment files agree with the pins and the chart (no Docker or cluster needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
CHART_VALUES = ROOT / "deploy" / "helm" / "perago-worker" / "values.yaml"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _pin(path: str, pattern: str) -> str:
    m = re.search(pattern, (ROOT / path).read_text())
    assert m is not None, f"no pin in {path}"
    return m.group(1)


def test_compose_runs_the_versions_the_local_stack_pins() -> None:
    services = _compose()["services"]
    lakefs = _pin(
        "perago-dev/perago_dev/recipes/lakefs/go.mod", r"github\.com/treeverse/lakefs v(\S+)"
    )
    conductor = _pin(
        "perago-dev/perago_dev/recipes/conductor/pom.xml", r"<conductor\.version>(.+?)<"
    )
    assert services["lakefs"]["image"] == f"treeverse/lakefs:{lakefs}"
    assert services["conductor"]["image"] == f"conductoross/conductor:{conductor}"


def test_compose_worker_drains_like_the_chart() -> None:
    worker = _compose()["services"]["worker"]
    drain = yaml.safe_load(CHART_VALUES.read_text())["drain"]
    grace = int(worker["environment"]["PERAGO_SHUTDOWN_GRACE"])
    assert grace == drain["graceSeconds"]
    assert worker["stop_grace_period"] == f"{grace + drain['marginSeconds']}s"
    assert worker["build"]["dockerfile"] == "deploy/docker/Dockerfile"
    assert worker["command"][:1] == ["workers.orders.tasks"]
    assert "--http-port" in worker["command"]
    for name in ("lakefs", "conductor"):
        assert worker["depends_on"][name] == {"condition": "service_healthy"}


def test_image_runs_perago_worker_as_a_non_root_user() -> None:
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["perago", "worker"]' in text
    assert re.search(r"^USER 10001$", text, re.MULTILINE)
    assert "openjdk-17-jre-headless" in text
    bases = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert bases and re.fullmatch(r"python:3\.11\.\d+-slim-\w+", bases[0]), bases
    chart_uid = yaml.safe_load(CHART_VALUES.read_text())["podSecurityContext"]["runAsUser"]
    assert chart_uid == 10001


def test_the_operations_guide_lists_every_metric() -> None:
    from perago.telemetry import metrics

    guide = (ROOT / "docs" / "operations.md").read_text()
    for export in metrics.__all__:
        metric = getattr(metrics, export)
        family = metric.describe()[0]
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{name}` |" in guide, f"docs/operations.md has no row for {name}"


def test_the_image_fetches_hadoop_aws_at_pyspark_s_hadoop_version() -> None:
    from perago_dev.build import pyspark_hadoop_version

    pinned = re.search(r"ARG HADOOP_VERSION=(\S+)", DOCKERFILE.read_text())
    assert pinned is not None and pinned.group(1) == pyspark_hadoop_version()
    assert "ENV PERAGO_SPARK_JARS_DIR=/opt/perago/spark-jars" in DOCKERFILE.read_text()
