"""The local stack itself: both servers, the SDKs against them, Spark, and `perago dev`.

These run first (module name) and prove the real parts the rest of the suite relies on.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import lakefs_sdk
import pytest
from conductor.client.configuration.configuration import Configuration
from conductor.client.http.api.metadata_resource_api import MetadataResourceApi
from conductor.client.http.api.task_resource_api import TaskResourceApi
from conductor.client.http.api.workflow_resource_api import WorkflowResourceApi
from conductor.client.http.api_client import ApiClient
from conductor.client.http.models import (
    StartWorkflowRequest,
    TaskDef,
    TaskResult,
    WorkflowDef,
    WorkflowTask,
)

from perago.dev import stack

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_both_servers_answer_health_checks(stack_env: dict[str, str]) -> None:
    states = stack.status()
    assert states["lakefs"].running and states["lakefs"].healthy
    assert states["conductor"].running and states["conductor"].healthy


def test_lakefs_sdk_repository_branch_upload_commit_merge_reset(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    cfg = lakefs_sdk.Configuration(
        host=stack_env["LAKECTL_SERVER_ENDPOINT_URL"] + "/api/v1",
        username=stack_env["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"],
        password=stack_env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"],
    )
    with lakefs_sdk.ApiClient(cfg) as client:
        repos, branches = lakefs_sdk.RepositoriesApi(client), lakefs_sdk.BranchesApi(client)
        objects, commits = lakefs_sdk.ObjectsApi(client), lakefs_sdk.CommitsApi(client)
        refs, experimental = lakefs_sdk.RefsApi(client), lakefs_sdk.ExperimentalApi(client)
        name = "stack-" + uuid.uuid4().hex[:8]
        repos.create_repository(
            lakefs_sdk.RepositoryCreation(name=name, storage_namespace=f"local://{name}")
        )
        try:
            base = branches.get_branch(name, "main").commit_id
            branches.create_branch(name, lakefs_sdk.BranchCreation(name="feature", source="main"))
            (tmp_path / "a.txt").write_bytes(b"hello")
            objects.upload_object(name, "feature", "a.txt", content=str(tmp_path / "a.txt"))
            c = commits.commit(name, "feature", lakefs_sdk.CommitCreation(message="add a"))
            assert c.parents == [base]
            merged = refs.merge_into_branch(
                name, "feature", "main", merge=lakefs_sdk.Merge(message="m")
            ).reference
            merge_commit = commits.get_commit(name, merged)
            assert merge_commit.parents == [base, c.id]  # never a fast-forward
            assert bytes(objects.get_object(name, "main", "a.txt")) == b"hello"
            experimental.hard_reset_branch(name, "main", base)
            assert branches.get_branch(name, "main").commit_id == base
        finally:
            repos.delete_repository(name)


def test_conductor_sdk_register_start_poll_complete(stack_env: dict[str, str]) -> None:
    client = ApiClient(Configuration(server_api_url=stack_env["CONDUCTOR_SERVER_URL"]))
    metadata, workflows, tasks = (
        MetadataResourceApi(client),
        WorkflowResourceApi(client),
        TaskResourceApi(client),
    )
    suffix = uuid.uuid4().hex[:8]
    task_name, wf_name = f"stack_task_{suffix}", f"stack_wf_{suffix}"
    metadata.register_task_def(
        [TaskDef(name=task_name, timeout_seconds=60, response_timeout_seconds=30)]
    )
    metadata.update1(
        [
            WorkflowDef(
                name=wf_name,
                version=1,
                owner_email="perago@example.com",
                timeout_seconds=60,
                tasks=[WorkflowTask(name=task_name, task_reference_name="only", type="SIMPLE")],
            )
        ]
    )
    wid = workflows.start_workflow(StartWorkflowRequest(name=wf_name, version=1, input={"x": 1}))
    deadline = time.monotonic() + 30
    polled = []
    while not polled and time.monotonic() < deadline:
        polled = tasks.batch_poll(task_name, workerid="stack-test", count=1, timeout=500) or []
    assert polled, "no task was handed out"
    t = polled[0]
    tasks.update_task(
        TaskResult(
            workflow_instance_id=wid,
            task_id=t.task_id,
            status="COMPLETED",
            output_data={"ok": True},
            worker_id="stack-test",
        )
    )
    while time.monotonic() < deadline:
        wf = workflows.get_execution_status(wid, include_tasks=False)
        if wf.status == "COMPLETED":
            break
        time.sleep(0.3)
    assert wf.status == "COMPLETED"


@pytest.mark.spark
def test_spark_local_session_writes_and_reads_parquet(tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("perago-stack-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    try:
        spark.range(1000).selectExpr("id", "id * 2 AS twice").write.parquet(str(tmp_path / "p"))
        back = spark.read.parquet(str(tmp_path / "p"))
        assert back.count() == 1000
        assert back.agg({"twice": "sum"}).collect()[0][0] == 999 * 1000
    finally:
        spark.stop()


def test_dev_env_makes_lakectl_work(stack_env: dict[str, str]) -> None:
    done = subprocess.run(
        ["bash", "-c", f'eval "$({ROOT}/.venv/bin/perago dev env)" && lakectl repo list'],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("LAKECTL_")},
    )
    assert done.returncode == 0, done.stderr


def test_zz_down_leaves_nothing_then_up_again(stack_env: dict[str, str]) -> None:
    """Runs last in this module: the other modules find the stack up again afterwards."""
    if os.environ.get("PERAGO_TEST_STACK_FROM_ENV"):
        pytest.skip("the stack was given from the environment; it is not ours to stop")
    stack_dir = str(stack.info().stack_dir)
    assert set(stack.down()) == {"lakefs", "conductor"}
    leftovers = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if stack_dir in cmd:
                leftovers.append(cmd)
    assert leftovers == []
    assert not any(s.running for s in stack.status().values())
    stack.up()
    assert all(s.healthy for s in stack.status().values())
