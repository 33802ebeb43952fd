"""The worker chart (deploy/helm/perago-worker) rendered and linted by a real Helm.

Helm is built from the pinned Go module (perago_dev/recipes/helm) on first use and cached in
``.stack/bin/helm``; nothing here needs a cluster or the lakeFS/Conductor stack (no test
asks for ``stack_env``). Without Go the tests skip on a laptop and fail under ``CI``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from perago import config
from perago.config import Settings
from perago.errors import PeragoError
from perago_dev.build import build_helm
from perago_dev.settings_doc import env_names

# The first run builds Helm (a few minutes on a cold Go cache) inside the first test's setup.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "perago-worker"
NAMESPACE = "workers"

#: What Settings and conductor-python read as credentials.
CREDENTIAL_VARS = (
    "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
    "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
    "CONDUCTOR_AUTH_KEY",
    "CONDUCTOR_AUTH_SECRET",
)
SENTINELS = {
    "credentials.lakefs.accessKeyId": "AKIAPERAGOSENTINEL01",
    "credentials.lakefs.secretAccessKey": "sentinel-secret-access-key-0123456789abcdef",
    "credentials.conductor.authKey": "sentinel-conductor-key",
    "credentials.conductor.authSecret": "sentinel-conductor-secret",
    "credentials.extra.PERAGO_COORD_SECRET_ACCESS_KEY": "sentinel-coord-secret",
}


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return build_helm()
    except PeragoError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Helm cannot be built here ({e.message})")


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's config, cache and data folders in a temporary place: nothing touches ~."""
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-kubeconfig"),
    }


def _sets(values: dict[str, object]) -> list[str]:
    """Values as JSON, so strings stay strings (``--set`` reads ``{...}`` as a list)."""
    args: list[str] = []
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def _helm(helm: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, env=env, check=False, timeout=120
    )


