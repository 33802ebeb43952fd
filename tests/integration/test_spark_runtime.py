"""Spark task bodies through real workers: local projection, in place (S3 gateway), failures."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from .harness import (
    attempt_spans,
    attempts,
    fork,
    free_port,
    http_get,
    log_events,
    publications,
    put_workflow,
    register_tasks,
    simple_task,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]
MODULE = "tests.integration.taskmods.spark_tasks"
#: The log of the module's shared Spark worker, by its task names' suffix.
WORKER_LOGS: dict[str, Path] = {}


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


@pytest.fixture(scope="module")
def spark_worker(
    stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One worker (one Spark JVM) for the module's publish and failure cases: starting a JVM
    per case cost more than the cases. Yields its task names' suffix."""
    suffix = uuid.uuid4().hex[:10]
    tmp = tmp_path_factory.mktemp("spark-worker")
    env = {
        **stack_env,
        "PERAGO_TEST_SUFFIX": suffix,
        "PERAGO_WORK_DIR": str(tmp / "work"),
        "PERAGO_SPARK_MASTER": "local[2]",
        "PERAGO_SPARK_CONF": '{"spark.sql.shuffle.partitions": "2"}',
        # traces on (to the log): a Spark body's jobs carry the attempt's trace id
        "OTEL_TRACES_EXPORTER": "console",
    }
    register_tasks(env, MODULE)
    WORKER_LOGS[suffix] = tmp / "w.log"
    # 9 slots: the capped Spark task type takes at most 1, the light one at most 8
    with worker(env, tmp / "w.log", module=MODULE, concurrency=9):
        yield suffix


def _run(
    conductor: ConductorClient,
    task_type: str,
    repo: str,
    unique: str,
    params: dict[str, object],
) -> dict[str, object]:
    name = f"{task_type}_{unique}_wf"
    put_workflow(
        conductor, name, [simple_task(task_type, "step", "${workflow.input.workspace}", params)]
    )
    return wait_workflow(conductor, start(conductor, name, repo), timeout=300)


@pytest.mark.parametrize("kind", ["local", "inplace"])
def test_spark_body_output_is_published(
    spark_worker: str,
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    seeded: str,
    kind: str,
) -> None:
    wf = _run(conductor, f"ps_{kind}_{spark_worker}", repo, unique, {})
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
    spark_worker: str,
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    seeded: str,
    kind: str,
) -> None:
    """The body fails each of its tries (the attempt's own retries, each from a fresh
    workspace or staging branch): one Conductor attempt, terminal, nothing left behind."""
    wf = _run(conductor, f"ps_{kind}_{spark_worker}", repo, unique, {"fail": True})
    assert wf["status"] == "FAILED"
    (step,) = attempts(wf, "step")
    assert step["status"] == "FAILED_WITH_TERMINAL_ERROR"
    reason = step["reasonForIncompletion"]
    assert "task body" in reason and "the body failed all 2 tries of this attempt" in reason
    if kind == "local":  # the Java error's class and message, not a stack frame
        assert "n must be negative" in reason and "\tat " not in reason, reason
    assert store.branch_head(repo, "main") == seeded
    assert publications(store, repo) == []
    assert staging_branches(store, repo) == []


def test_a_spark_body_s_jobs_carry_the_trace_id_of_its_attempt(
    spark_worker: str, conductor: ConductorClient, repo: str, unique: str, seeded: str
) -> None:
    wf = _run(conductor, f"ps_traced_{spark_worker}", repo, unique, {})
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    (task,) = attempts(wf, "step")
    result = task["outputData"]["result"]
    trace_id = result["description"].rpartition("trace_id=")[2]
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id), result
    assert result["description"].startswith(f"perago ps_traced_{spark_worker} {task['taskId']} ")
    assert f"perago-trace-{trace_id}" in result["tags"], result


def test_a_spark_task_capped_at_one_runs_alone_while_light_ones_keep_flowing(
    spark_worker: str, conductor: ConductorClient, repo: str, unique: str, seeded: str
) -> None:
    """One worker with 9 slots: a Spark task type with `concurrency=1` never runs two
    attempts at once, a light type with `concurrency=8` never more than 8, and light
    attempts keep finishing while a Spark attempt runs."""
    pinned = "${workflow.input.workspace}"
    spark = [
        simple_task(f"ps_capped_{spark_worker}", f"s{i}", pinned, {"part": f"s{i}", "seconds": 1})
        for i in range(3)
    ]
    light = [
        simple_task(f"ps_light_{spark_worker}", f"l{i}", pinned, {"part": f"l{i}"})
        for i in range(16)
    ]
    name = f"ps_wf_caps_{unique}"
    put_workflow(conductor, name, fork("split", [[t] for t in spark + light]))
    wf = wait_workflow(conductor, start(conductor, name, repo), timeout=300)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    spans = attempt_spans(log_events(WORKER_LOGS[spark_worker]), wf["workflowId"])
    spark_spans = sorted(spans[f"s{i}"] for i in range(3))
    for (_, end), (start_next, _) in itertools.pairwise(spark_spans):
        assert start_next >= end, f"two Spark attempts overlapped: {spark_spans}"
    light_spans = [spans[f"l{i}"] for i in range(16)]
    most = max(sum(s <= at < e for s, e in light_spans) for at, _ in light_spans)
    assert most <= 8, f"{most} light attempts ran at once"
    first_spark_start, first_spark_end = spark_spans[0]
    during = [e for _, e in light_spans if first_spark_start < e < first_spark_end]
    assert len(during) >= 3, (spark_spans, light_spans)


