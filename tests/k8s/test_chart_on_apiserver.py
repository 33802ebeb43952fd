"""The worker chart against a real Kubernetes API server (`make test-k8s`).

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as processes, built
from pinned Go modules; KWOK plays the nodes and the pods (perago_dev.kube). So the API
server's validation, the Deployment and disruption controllers, the eviction API and the
scheduler are the real ones; no container runs (docs/operations.md says what is checked
where).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from perago_dev.build import build_helm
from perago_dev.kube import Cluster, kwok_cluster

pytestmark = [pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "perago-worker"
NAMESPACE = "workers"
#: What every install sets: credentials the chart requires, an image tag.
BASE = {
    "image.tag": "0.1.0",
    "credentials.lakefs.accessKeyId": "AKIAPERAGOK8STEST0001",
    "credentials.lakefs.secretAccessKey": "k8s-test-secret",
}


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with kwok_cluster("perago-test", nodes=3) as c:
        c.kubectl("create", "namespace", NAMESPACE)
        deadline = time.monotonic() + 60  # the namespace's default ServiceAccount first
        while c.kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode:
            assert time.monotonic() < deadline, "no default ServiceAccount in 60 s"
            time.sleep(0.2)
        yield c


@pytest.fixture(scope="session")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Any:
    binary = build_helm()
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **cluster.env,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }

    def run(*args: str, values: dict[str, object] | None = None, check: bool = True) -> str:
        sets: list[str] = []
        if args[0] in ("install", "upgrade", "template"):
            for key, value in {**BASE, **(values or {})}.items():
                sets += ["--set-json", f"{key}={json.dumps(value)}"]
        done = subprocess.run(
            [str(binary), *args, "--namespace", NAMESPACE, *sets],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if check:
            assert done.returncode == 0, done.stderr
            return done.stdout
        assert done.returncode != 0, f"helm {' '.join(args)} should have failed"
        return done.stderr

    return run


def _documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _deployment(cluster: Cluster, release: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.get("deployment", f"{release}-perago-worker", "-n", NAMESPACE)
    return found


def _worker_pods(cluster: Cluster, release: str) -> list[dict[str, Any]]:
    pods = cluster.get("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={release}")
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [{}, {"autoscaling.enabled": True}, {"podDisruptionBudget.enabled": False}],
    ids=["defaults", "autoscaling", "no-pdb"],
)
def test_every_rendered_manifest_passes_the_api_servers_strict_validation(
    cluster: Cluster, helm: Any, values: dict[str, object]
) -> None:
    """Server-side dry run with strict field validation: the server's own schemas, so an
    unknown or misplaced field, a removed API version or a bad selector fails here."""
    rendered = helm("template", "check", str(CHART), values=values)
    kinds = {d["kind"] for d in _documents(rendered)}
    assert {"Deployment", "Secret", "ConfigMap", "ServiceAccount"} <= kinds
    done = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", NAMESPACE, "-f", "-",
        input=rendered,
    )  # fmt: skip
    assert done.stdout.count("(server dry run)") == len(_documents(rendered))


def test_a_broken_manifest_is_refused_by_the_server(cluster: Cluster, helm: Any) -> None:
    """What `helm lint` lets through and the server does not: an unknown field, and a
    disruption budget with both of its fields (the chart itself refuses to render that)."""
    docs = _documents(helm("template", "broken", str(CHART)))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"][
        "pathh"
    ] = "/readyz"
    refused = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", NAMESPACE, "-f", "-",
        input=yaml.safe_dump(deployment), check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and 'unknown field "spec.template.spec.containers[0]' in (
        refused.stderr
    ), refused.stderr
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    pdb["spec"]["minAvailable"] = 1
    both = cluster.kubectl(
        "apply", "--dry-run=server", "-n", NAMESPACE, "-f", "-",
        input=yaml.safe_dump(pdb), check=False,
    )  # fmt: skip
    assert both.returncode != 0 and "minAvailable" in both.stderr, both.stderr


# -- install, roll out, upgrade ---------------------------------------------------------------


def test_install_waits_for_ready_workers_and_a_rollout_keeps_the_count(
    cluster: Cluster, helm: Any
) -> None:
    """`helm install --wait` returns once the workers are Ready; a new image tag rolls out
    within the chart's strategy (maxSurge 1, maxUnavailable 0): never fewer Ready workers
    than replicas, never more pods than replicas + 1."""
    helm("install", "roll", str(CHART), "--wait", "--timeout", "3m")
    deployment = _deployment(cluster, "roll")
    replicas = deployment["spec"]["replicas"]
    assert deployment["status"].get("readyReplicas") == replicas == 2
    strategy = deployment["spec"]["strategy"]["rollingUpdate"]
    assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (1, 0)

    seen: list[tuple[int, int]] = []  # (pods, ready pods) while rolling out
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            pods = _worker_pods(cluster, "roll")
            seen.append((len(pods), sum(_ready(p) for p in pods)))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        helm("upgrade", "roll", str(CHART), "--wait", "--timeout", "3m",
             values={"image.tag": "0.1.1"})  # fmt: skip
        cluster.kubectl(
            "rollout", "status", "deployment/roll-perago-worker", "-n", NAMESPACE,
            "--timeout=120s",
        )  # fmt: skip
    finally:
        done.set()
        watcher.join(10)
    pods = _worker_pods(cluster, "roll")
    images = {p["spec"]["containers"][0]["image"] for p in pods}
    assert images == {"perago-worker:0.1.1"} and len(pods) == 2
    assert seen, "the watcher saw the rollout"
    assert max(n for n, _ in seen) <= replicas + 1, seen
    assert min(r for _, r in seen) >= replicas, f"fewer Ready workers than replicas: {seen}"
    helm("uninstall", "roll", "--wait")


def test_an_upgrade_changing_values_succeeds_and_an_immutable_field_is_refused(
    cluster: Cluster, helm: Any
) -> None:
    helm("install", "up", str(CHART), "--wait", "--timeout", "3m")
    helm("upgrade", "up", str(CHART), "--wait", "--timeout", "3m",
         values={"worker.concurrency": 4, "replicaCount": 3})  # fmt: skip
    deployment = _deployment(cluster, "up")
    assert deployment["spec"]["replicas"] == 3
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    config = cluster.get("configmap", "-n", NAMESPACE, "-l", "app.kubernetes.io/instance=up")
    assert env or config["items"]
    # The selector of a Deployment is immutable: a chart change that alters it must be
    # refused by the server, not half applied.
    # Same Deployment (fullnameOverride), other selector labels (nameOverride):
    renamed = {"nameOverride": "other", "fullnameOverride": "up-perago-worker"}
    refused = helm("upgrade", "up", str(CHART), values=renamed, check=False)
    assert "field is immutable" in refused, refused
    assert _deployment(cluster, "up")["spec"]["replicas"] == 3, "nothing half applied"
    helm("uninstall", "up", "--wait")


# -- drain, disruption budget, autoscaler -------------------------------------------------------


def test_a_drain_evicts_workers_only_as_the_disruption_budget_allows(
    cluster: Cluster, helm: Any
) -> None:
    """Two workers, maxUnavailable 1, every node cordoned (so an evicted worker's
    replacement stays Pending): the first eviction goes, the second is refused by the
    budget until the replacement may run somewhere."""
    helm("install", "drain", str(CHART), "--wait", "--timeout", "3m")
    pdb = cluster.get("pdb", "drain-perago-worker", "-n", NAMESPACE)
    deadline = time.monotonic() + 60
    while pdb.get("status", {}).get("disruptionsAllowed") != 1:
        assert time.monotonic() < deadline, pdb.get("status")
        time.sleep(0.2)
        pdb = cluster.get("pdb", "drain-perago-worker", "-n", NAMESPACE)
    nodes = [n["metadata"]["name"] for n in cluster.get("nodes")["items"]]
    workers = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in _worker_pods(cluster, "drain")}
    assert len(workers) == 2
    drains = []
    try:
        for node in nodes:
            cluster.kubectl("cordon", node)
        for node in sorted(set(workers.values())):
            drains.append(
                cluster.kubectl(
                    "drain", node, "--pod-selector=app.kubernetes.io/instance=drain",
                    "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=15s",
                    check=False,
                )
            )  # fmt: skip
        left = {p["metadata"]["name"] for p in _worker_pods(cluster, "drain")}
        assert len(left & set(workers)) == 1, "exactly one worker was evicted"
        assert any(d.returncode != 0 for d in drains)
        refusal = " ".join(d.stderr for d in drains)
        assert "disruption budget" in refusal, refusal
        waiting = [
            p for p in _worker_pods(cluster, "drain") if p["metadata"]["name"] not in workers
        ]
        assert waiting and not any(_ready(p) for p in waiting), "its replacement waits"
    finally:
        for node in nodes:
            cluster.kubectl("uncordon", node)
    cluster.kubectl(
        "rollout", "status", "deployment/drain-perago-worker", "-n", NAMESPACE, "--timeout=120s"
    )
    assert sum(_ready(p) for p in _worker_pods(cluster, "drain")) == 2
    helm("uninstall", "drain", "--wait")


def test_the_autoscaler_is_accepted_and_reads_its_target(cluster: Cluster, helm: Any) -> None:
    helm("install", "hpa", str(CHART), "--wait", "--timeout", "3m",
         values={"autoscaling.enabled": True})  # fmt: skip
    deadline = time.monotonic() + 90
    while True:
        hpa = cluster.get("hpa", "hpa-perago-worker", "-n", NAMESPACE)
        conditions = {c["type"]: c for c in hpa.get("status", {}).get("conditions", [])}
        able = conditions.get("AbleToScale")
        if able is not None and able["status"] == "True":
            break
        assert time.monotonic() < deadline, hpa.get("status")
        time.sleep(0.5)
    # it read its target's scale (and set the Deployment, created without replicas, to
    # minReplicas); no metrics server runs here, so it cannot go by CPU
    assert able["reason"] in ("SucceededGetScale", "SucceededRescale"), able
    assert hpa["spec"]["scaleTargetRef"]["name"] == "hpa-perago-worker"
    deadline = time.monotonic() + 60
    while _deployment(cluster, "hpa")["spec"].get("replicas") != 2:  # minReplicas
        assert time.monotonic() < deadline, _deployment(cluster, "hpa")["spec"]
        time.sleep(0.5)
    helm("uninstall", "hpa", "--wait")


# -- the image, run as the pod spec says ---------------------------------------------------------


def test_the_image_runs_as_its_pod_spec_says(
    cluster: Cluster, helm: Any, stack_env: dict[str, str]
) -> None:
    """The worker from the built image (perago_dev.image), started in a chroot with exactly
    the command, environment (ConfigMap and Secret resolved), user, read-only root, emptyDir
    and grace period of a pod the API server made from the chart: it serves every probe's
    path on the probe's port, runs a workflow against the stack, and drains on SIGTERM
    within the pod's terminationGracePeriodSeconds."""
    import os
    import signal
    import sys
    import urllib.request
    import uuid

    from perago.adapters.conductor import ConductorClient
    from perago.adapters.lakefs import LakeFSStore
    from perago.conductor.registry import discover, register
    from perago.config import load
    from perago_dev import image
    from perago_dev.pod import container_process, started
    from perago_dev.s3_stack import free_port

    if os.geteuid() != 0:
        pytest.fail("the image check needs root (debootstrap, mounts, chroot): run as root")
    built = image.current(progress=True)
    port = free_port()
    values: dict[str, object] = {
        "worker.modules": ["workers.smoke.tasks"],
        "http.port": port,
        "conductor.url": stack_env["CONDUCTOR_SERVER_URL"],
        "lakefs.endpoint": stack_env["LAKECTL_SERVER_ENDPOINT_URL"],
        "credentials.lakefs.accessKeyId": stack_env["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"],
        "credentials.lakefs.secretAccessKey": stack_env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"],
        "replicaCount": 1,
    }
    helm("install", "pod", str(CHART), "--wait", "--timeout", "3m", values=values)
    (pod,) = _worker_pods(cluster, "pod")
    selector = "app.kubernetes.io/instance=pod"
    config_maps = cluster.get("configmap", "-n", NAMESPACE, "-l", selector)["items"]
    secrets = cluster.get("secret", "-n", NAMESPACE, "-l", selector)["items"]
    process = container_process(
        pod, config_maps, secrets, entrypoint=image.ENTRYPOINT, image_env=image.IMAGE_ENV
    )
    assert process.argv == ("perago", "worker", "workers.smoke.tasks", "--http-port", str(port))
    assert (process.uid, process.gid, process.read_only_root) == (image.UID, image.UID, True)
    assert process.scratch == ("/tmp",) and process.grace_seconds == 50
    assert (
        process.env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"]
        == values["credentials.lakefs.secretAccessKey"]
    )
    assert {p.port for p in process.probes} == {port}

    settings = load(env=stack_env)
    store, conductor = LakeFSStore(settings), ConductorClient(settings)
    sys.path.insert(0, str(ROOT))
    register(conductor, discover(["workers.smoke.tasks"]))
    conductor.put_workflow_defs([json.loads((ROOT / "workflows" / "smoke.json").read_text())])
    repo = f"k8s-pod-{uuid.uuid4().hex[:8]}"
    store.create_repository(repo)
    log = built.rootfs.parent / "pod-worker.log"

    def answers(path: str, on: int) -> int:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://127.0.0.1:{on}{path}", timeout=3) as r:
                return int(r.status)
        except OSError:
            return 0

    try:
        with started(built.rootfs, process, log) as worker:
            deadline = time.monotonic() + 120
            while not all(answers(p.path, p.port) == 200 for p in process.probes):
                assert worker.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            name = f"pod {uuid.uuid4().hex[:6]}"
            wid = conductor.start_workflow(
                "perago_smoke", {"workspace": {"repository": repo, "branch": "main"}, "name": name}
            )
            deadline = time.monotonic() + 120
            while (wf := conductor.get_workflow(wid)).get("status") == "RUNNING":
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            assert wf.get("status") == "COMPLETED", wf.get("reasonForIncompletion")
            written = [o.path for o in store.list_objects(repo, "main", "smoke/")]
            assert written == [f"smoke/hello-{name}.txt"]
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=process.grace_seconds)  # a kubelet's SIGKILL after it
        text = log.read_text()
        assert code == 0 and '"shutdown_requested"' in text and '"worker_stopped"' in text, text
    finally:
        store.delete_repository(repo)
        helm("uninstall", "pod", "--wait")