class Rendered:
    """The manifests of one ``helm template``, by kind."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(text) if d]
        self.texts = {
            str(d["kind"]): part
            for part in text.split("\n---\n")
            for d in [yaml.safe_load(part)]
            if d
        }

    def kinds(self) -> set[str]:
        return {str(d["kind"]) for d in self.docs}

    def one(self, kind: str) -> dict[str, Any]:
        found = [d for d in self.docs if d["kind"] == kind]
        assert len(found) == 1, f"expected one {kind}, got {len(found)}"
        return found[0]

    @property
    def container(self) -> dict[str, Any]:
        containers = self.one("Deployment")["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        result: dict[str, Any] = containers[0]
        return result

    @property
    def env(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.container.get("env", [])}


def render(helm: Path, env: dict[str, str], values: dict[str, object] | None = None) -> Rendered:
    done = _helm(
        helm, env, "template", "r", str(CHART), "--namespace", NAMESPACE, *_sets(values or {})
    )
    assert done.returncode == 0, done.stderr
    return Rendered(done.stdout)


def render_fails(helm: Path, env: dict[str, str], values: dict[str, object]) -> str:
    done = _helm(helm, env, "template", "r", str(CHART), *_sets(values))
    assert done.returncode != 0, f"rendering should have failed with {values}"
    return done.stderr


VARIANTS: dict[str, dict[str, object]] = {
    "defaults": {},
    "existing-secret": {
        "credentials.existingSecret": "perago-credentials",
        "credentials.extraKeys": ["PERAGO_COORD_SECRET_ACCESS_KEY"],
    },
    "monitoring-and-autoscaling": {"serviceMonitor.enabled": True, "autoscaling.enabled": True},
    "custom-grace-and-port": {
        "drain.graceSeconds": 300,
        "drain.marginSeconds": 30,
        "http.port": 9100,
    },
    "chart-secret": dict(SENTINELS),
}


# -- helm itself and lint ------------------------------------------------------------------


def test_helm_is_the_pinned_version(helm: Path, helm_env: dict[str, str]) -> None:
    pinned = re.search(
        r"helm\.sh/helm/v3 (v\S+)", (ROOT / "perago-dev/perago_dev/recipes/helm/go.mod").read_text()
    )
    assert pinned is not None
    done = _helm(helm, helm_env, "version", "--short")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(pinned.group(1)), done.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint_is_clean(helm: Path, helm_env: dict[str, str], variant: str) -> None:
    done = _helm(helm, helm_env, "lint", "--strict", str(CHART), *_sets(VARIANTS[variant]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


# -- the Deployment ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_probes_and_args_use_the_http_port(
    helm: Path, helm_env: dict[str, str], variant: str
) -> None:
    values = VARIANTS[variant]
    port = int(str(values.get("http.port", 8000)))
    r = render(helm, helm_env, values)
    c = r.container
    args = c["args"]
    assert args[args.index("--http-port") + 1] == str(port)
    assert "workers.orders.tasks" in args
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named == {"http": port}

    def probe_port(probe: dict[str, Any]) -> int:
        p = probe["httpGet"]["port"]
        return named[p] if isinstance(p, str) else int(p)

    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert probe_port(c[kind]) == port, kind
    service = r.one("Service")["spec"]["ports"]
    assert service == [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]


@pytest.mark.parametrize(
    ("values", "grace", "margin"),
    [
        ({}, 30, 20),
        ({"drain.graceSeconds": 300}, 300, 20),
        ({"drain.graceSeconds": 90, "drain.marginSeconds": 45}, 90, 45),
    ],
)
def test_termination_grace_is_the_drain_grace_plus_the_margin(
    helm: Path, helm_env: dict[str, str], values: dict[str, object], grace: int, margin: int
) -> None:
    r = render(helm, helm_env, values)
    pod = r.one("Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace + margin
    assert r.env["PERAGO_SHUTDOWN_GRACE"] == {"name": "PERAGO_SHUTDOWN_GRACE", "value": str(grace)}
    assert "PERAGO_SHUTDOWN_GRACE" not in r.one("ConfigMap")["data"]
    # What the worker will read from that environment.
    loaded = config.load(env={"PERAGO_SHUTDOWN_GRACE": r.env["PERAGO_SHUTDOWN_GRACE"]["value"]})
    assert loaded.shutdown_grace.total_seconds() == grace


def test_a_margin_shorter_than_the_workers_own_wait_is_refused(
    helm: Path, helm_env: dict[str, str]
) -> None:
    assert "marginSeconds" in render_fails(helm, helm_env, {"drain.marginSeconds": 5})


def test_pods_run_as_non_root_without_privileges(helm: Path, helm_env: dict[str, str]) -> None:
    r = render(helm, helm_env)
    pod = r.one("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    sc = r.container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    # ... so the work dir (under /tmp) is a writable emptyDir.
    assert {"name": "scratch", "mountPath": "/tmp"} in r.container["volumeMounts"]
    assert r.one("ConfigMap")["data"]["PERAGO_WORK_DIR"].startswith("/tmp/")


def test_rolling_update_keeps_capacity(helm: Path, helm_env: dict[str, str]) -> None:
    spec = render(helm, helm_env).one("Deployment")["spec"]
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["replicas"] == 2


# -- credentials ---------------------------------------------------------------------------


def test_credentials_come_from_secret_key_refs(helm: Path, helm_env: dict[str, str]) -> None:
    r = render(helm, helm_env, dict(SENTINELS))
    secret_name = r.one("Secret")["metadata"]["name"]
    for name in (*CREDENTIAL_VARS, "PERAGO_COORD_SECRET_ACCESS_KEY"):
        entry = r.env[name]
        assert "value" not in entry, name
        ref = entry["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (secret_name, name)
    # lakeFS's keys are required: a pod without them does not start; Conductor auth is optional.
    assert not r.env["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"].get(
        "optional", False
    )
    assert r.env["CONDUCTOR_AUTH_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    data = r.one("Secret")["data"]
    assert (
        base64.b64decode(data["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"]).decode()
        == (SENTINELS["credentials.lakefs.secretAccessKey"])
    )
    annotations = r.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert {"checksum/config", "checksum/secret"} <= set(annotations)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_credential_value_outside_the_secret(
    helm: Path, helm_env: dict[str, str], variant: str
) -> None:
    values = {**VARIANTS[variant], **SENTINELS}
    r = render(helm, helm_env, values)
    for kind, text in r.texts.items():
        if kind == "Secret":
            continue
        for value in SENTINELS.values():
            assert value not in text, f"{value} leaked into the {kind}"
            assert base64.b64encode(value.encode()).decode() not in text, kind
    for name, entry in r.env.items():
        if name in CREDENTIAL_VARS or "SECRET" in name:
            assert "value" not in entry, name


def test_existing_secret_is_referenced_and_none_is_rendered(
    helm: Path, helm_env: dict[str, str]
) -> None:
    r = render(helm, helm_env, VARIANTS["existing-secret"])
    assert "Secret" not in r.kinds()
    refs = {
        name: e["valueFrom"]["secretKeyRef"]["name"]
        for name, e in r.env.items()
        if "valueFrom" in e
    }
    assert set(refs) == {*CREDENTIAL_VARS, "PERAGO_COORD_SECRET_ACCESS_KEY"}
    assert set(refs.values()) == {"perago-credentials"}
    annotations = r.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" in annotations and "checksum/secret" not in annotations


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"config.LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": "x"}, "looks like a credential"),
        ({"config.PERAGO_COORD_SECRET_ACCESS_KEY": "x"}, "looks like a credential"),
        ({"config.CONDUCTOR_AUTH_KEY": "x"}, "looks like a credential"),
        ({"config.AWS_ACCESS_KEY_ID": "x"}, "looks like a credential"),
        ({"config.PERAGO_SHUTDOWN_GRACE": "10"}, "drain.graceSeconds"),
        (
            {"extraEnv": [{"name": "LAKECTL_CREDENTIALS_ACCESS_KEY_ID", "value": "x"}]},
            "looks like a credential",
        ),
        ({"worker.modules": []}, "modules"),
    ],
)
def test_misplaced_settings_are_refused(
    helm: Path, helm_env: dict[str, str], values: dict[str, object], says: str
) -> None:
    assert says in render_fails(helm, helm_env, values)


# -- optional objects --------------------------------------------------------------------------


def test_defaults_render_no_service_monitor_and_no_autoscaler(
    helm: Path, helm_env: dict[str, str]
) -> None:
    kinds = render(helm, helm_env).kinds()
    assert kinds == {
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    }


def test_the_disruption_budget_takes_one_of_its_two_fields(
    helm: Path, helm_env: dict[str, str]
) -> None:
    pdb = render(helm, helm_env).one("PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] == 1 and "minAvailable" not in pdb
    assert (
        pdb["selector"]["matchLabels"]
        == (render(helm, helm_env).one("Deployment")["spec"]["selector"]["matchLabels"])
    )
    by_min = render(
        helm,
        helm_env,
        {"podDisruptionBudget.minAvailable": 1, "podDisruptionBudget.maxUnavailable": None},
    ).one("PodDisruptionBudget")["spec"]
    assert by_min["minAvailable"] == 1 and "maxUnavailable" not in by_min
    both = render_fails(helm, helm_env, {"podDisruptionBudget.minAvailable": 1})
    assert "not both" in both
    off = render(helm, helm_env, {"podDisruptionBudget.enabled": False}).kinds()
    assert "PodDisruptionBudget" not in off


def test_service_monitor_and_autoscaler_when_enabled(helm: Path, helm_env: dict[str, str]) -> None:
    r = render(helm, helm_env, VARIANTS["monitoring-and-autoscaling"])
    assert {"ServiceMonitor", "HorizontalPodAutoscaler"} <= r.kinds()
    deployment = r.one("Deployment")
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    hpa = r.one("HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    monitor = r.one("ServiceMonitor")["spec"]
    assert monitor["endpoints"][0]["port"] == "http"
    assert monitor["endpoints"][0]["path"] == "/metrics"
    assert monitor["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    service_labels = r.one("Service")["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= service_labels.items()


# -- the ConfigMap holds real settings ---------------------------------------------------------


def _known_variables() -> set[str]:
    from perago.coord.factory import OPTIONS

    names = {v for n, f in Settings.model_fields.items() for v in env_names(n, f)}
    names |= {f"PERAGO_COORD_{o.upper()}" for req, opt in OPTIONS.values() for o in (*req, *opt)}
    return names


def test_configmap_names_are_settings_and_load(helm: Path, helm_env: dict[str, str]) -> None:
    # The defaults plus the examples values.yaml gives for `config`.
    examples = {
        "config.PERAGO_COORD_BACKEND": "lakefs",
        "config.PERAGO_SPARK_CONF": '{"spark.driver.memory": "2g"}',
        "config.PERAGO_LEASE_TTL": "30",
        "worker.concurrency": 3,
    }
    for values in ({}, examples):
        r = render(helm, helm_env, values)
        data: dict[str, str] = r.one("ConfigMap")["data"]
        unknown = set(data) - _known_variables()
        assert not unknown, f"the ConfigMap sets variables no setting reads: {sorted(unknown)}"
        env = {**data, "PERAGO_SHUTDOWN_GRACE": r.env["PERAGO_SHUTDOWN_GRACE"]["value"]}
        loaded = config.load(env=env)
        assert loaded.conductor_server_url == "http://conductor-server:8080/api"
        assert loaded.lakefs_endpoint == "http://lakefs:8000"
        assert loaded.concurrency == int(str(values.get("worker.concurrency", 2)))
        assert str(loaded.work_dir) == data["PERAGO_WORK_DIR"]
    assert loaded.spark_conf == {"spark.driver.memory": "2g"}


def test_a_setting_change_rolls_the_pods(helm: Path, helm_env: dict[str, str]) -> None:
    def checksum(values: dict[str, object]) -> str:
        d = render(helm, helm_env, values).one("Deployment")
        return str(d["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"config.PERAGO_LEASE_TTL": "12"})
