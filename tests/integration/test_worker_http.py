"""The worker's probes and metrics, served by a real worker process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from .harness import (
    WorkerProcess,
    free_port,
    http_get,
    one_step,
    put_workflow,
    register_tasks,
    simple_task,
    start,
    wait_workflow,
)

pytestmark = pytest.mark.integration


def test_probes_and_metrics(
    stack_env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = {
        **stack_env,
        "PERAGO_TEST_SUFFIX": unique,
        "PERAGO_WORK_DIR": str(tmp_path / "w"),
        "PERAGO_SHUTDOWN_GRACE": "20",
    }
    register_tasks(env)
    name = f"pt_wf_http_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", {"files": {"m.txt": "m"}})
    port = free_port()
    w = WorkerProcess(env, tmp_path / "w.log", extra_args=["--http-port", str(port)])
    try:
        w.wait_for("http_endpoints_started")
        base = f"http://127.0.0.1:{port}"
        assert http_get(base + "/healthz")[0] == 200
        assert http_get(base + "/readyz") == (200, "ready\n")
        wf = wait_workflow(
            conductor,
            start(conductor, name, repo),
        )
        assert wf["status"] == "COMPLETED"
        # the attempt thread leaves the in-flight gauge just after reporting: wait for it
        for _ in range(100):
            status, text = http_get(base + "/metrics")
            if "perago_attempts_in_flight 0.0" in text:
                break
            time.sleep(0.1)
        assert status == 200
        assert f'perago_attempts_total{{status="COMPLETED",task="pt_write_{unique}"}} 1.0' in text
        assert 'perago_files_total{direction="upload"} 1.0' in text
        assert "perago_publish_seconds_count" in text and "perago_attempts_in_flight 0.0" in text
        assert unique + "-" not in text and wf["workflowId"] not in text  # no ids as labels
        # draining: not ready any more while an attempt finishes
        slow = f"pt_wf_http_slow_{unique}"
        put_workflow(
            conductor,
            slow,
            [
                simple_task(
                    f"pt_write_{unique}",
                    "step",
                    "${workflow.input.workspace}",
                    {"files": {"s.txt": "s"}, "sleep": 4},
                )
            ],
        )
        wid = conductor.start_workflow(slow, {"workspace": {"repository": repo, "branch": "main"}})
        w.wait_for("pre_guardrails_passed", workflow_id=wid)
        w.signal(__import__("signal").SIGTERM)
        w.wait_for("shutdown_requested")
        assert http_get(base + "/readyz") == (503, "draining\n")
        assert http_get(base + "/healthz")[0] == 200
        assert w.proc.wait(timeout=60) == 0
        assert wait_workflow(conductor, wid)["status"] == "COMPLETED"
    finally:
        w.close()