def test_a_name_error_in_a_spark_body_shows_file_and_line_where_people_look(
    spark_worker: str,
    stack_env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    seeded: str,
) -> None:
    """`perago run --wait`, the worker's log and Conductor's task log all show where the
    body failed (file:line); the traceback is the author's frames, Perago's folded."""
    import re

    from tests.integration.taskmods import spark_tasks

    from .harness import perago_cli

    source = Path(spark_tasks.__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "parms.fail" in text)
    where = f"{spark_tasks.__file__}:{line}"
    task_type = f"ps_local_{spark_worker}"
    name = f"{task_type}_{unique}_typo"
    step = simple_task(task_type, "step", "${workflow.input.workspace}", {"typo": True})
    put_workflow(conductor, name, [step])
    workspace = json.dumps({"workspace": {"repository": repo, "branch": "main"}})
    done = perago_cli(["run", name, "--wait", "--input", workspace], stack_env, timeout=300)
    assert done.returncode == 3, done.stderr
    assert f"NameError: name 'parms' is not defined (at {where})" in done.stderr
    wid = re.search(r"started workflow \S+ \((\S+)\)", done.stderr).group(1)  # type: ignore[union-attr]
    failed = attempts(conductor.get_workflow(wid), "step")
    assert f"/tasks/{failed[-1]['taskId']}/log" in done.stderr  # where the rest is
    # Conductor's task log: the trimmed traceback, the author's frame, Perago's folded
    logged = "\n".join(conductor.task_logs(failed[0]["taskId"]))
    assert f'File "{spark_tasks.__file__}", line {line}, in local_projection' in logged
    assert "frame(s) of perago" in logged and "NameError" in logged
    assert "/perago/worker/runtime.py" not in logged
    # the worker's log: one attempt_failed event carrying the same traceback
    events = log_events(WORKER_LOGS[spark_worker])  # among the console exporter's spans
    failures = [
        e for e in events if e.get("event") == "attempt_failed" and e.get("workflow_id") == wid
    ]
    assert failures and all(where.split(":")[0] in e["traceback"] for e in failures)
    assert store.branch_head(repo, "main") == seeded


