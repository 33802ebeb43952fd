"""The local stack's Spark cluster (`perago dev up --spark`): a standalone master with two
workers and a Spark Connect server on it. An in-place task through Connect runs on both
executors; an executor SIGKILLed in the middle of a job costs Spark a task retry, not the
attempt: the attempt completes and publishes once."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import attempts, one_step, perago_cli, publications, start, wait_workflow, worker

pytestmark = [pytest.mark.integration, pytest.mark.spark]
MODULE = "tests.integration.taskmods.spark_tasks"


def _executors() -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes()
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in argv:
            found.append(int(cmdline.parent.name))
    return found


@pytest.fixture(scope="module")
def cluster(stack_env: dict[str, str]) -> Iterator[dict[str, str]]:
    up = perago_cli(["dev", "up", "--spark"], stack_env, timeout=300)
    assert up.returncode == 0, up.stderr
    env = perago_cli(["dev", "env"], stack_env)
    exported = dict(
        line.removeprefix("export ").split("=", 1)
        for line in env.stdout.splitlines()
        if line.startswith("export SPARK_")
    )
    yield {k: v.strip("'") for k, v in exported.items()}
    down = perago_cli(["dev", "down", "--spark"], stack_env)
    assert down.returncode == 0 and "spark-master" in down.stdout, down.stdout


def test_an_executor_killed_mid_job_costs_a_spark_task_retry_not_the_attempt(
    cluster: dict[str, str],
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    assert cluster["SPARK_CONNECT_URL"].startswith("sc://127.0.0.1:")
    env = make_env(MODULE, PERAGO_SPARK_MASTER=cluster["SPARK_CONNECT_URL"])
    name = f"cl_slow_{unique}"
    one_step(conductor, name, f"ps_slow_{unique}", {"rows": 200, "write": True})
    with worker(env, tmp_path / "w.log", module=MODULE) as w:
        wid = start(conductor, name, repo)
        w.wait_for("pre_guardrails_passed")
        deadline = time.monotonic() + 60
        while len(_executors()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        executors = _executors()
        assert len(executors) == 2, "the job should run on both workers' executors"
        time.sleep(3)  # inside the job
        os.kill(executors[0], signal.SIGKILL)
        wf = wait_workflow(conductor, wid, timeout=240)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    assert [t["status"] for t in attempts(wf, "step")] == ["COMPLETED"]
    out = wf["output"]["workspace"]["ref"]
    assert [c.id for c in publications(store, repo)] == [out]
    parquet = [
        o for o in store.list_objects(repo, out, "spark/slow/") if o.path.endswith(".parquet")
    ]
    assert parquet
