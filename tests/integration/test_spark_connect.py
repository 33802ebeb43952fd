"""Spark Connect for real: the Spark Connect server of `perago dev up --spark` (it carries the
S3A connector's jars fetched at build time), a worker whose session is a Connect client
(`PERAGO_SPARK_MASTER=sc://...`), an in-place task through it, the mode rule, and a drain that
interrupts only the attempt's own jobs."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .harness import attempts, one_step, publications, start, wait_workflow, worker

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.serial]
MODULE = "tests.integration.taskmods.spark_tasks"


@pytest.fixture
def connect_server(spark_cluster: dict[str, str]) -> str:
    """The Spark Connect server of the stack's cluster (it carries the S3A jars)."""
    return spark_cluster["SPARK_CONNECT_URL"]


def test_an_in_place_task_runs_through_spark_connect_and_a_local_one_is_refused(
    make_env: Callable[..., dict[str, str]],
    connect_server: str,
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = make_env(MODULE, PERAGO_SPARK_MASTER=connect_server)
    src = tmp_path / "in.csv"
    src.write_text("n,name\n" + "".join(f"{i},row{i}\n" for i in range(1, 51)))
    store.upload(repo, "main", "spark/in/part-0.csv", src)
    seed = store.commit(repo, "main", message="seed", metadata={}).id
    in_place, local = f"cx_in_{unique}", f"cx_local_{unique}"
    one_step(conductor, in_place, f"ps_inplace_{unique}", {})
    one_step(conductor, local, f"ps_local_{unique}", {})
    with worker(env, tmp_path / "w.log", module=MODULE) as w:
        wf = wait_workflow(conductor, start(conductor, in_place, repo), timeout=300)
        refused = wait_workflow(conductor, start(conductor, local, repo), timeout=120)
        started = w.wait_for("spark_session_started")
    assert started["connect"] is True and started["master"] == connect_server
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    assert attempts(wf, "step")[-1]["outputData"]["result"] == {"rows": 50}
    out = wf["output"]["workspace"]["ref"]
    assert any(o.path.endswith(".parquet") for o in store.list_objects(repo, out, "spark/out/"))
    assert [c.id for c in publications(store, repo)] == [out]
    assert store.get_commit(repo, out).parents[0] == seed
    (step,) = attempts(refused, "step")
    assert step["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert "in_place=True" in step["reasonForIncompletion"]


def test_a_drain_interrupts_its_own_spark_jobs_and_no_one_else_s(
    make_env: Callable[..., dict[str, str]],
    connect_server: str,
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Two workers share one Connect server; SIGTERM on one: after its grace, its attempt's
    jobs (tagged with its task id) are interrupted and it reports the shutdown; the other
    worker's job runs on to the end."""
    env = make_env(MODULE, PERAGO_SPARK_MASTER=connect_server, PERAGO_SHUTDOWN_GRACE="2")
    name = f"cx_slow_{unique}"
    one_step(conductor, name, f"ps_slow_{unique}", {"rows": "${workflow.input.rows}"})
    with worker(env, tmp_path / "a.log", module=MODULE) as a:
        drained = start(conductor, name, repo, rows=100_000)  # would run for hours
        a.wait_for("pre_guardrails_passed")
        with worker(env, tmp_path / "b.log", module=MODULE) as b:
            other = start(conductor, name, repo, rows=240)  # about 12 s
            b.wait_for("pre_guardrails_passed")
            time.sleep(3)  # both jobs are running on the server
            a.signal(signal.SIGTERM)
            assert a.proc.wait(timeout=60) == 0
            interrupted = a.wait_for("spark_jobs_interrupted")
            finished = wait_workflow(conductor, other, timeout=180)
    first = attempts(conductor.get_workflow(drained), "step")[0]
    assert interrupted["task_id"] == first["taskId"]
    assert first["status"] == "FAILED" and "shutdown" in first["reasonForIncompletion"]
    assert finished["status"] == "COMPLETED", finished.get("reasonForIncompletion")
    assert attempts(finished, "step")[-1]["outputData"]["result"] == {"rows": 240}
    conductor.terminate_workflow(drained, "test done")
