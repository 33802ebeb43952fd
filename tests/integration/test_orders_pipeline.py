"""The example pipeline through Conductor with real Spark, and Spark on a standalone cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.workspace import upload_all
from workers.orders.data import generate_orders

from .harness import (
    ROOT,
    attempts,
    free_port,
    one_step,
    publications,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROWS = int(os.environ.get("PERAGO_PIPELINE_ROWS", "20000"))


def test_orders_pipeline_end_to_end(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    tmp_path: Path,
) -> None:
    env = make_env("workers.orders.tasks", PERAGO_SPARK_MASTER="local[2]")
    conductor.put_workflow_defs(
        [json.loads((ROOT / "workflows" / "orders_pipeline.json").read_text())]
    )
    gen = generate_orders(tmp_path / "seed", rows=ROWS)
    upload_all(store, repo, "main", "orders/", tmp_path / "seed", list(gen.files), parallelism=4)
    seed = store.commit(repo, "main", message="seed", metadata={}).id
    with worker(env, tmp_path / "w.log", module="workers.orders.tasks") as w:
        wf, again = (
            wait_workflow(
                conductor,
                conductor.start_workflow(
                    "orders_pipeline", {"workspace": {"repository": repo, "branch": "main"}}
                ),
                timeout=600,
            )
            for _ in range(2)
        )
        renamed = [e for e in w.events() if e.get("event") == "only_renamed_same_bytes"]
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    out = wf["output"]
    assert out["clean"]["rows_in"] == ROWS
    assert out["clean"]["bad_rows"] == gen.bad_rows
    assert out["clean"]["rows_out"] == ROWS - gen.bad_rows
    assert out["revenue"]["rows_in"] == ROWS - gen.bad_rows
    assert out["report"]["passed"] is True
    clean_ref = attempts(wf, "clean")[-1]["outputData"]["workspace"]["ref"]
    revenue_ref = attempts(wf, "revenue")[-1]["outputData"]["workspace"]["ref"]
    assert (
        out["workspace"]["ref"] == revenue_ref == store.branch_head(repo, "main")
    )  # report: read-only
    partitions = {
        o.path.split("/")[2] for o in store.list_objects(repo, clean_ref, "orders/clean/")
    }
    assert len(partitions) == out["clean"]["partitions"] == 30
    assert all(p.startswith("order_date=") for p in partitions)
    pubs = publications(store, repo)
    assert [c.metadata["perago.task_ref"] for c in pubs] == ["revenue", "clean"]
    assert pubs[-1].parents[0] == seed and pubs[0].parents[0] == clean_ref
    assert staging_branches(store, repo) == []

    # The second run over the same input, on the same worker (its Spark JVM): the same bytes
    # under new random part names, which publishes nothing (renames_are_noops).
    assert again["status"] == "COMPLETED", again.get("reasonForIncompletion")
    assert store.branch_head(repo, "main") == revenue_ref
    assert len(publications(store, repo)) == 2
    assert {e["task_type"] for e in renamed} == {"orders_clean", "orders_daily_revenue"}

    # A third run after a restart: another worker, another JVM, whose Parquet footers list
    # encodings in another order. Still nothing published (perago.workspace.parquet).
    with worker(env, tmp_path / "w2.log", module="workers.orders.tasks") as fresh:
        third = wait_workflow(
            conductor,
            conductor.start_workflow(
                "orders_pipeline", {"workspace": {"repository": repo, "branch": "main"}}
            ),
            timeout=600,
        )
        renamed = [e for e in fresh.events() if e.get("event") == "only_renamed_same_bytes"]
    assert third["status"] == "COMPLETED", third.get("reasonForIncompletion")
    assert store.branch_head(repo, "main") == revenue_ref
    assert len(publications(store, repo)) == 2  # commits per run: 2, 0, 0
    assert {e["task_type"] for e in renamed} == {"orders_clean", "orders_daily_revenue"}


@pytest.fixture
def standalone_master(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and one worker on 127.0.0.1, from the pyspark distribution."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    port = free_port()
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOG_DIR": str(tmp_path),
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
    }
    logs = [(tmp_path / f"{n}.log").open("w") for n in ("master", "worker")]
    master = subprocess.Popen(
        [
            str(spark_class),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        ],
        env=env,
        stdout=logs[0],
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"spark://127.0.0.1:{port}"
    spark_worker = subprocess.Popen(
        [
            str(spark_class),
            "org.apache.spark.deploy.worker.Worker",
            url,
            "--host",
            "127.0.0.1",
            "--webui-port",
            str(free_port()),
            "--cores",
            "2",
            "--memory",
            "1g",
        ],
        env=env,
        stdout=logs[1],
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while "Registering worker" not in (tmp_path / "master.log").read_text():
        assert time.monotonic() < deadline, (tmp_path / "master.log").read_text()[-2000:]
        time.sleep(0.5)
    try:
        yield url
    finally:
        for p in (spark_worker, master):
            os.killpg(p.pid, 15)
            p.wait(timeout=30)
        for f in logs:
            f.close()


def test_spark_task_on_a_standalone_cluster(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    standalone_master: str,
) -> None:
    module = "tests.integration.taskmods.spark_tasks"
    env = make_env(module, PERAGO_SPARK_MASTER=standalone_master, PYSPARK_PYTHON=sys.executable)
    src = tmp_path / "in.csv"
    src.write_text("n,name\n" + "".join(f"{i},row{i}\n" for i in range(1, 101)))
    store.upload(repo, "main", "spark/in/part-0.csv", src)
    store.commit(repo, "main", message="seed", metadata={})
    local, in_place = f"ps_cluster_{unique}", f"ps_cluster_inplace_{unique}"
    one_step(conductor, local, f"ps_local_{unique}", {})
    one_step(conductor, in_place, f"ps_inplace_{unique}", {})
    with worker(env, tmp_path / "w.log", module=module) as w:
        # A local-projection task would hand the executors this worker's paths: refused.
        refused = wait_workflow(conductor, start(conductor, local, repo), timeout=300)
        # In place, the executors read and write through lakeFS's S3 gateway themselves.
        wf = wait_workflow(conductor, start(conductor, in_place, repo), timeout=300)
        started = w.wait_for("spark_session_started")
        # A drained worker stops its session: the cluster's two cores are free for the next one.
        assert w.stop() == 0
    master_log = tmp_path / "master.log"
    assert "Removing app" in master_log.read_text(), master_log.read_text()[-3000:]
    assert started["master"] == standalone_master
    assert started["master_from"] == "PERAGO_SPARK_MASTER"
    (step,) = attempts(refused, "step")
    assert step["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert "in_place=True" in step["reasonForIncompletion"]
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    assert attempts(wf, "step")[-1]["outputData"]["result"] == {"rows": 100}
    ref = wf["output"]["workspace"]["ref"]
    assert any(o.path.endswith(".parquet") for o in store.list_objects(repo, ref, "spark/out/"))

    # Every process of this cluster runs on this machine, sharing its disk: declared so, the
    # local-projection task runs there too.
    shared = {**env, "PERAGO_SPARK_SHARED_FILESYSTEM": "true"}
    with worker(shared, tmp_path / "w2.log", module=module):
        try:
            again = wait_workflow(conductor, start(conductor, local, repo), timeout=300)
        except AssertionError as e:
            logs = (tmp_path / "w2.log", master_log)
            tails = (f"{p.name}:\n{p.read_text()[-4000:]}" for p in logs)
            raise AssertionError("\n".join((str(e), *tails))) from None
    assert again["status"] == "COMPLETED", again.get("reasonForIncompletion")
