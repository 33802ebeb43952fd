"""The local stack itself: both servers, the SDKs against them, Spark, and `perago dev`.

Everything here runs against the real processes ``perago dev up`` starts; the last test stops
the stack and starts it again (alone: it is marked ``serial``), leaving it up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
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

from perago.config import Settings
from perago.errors import PeragoError, StackError
from perago_dev import stack

pytestmark = pytest.mark.integration

PERAGO = Path(sys.executable).parent / "perago"


def _start_stack() -> stack.StackInfo:
    try:
        return stack.up()
    except StackError as e:
        if os.environ.get("CI"):
            pytest.fail(f"the local stack did not start: {e.message}")
        pytest.skip(f"the local stack is not available ({e.message}); see docs/local-stack.md")


@pytest.fixture(scope="module")
def info(stack_env: dict[str, str]) -> stack.StackInfo:
    return _start_stack()


@pytest.fixture
def lakefs(info: stack.StackInfo) -> Iterator[lakefs_sdk.ApiClient]:
    cfg = lakefs_sdk.Configuration(
        host=f"{info.lakefs_endpoint}/api/v1",
        username=info.access_key_id,
        password=info.secret_access_key,
    )
    with lakefs_sdk.ApiClient(cfg) as client:
        yield client


def _repo_name() -> str:
    return "stack-" + uuid.uuid4().hex[:10]


def _namespace(name: str) -> str:
    """Where a repository's data goes on the running profile's blockstore."""
    return f"s3://perago-data/{name}" if stack.info().profile == "production" else f"local://{name}"


def test_both_servers_answer_health_checks(info: stack.StackInfo) -> None:
    states = stack.status()
    assert tuple(states) == stack.PROFILES[info.profile]
    assert all((s.running, s.healthy) == (True, True) for s in states.values()), states
    assert states["lakefs"].url == info.lakefs_endpoint
    assert states["conductor"].url == info.conductor_url
    assert all(s.pid is not None for s in states.values())


def test_up_again_reuses_the_running_stack(info: stack.StackInfo) -> None:
    pids = {name: s.pid for name, s in stack.status().items()}
    started = time.monotonic()
    assert stack.up() == info
    assert time.monotonic() - started < 10
    assert {name: s.pid for name, s in stack.status().items()} == pids


def test_lakefs_repository_branch_upload_commit_merge_reset(
    lakefs: lakefs_sdk.ApiClient, tmp_path: Path
) -> None:
    repos, branches = lakefs_sdk.RepositoriesApi(lakefs), lakefs_sdk.BranchesApi(lakefs)
    objects, commits = lakefs_sdk.ObjectsApi(lakefs), lakefs_sdk.CommitsApi(lakefs)
    refs, experimental = lakefs_sdk.RefsApi(lakefs), lakefs_sdk.ExperimentalApi(lakefs)
    name = _repo_name()
    repos.create_repository(
        lakefs_sdk.RepositoryCreation(name=name, storage_namespace=_namespace(name))
    )
    try:
        base = branches.get_branch(name, "main").commit_id
        branches.create_branch(name, lakefs_sdk.BranchCreation(name="feature", source="main"))
        assert branches.get_branch(name, "feature").commit_id == base

        (tmp_path / "a.txt").write_bytes(b"hello")
        objects.upload_object(name, "feature", "a.txt", content=str(tmp_path / "a.txt"))
        added = commits.commit(name, "feature", lakefs_sdk.CommitCreation(message="add a"))
        assert added.parents == [base]
        assert branches.get_branch(name, "feature").commit_id == added.id

        merge = lakefs_sdk.Merge(message="merge feature")
        merged = refs.merge_into_branch(name, "feature", "main", merge=merge).reference
        assert branches.get_branch(name, "main").commit_id == merged
        assert commits.get_commit(name, merged).parents == [base, added.id]
        assert bytes(objects.get_object(name, "main", "a.txt")) == b"hello"

        # lakefs-sdk 1.88 serves hard reset from ExperimentalApi (not BranchesApi)
        experimental.hard_reset_branch(name, "main", base)
        assert branches.get_branch(name, "main").commit_id == base
        assert branches.get_branch(name, "feature").commit_id == added.id
    finally:
        repos.delete_repository(name)


def test_conductor_register_start_poll_complete(info: stack.StackInfo) -> None:
    client = ApiClient(Configuration(server_api_url=info.conductor_url))
    metadata, workflows = MetadataResourceApi(client), WorkflowResourceApi(client)
    tasks = TaskResourceApi(client)
    suffix = uuid.uuid4().hex[:10]
    task_name, wf_name = f"stack_task_{suffix}", f"stack_wf_{suffix}"
    metadata.register_task_def(
        [TaskDef(name=task_name, timeout_seconds=120, response_timeout_seconds=60)]
    )
    metadata.update1(
        [
            WorkflowDef(
                name=wf_name,
                version=1,
                owner_email="perago@example.com",
                timeout_seconds=120,
                tasks=[
                    WorkflowTask(
                        name=task_name,
                        task_reference_name="only",
                        type="SIMPLE",
                        input_parameters={"x": "${workflow.input.x}"},
                    )
                ],
            )
        ]
    )
    try:
        wid = workflows.start_workflow(
            StartWorkflowRequest(name=wf_name, version=1, input={"x": 1})
        )
        deadline = time.monotonic() + 30
        polled: list[object] = []
        while not polled and time.monotonic() < deadline:
            polled = tasks.batch_poll(task_name, workerid="stack-test", count=1, timeout=500) or []
        assert len(polled) == 1, "Conductor handed out no task within 30 s"
        task = polled[0]
        assert task.workflow_instance_id == wid  # type: ignore[attr-defined]
        assert task.input_data == {"x": 1}  # type: ignore[attr-defined]
        tasks.update_task(
            TaskResult(
                workflow_instance_id=wid,
                task_id=task.task_id,  # type: ignore[attr-defined]
                status="COMPLETED",
                output_data={"ok": True},
                worker_id="stack-test",
            )
        )
        state = ""
        while time.monotonic() < deadline:
            state = workflows.get_execution_status(wid, include_tasks=False).status
            if state == "COMPLETED":
                break
            time.sleep(0.2)
        assert state == "COMPLETED"
        assert workflows.get_execution_status(wid, include_tasks=False).output == {"ok": True}
    finally:
        metadata.unregister_workflow_def(wf_name, 1)
        metadata.unregister_task_def(task_name)


def test_dev_env_makes_lakectl_work_in_a_shell(
    info: stack.StackInfo, lakefs: lakefs_sdk.ApiClient, tmp_path: Path
) -> None:
    name = _repo_name()
    script = (
        f'eval "$({PERAGO} dev env)" && '
        f"lakectl repo create lakefs://{name} {_namespace(name)} >/dev/null && "
        "lakectl repo list"
    )
    # only what `perago dev env` exports: no lakectl config or credentials of the user's
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKECTL_")}
    env |= {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    try:
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert name in done.stdout
    finally:
        lakefs_sdk.RepositoriesApi(lakefs).delete_repository(name)


def test_dev_status_cli(info: stack.StackInfo) -> None:
    done = subprocess.run(
        [str(PERAGO), "dev", "status"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lakefs     healthy" in done.stdout and "conductor  healthy" in done.stdout


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
        out = str(tmp_path / "rows.parquet")
        spark.range(1000).selectExpr("id", "id * 2 AS twice").write.parquet(out)
        back = spark.read.parquet(out)
        assert back.count() == 1000
        assert back.agg({"twice": "sum"}).collect()[0][0] == 999 * 1000
    finally:
        spark.stop()


def _stack_processes(stack_dir: Path) -> list[str]:
    """Command lines of live processes running this stack's binaries or jars."""
    from perago_dev.paths import stack_paths
    from perago_dev.production import postgres_data

    # PostgreSQL runs the distribution's binary: its data folder names it as the stack's.
    owned = (f"{stack_dir}/bin/", f"{stack_dir}/conductor/", str(postgres_data(stack_paths())))
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.startswith(owned) for a in argv):
            found.append(" ".join(argv))
    return found


