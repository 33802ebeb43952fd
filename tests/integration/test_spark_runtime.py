"""Spark task bodies through real workers: local projection, in place (S3 gateway), failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from .harness import (
    attempts,
    publications,
    put_workflow,
    simple_task,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]
MODULE = "tests.integration.taskmods.spark_tasks"


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(
        MODULE,
        PERAGO_SPARK_MASTER="local[2]",
        PERAGO_SPARK_CONF='{"spark.sql.shuffle.partitions": "2"}',
    )


@pytest.fixture
def seeded(store: LakeFSStore, repo: str, tmp_path: Path) -> str:
    src = tmp_path / "in.csv"
    src.write_text("n,name\n" + "".join(f"{i},row{i}\n" for i in range(1, 251)))
    store.upload(repo, "main", "spark/in/part-0.csv", src)
    return store.commit(repo, "main", message="seed", metadata={}).id


def _run(
    conductor: ConductorClient,
    env: dict[str, str],
    tmp_path: Path,
    task_type: str,
    repo: str,
    params: dict[str, object],
) -> dict[str, object]:
    name = f"{task_type}_wf"
    put_workflow(
        conductor, name, [simple_task(task_type, "step", "${workflow.input.workspace}", params)]
    )
    with worker(env, tmp_path / "w.log", module=MODULE):
        return wait_workflow(
            conductor,
            start(conductor, name, repo),
            timeout=300,
        )


@pytest.mark.parametrize("kind", ["local", "inplace"])
def test_spark_body_output_is_published(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    seeded: str,
    kind: str,
) -> None:
    wf = _run(conductor, env, tmp_path, f"ps_{kind}_{unique}", repo, {})
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    out = wf["output"]["workspace"]["ref"]  # type: ignore[index]
    assert attempts(wf, "step")[-1]["outputData"]["result"] == {"rows": 250}
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.id == out and head.parents[0] == seeded
    parquet = [
        o.path for o in store.list_objects(repo, out, "spark/out/") if o.path.endswith(".parquet")
    ]
    assert parquet, "no parquet files were published"
    assert [c.id for c in publications(store, repo)] == [out]
    assert staging_branches(store, repo) == []


@pytest.mark.parametrize("kind", ["local", "inplace"])
def test_failed_spark_job_publishes_nothing(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    seeded: str,
    kind: str,
) -> None:
    wf = _run(conductor, env, tmp_path, f"ps_{kind}_{unique}", repo, {"fail": True})
    assert wf["status"] == "FAILED"
    steps = attempts(wf, "step")
    assert all(t["status"] == "FAILED" for t in steps) and len(steps) == 2
    assert "task body" in steps[0]["reasonForIncompletion"]
    assert store.branch_head(repo, "main") == seeded
    assert publications(store, repo) == []
    assert staging_branches(store, repo) == []