def _java_children(pid: int) -> list[int]:
    """The JVMs a process started (spark-submit execs java in its child)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmd = (stat.parent / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        if ppid == pid and cmd.endswith(b"java"):
            found.append(int(stat.parent.name))
    return found


def test_a_worker_whose_spark_jvm_died_builds_a_new_one(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    seeded: str,
) -> None:
    """The JVM is SIGKILLed under a live worker (as Spark's handler does after a
    StackOverflowError); the next Spark task gets a fresh JVM and completes first time."""
    task_type = f"ps_local_{unique}"
    put_workflow(
        conductor, "jvm_wf", [simple_task(task_type, "step", "${workflow.input.workspace}", {})]
    )
    port = free_port()
    with worker(env, tmp_path / "w.log", module=MODULE, extra_args=["--http-port", str(port)]) as w:
        first = wait_workflow(conductor, start(conductor, "jvm_wf", repo), timeout=300)
        assert first["status"] == "COMPLETED"
        jvms = _java_children(w.proc.pid)
        assert jvms, "the worker has no Spark JVM"
        for pid in jvms:
            os.kill(pid, signal.SIGKILL)
        second = wait_workflow(conductor, start(conductor, "jvm_wf", repo), timeout=300)
        assert second["status"] == "COMPLETED", second.get("reasonForIncompletion")
        assert [t["status"] for t in attempts(second, "step")] == ["COMPLETED"]
        w.wait_for("spark_jvm_forgotten")
        assert _java_children(w.proc.pid) and set(_java_children(w.proc.pid)).isdisjoint(jvms)
        assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200


def test_a_spark_session_that_cannot_start_fails_readably_and_unreadies_the_pod(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    repo: str,
    unique: str,
    tmp_path: Path,
    seeded: str,
) -> None:
    broken = make_env(
        MODULE,
        PERAGO_SPARK_MASTER="local[1]",
        PERAGO_SPARK_CONF='{"spark.driver.memory": "lots"}',
    )
    task_type = f"ps_local_{unique}"
    put_workflow(
        conductor, "nojvm_wf", [simple_task(task_type, "step", "${workflow.input.workspace}", {})]
    )
    port = free_port()
    with worker(broken, tmp_path / "w.log", module=MODULE, extra_args=["--http-port", str(port)]):
        wf = wait_workflow(conductor, start(conductor, "nojvm_wf", repo), timeout=300)
        code, body = http_get(f"http://127.0.0.1:{port}/readyz")
    assert wf["status"] == "FAILED"
    reason = attempts(wf, "step")[0]["reasonForIncompletion"]
    assert "cannot start a Spark session" in reason or "Java gateway" in reason, reason
    assert "\tat " not in reason and len(reason) < 2000
    assert code == 503 and "not ready: cannot start a Spark session" in body


def test_plain_spark_writes_publish_only_data_and_nothing_on_a_re_run(
    spark_worker: str,
    stack_env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    seeded: str,
    tmp_path: Path,
) -> None:
    """Issue 39: Parquet (with and without partitionBy), CSV and JSON written as a user
    writes them publish their data and never Hadoop's `.crc` sidecars, `_temporary/` or
    `_SUCCESS`; the same rows re-written on the same worker and on a fresh worker process
    (another JVM) publish nothing. No `cache_adopt_failed` for the overwritten folders."""
    first = _run(conductor, f"ps_formats_{spark_worker}", repo, unique, {})
    assert first["status"] == "COMPLETED", first.get("reasonForIncompletion")
    published = first["output"]["workspace"]["ref"]  # type: ignore[index]
    paths = [o.path for o in store.list_objects(repo, published, "spark/formats/")]
    names = {p.rpartition("/")[2] for p in paths}
    for kind, suffix in (("parquet", ".parquet"), ("csv", ".csv"), ("json", ".json")):
        assert any(p.startswith(f"spark/formats/{kind}/") and p.endswith(suffix) for p in paths)
    assert any(p.startswith("spark/formats/partitioned/bucket=") for p in paths), paths
    assert not [n for n in names if n.endswith(".crc") or n == "_SUCCESS"], names
    assert not [p for p in paths if "/_temporary/" in p], paths
    again = _run(conductor, f"ps_formats_{spark_worker}", repo, f"{unique}b", {})
    assert again["status"] == "COMPLETED", again.get("reasonForIncompletion")
    assert again["output"]["workspace"]["ref"] == published  # type: ignore[index]
    # A fresh worker process: another JVM writes the same rows.
    suffix = uuid.uuid4().hex[:10]
    env = {
        **stack_env,
        "PERAGO_TEST_SUFFIX": suffix,
        "PERAGO_WORK_DIR": str(tmp_path / "work"),
        "PERAGO_SPARK_MASTER": "local[2]",
        "PERAGO_SPARK_CONF": '{"spark.sql.shuffle.partitions": "2"}',
    }
    register_tasks(env, MODULE)
    with worker(env, tmp_path / "fresh.log", module=MODULE) as fresh:
        third = _run(conductor, f"ps_formats_{suffix}", repo, f"{unique}c", {})
        events = fresh.events()
    assert third["status"] == "COMPLETED", third.get("reasonForIncompletion")
    assert third["output"]["workspace"]["ref"] == published  # type: ignore[index]
    assert [c.id for c in publications(store, repo)] == [published]
    assert not [e for e in events if e.get("event") == "cache_adopt_failed"]
    # (adoption runs after the report, outside the attempt's log context: the whole log)
    shared = log_events(WORKER_LOGS[spark_worker])
    assert not [e for e in shared if e.get("event") == "cache_adopt_failed"]


def test_an_incremental_in_place_step_reuses_its_publication_until_its_input_changes(
    spark_worker: str,
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    seeded: str,
) -> None:
    """Issue 40 for an in-place Spark task: the second run reuses the first's publication
    (no staging branch, nothing published); a changed input runs it again."""

    def run() -> dict[str, Any]:
        wf = _run(conductor, f"ps_inplace_inc_{spark_worker}", repo, unique, {})
        assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
        (step,) = attempts(wf, "step")
        return dict(step["outputData"])

    first = run()
    assert "reused" not in first and first["result"] == {"rows": 250}
    published = store.branch_head(repo, "main")
    again = run()
    assert again["reused"]["commit"] == published and again["result"] == first["result"]
    assert store.branch_head(repo, "main") == published
    store.upload_bytes(repo, "main", "spark/in/part-1.csv", b"n,name\n999,late\n")
    store.commit(repo, "main", message="one more row", metadata={})
    third = run()
    assert "reused" not in third and third["result"] == {"rows": 251}
    assert staging_branches(store, repo) == []