@pytest.mark.serial  # stops the stack every other test uses
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="checks processes through /proc")
def test_zz_down_leaves_nothing_then_up_again(info: stack.StackInfo) -> None:
    """Runs last in this module; the stack is up again for the modules that follow."""
    assert _stack_processes(info.stack_dir), "the stack's processes should be visible"
    assert stack.down() == list(stack.PROFILES[info.profile])
    assert _stack_processes(info.stack_dir) == []
    assert not any(s.running for s in stack.status().values())
    assert stack.down() == []  # nothing left to stop
    assert stack.up() == info
    assert all(s.healthy for s in stack.status().values())


def test_lakectl_config_file_reaches_the_real_lakefs(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    """Only lakectl's file says where lakeFS is and who we are: the real server answers."""
    from perago import config as config_module
    from perago.adapters.lakefs import LakeFSStore

    path = tmp_path / "lakectl.yaml"
    path.write_text(
        "credentials:\n"
        f"  access_key_id: {stack_env['LAKECTL_CREDENTIALS_ACCESS_KEY_ID']}\n"
        f"  secret_access_key: {stack_env['LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY']}\n"
        "server:\n"
        f"  endpoint_url: {stack_env['LAKECTL_SERVER_ENDPOINT_URL']}\n"
    )
    settings = config_module.load({"LAKECTL_CONFIG_FILE": str(path)})
    assert isinstance(LakeFSStore(settings).list_repositories(), list)
    wrong = config_module.load(
        {"LAKECTL_CONFIG_FILE": str(path), "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": "AKIANOBODY"}
    )
    with pytest.raises(PeragoError):
        LakeFSStore(wrong).list_repositories()


def test_new_repositories_go_where_lakefs_says(settings: Settings) -> None:
    """`repo init --create` takes lakeFS's own default namespace prefix (local:// on the
    embedded profile, the bucket on the production one)."""
    from perago.adapters.lakefs import LakeFSStore

    store = LakeFSStore(settings)
    name = f"ns-{uuid.uuid4().hex[:8]}"
    assert store.storage_namespace_for(name) == _namespace(name)
    store.create_repository(name)
    try:
        api = lakefs_sdk.RepositoriesApi(store._client)
        assert api.get_repository(name).storage_namespace == _namespace(name)
    finally:
        store.delete_repository(name)
