"""The local stack's Spark cluster (`perago dev up --spark`): a standalone master with two
workers and a Spark Connect server on it. An in-place task through Connect runs on both
executors; an executor SIGKILLed in the middle of a job costs Spark a task retry, not the
attempt: the attempt completes and publishes once."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .harness import attempts, one_step, publications, start, wait_workflow, worker

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.serial]
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


def test_an_executor_killed_mid_job_costs_a_spark_task_retry_not_the_attempt(
    spark_cluster: dict[str, str],
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    assert spark_cluster["SPARK_CONNECT_URL"].startswith("sc://127.0.0.1:")
    env = make_env(MODULE, PERAGO_SPARK_MASTER=spark_cluster["SPARK_CONNECT_URL"])
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


@pytest.mark.parametrize("via", ["connect", "standalone"])
def test_the_orders_pipeline_in_place_on_the_cluster(
    via: str,
    spark_cluster: dict[str, str],
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    tmp_path: Path,
) -> None:
    """The example pipeline in place (workers.orders.remote) with its executors on the
    cluster's two workers: through the Connect server, or with the standalone master (the
    driver in the worker process). Same results as the local pipeline; each writing step
    publishes once; the report writes nothing and publishes nothing. Then one day's summary
    in place with two named inputs (its partition and the customers dimension), read by the
    executors at the commit the attempt resolved."""
    import json
    import sys

    from perago._api.inputs import ResolvedInput
    from perago.workspace import upload_all
    from workers.orders.data import generate_customers, generate_orders

    from .harness import ROOT

    master = spark_cluster["SPARK_CONNECT_URL" if via == "connect" else "SPARK_MASTER_URL"]
    module = "workers.orders.remote"
    env = make_env(module, PERAGO_SPARK_MASTER=master, PYSPARK_PYTHON=sys.executable)
    workflow = json.loads((ROOT / "workflows" / "orders_pipeline_remote.json").read_text())
    conductor.put_workflow_defs([workflow])
    gen = generate_orders(tmp_path / "seed", rows=5000)
    upload_all(store, repo, "main", "orders/", tmp_path / "seed", list(gen.files), parallelism=4)
    customers = generate_customers(tmp_path / "dims")
    store.upload(repo, "main", "dims/customers/customers.csv", customers)
    seed = store.commit(repo, "main", message="seed", metadata={}).id
    with worker(env, tmp_path / "w.log", module=module) as w:
        wid = conductor.start_workflow(
            "orders_pipeline_remote", {"workspace": {"repository": repo, "branch": "main"}}
        )
        wf = wait_workflow(conductor, wid, timeout=600)
        started = w.wait_for("spark_session_started")
        day = sorted(wf["output"]["clean"]["days"])[0]
        summary_wf = one_step(
            conductor, f"day_remote_{repo}", "orders_day_summary_remote", {"day": day}
        )
        day_wid = start(conductor, summary_wf, repo)
        day_run = wait_workflow(conductor, day_wid, timeout=300)
    assert started["master"] == master
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    out = wf["output"]
    assert out["clean"]["rows_in"] == gen.rows
    assert out["clean"]["bad_rows"] == gen.bad_rows
    assert out["clean"]["partitions"] == 30
    assert out["revenue"]["rows_in"] == gen.rows - gen.bad_rows
    assert out["report"]["passed"] is True, out["report"]
    assert out["report"]["clean_rows"] == gen.rows - gen.bad_rows
    revenue_ref = attempts(wf, "revenue")[-1]["outputData"]["workspace"]["ref"]
    assert out["workspace"]["ref"] == revenue_ref
    pubs = publications(store, repo)[1:]  # the newest is the day summary's, checked below
    assert len(pubs) == 2, "clean and revenue publish once each; the report publishes nothing"
    assert pubs[-1].parents[0] == seed
    days = {o.path.split("/")[2] for o in store.list_objects(repo, revenue_ref, "orders/clean/")}
    assert len([d for d in days if d.startswith("order_date=")]) == 30
    assert any(
        o.path.endswith(".parquet")
        for o in store.list_objects(repo, revenue_ref, "orders/revenue/daily/")
    )
    assert day_run["status"] == "COMPLETED", day_run.get("reasonForIncompletion")
    day_out = attempts(day_run, "step")[-1]["outputData"]
    assert day_out["inputs"]["orders"]["commit"] == revenue_ref
    assert day_out["inputs"]["customers"]["prefix"] == "dims/customers/"
    assert 0 < day_out["result"]["orders"] < gen.rows
    assert set(day_out["result"]["revenue_by_region"]) <= {
        "north",
        "south",
        "east",
        "west",
        "unknown",
    }
    day_commit = store.get_commit(repo, day_out["workspace"]["ref"])
    assert day_commit.id == store.branch_head(repo, "main")
    assert day_commit.parents[0] == revenue_ref
    assert ResolvedInput.from_metadata(day_commit.metadata) == {
        "customers": f"{repo}@{revenue_ref}/dims/customers/",
        "orders": f"{repo}@{revenue_ref}/orders/clean/order_date={day}/",
    }
    written = list(store.list_objects(repo, day_commit.id, f"orders/summaries/day={day}/"))
    assert any(o.path.endswith(".txt") for o in written), written


def test_raw_orders_generated_on_the_cluster_have_every_kind_of_bad_row(
    spark_cluster: dict[str, str],
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """``orders_generate_remote`` (the benchmark's data at any size) writes CSV with the
    columns of ``workers.orders.data`` and about 2% bad rows of its five kinds."""
    import csv
    import io
    import sys

    env = make_env(
        "workers.orders.remote",
        PERAGO_SPARK_MASTER=spark_cluster["SPARK_CONNECT_URL"],
        PYSPARK_PYTHON=sys.executable,
    )
    name = f"cl_generate_{unique}"
    one_step(conductor, name, "orders_generate_remote", {"rows": 20000, "files": 2})
    with worker(env, tmp_path / "w.log", module="workers.orders.remote"):
        wf = wait_workflow(conductor, start(conductor, name, repo), timeout=300)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    ref = wf["output"]["workspace"]["ref"]
    rows = []
    for o in store.list_objects(repo, ref, "orders/raw/"):
        if o.path.endswith(".csv"):
            buf = io.BytesIO()
            store.download(repo, ref, o.path, buf)
            rows += list(csv.DictReader(io.StringIO(buf.getvalue().decode())))
    assert len(rows) == 20000
    assert len({r["order_id"] for r in rows}) == 20000
    kinds = {
        "missing_customer": sum(r["customer_id"] == "" for r in rows),
        "bad_amount": sum(r["amount"] == "n/a" for r in rows),
        "negative_amount": sum(r["amount"].startswith("-") for r in rows),
        "bad_date": sum(r["order_date"] == "2026-13-45" for r in rows),
        "bad_currency": sum(r["currency"] != "EUR" for r in rows),
    }
    assert all(n > 0 for n in kinds.values()), kinds
    assert 0.01 * 20000 < sum(kinds.values()) < 0.03 * 20000, kinds
    assert len({r["order_date"] for r in rows}) == 31  # 30 days and the bad date
