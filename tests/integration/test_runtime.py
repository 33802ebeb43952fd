"""docs/protocol.md's failure matrix, row by row, through real workers, Conductor, lakeFS."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from .harness import (
    ROOT,
    attempts,
    one_step,
    perago_cli,
    publications,
    put_workflow,
    register_tasks,
    simple_task,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(PERAGO_TEST_RESPONSE_TIMEOUT="6")


def _one_step(
    conductor: ConductorClient, unique: str, params: dict[str, Any], kind: str = "write"
) -> str:
    return one_step(conductor, f"pt_wf_{kind}_{unique}", f"pt_{kind}_{unique}", params)


def _text(store: LakeFSStore, repo: str, ref: str, path: str) -> str:
    import io

    buf = io.BytesIO()
    store.download(repo, ref, path, buf)
    return buf.getvalue().decode()


def test_two_step_workflow_publishes_once_and_chains_refs(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = f"pt_wf_chain_{unique}"
    put_workflow(
        conductor,
        name,
        [
            simple_task(
                f"pt_write_{unique}",
                "write",
                "${workflow.input.workspace}",
                {"files": {"a.txt": "alpha", "d/b.txt": "beta"}},
            ),
            simple_task(f"pt_read_{unique}", "read", "${write.output.workspace}", {}),
        ],
    )
    input_ref = store.branch_head(repo, "main")
    with worker(env, tmp_path / "w.log"):
        wf = wait_workflow(conductor, start(conductor, name, repo))
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    write, read = attempts(wf, "write")[-1], attempts(wf, "read")[-1]
    published = write["outputData"]["workspace"]["ref"]
    assert published == store.branch_head(repo, "main") != input_ref
    assert read["inputData"]["workspace"]["ref"] == published
    assert read["outputData"]["workspace"]["ref"] == published  # read-only keeps the ref
    assert read["outputData"]["result"]["files"] == {"a.txt": "alpha", "d/b.txt": "beta"}
    assert _text(store, repo, published, "data/d/b.txt") == "beta"
    pubs = publications(store, repo)
    assert [c.id for c in pubs] == [published]
    assert pubs[0].parents[0] == input_ref
    assert pubs[0].metadata["perago.workflow_id"] == wf["workflowId"]
    assert pubs[0].metadata["perago.task_ref"] == "write"
    assert staging_branches(store, repo) == []


def test_read_only_discards_writes_and_keeps_ref(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = _one_step(conductor, unique, {"scribble": True}, kind="read")
    head = store.branch_head(repo, "main")
    with worker(env, tmp_path / "w.log"):
        wf = wait_workflow(conductor, start(conductor, name, repo))
    assert wf["status"] == "COMPLETED"
    assert wf["output"]["workspace"]["ref"] == head
    assert store.branch_head(repo, "main") == head
    assert staging_branches(store, repo) == []


def test_writable_noop_makes_no_commit(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = _one_step(conductor, unique, {})
    head = store.branch_head(repo, "main")
    with worker(env, tmp_path / "w.log") as w:
        wf = wait_workflow(conductor, start(conductor, name, repo))
        w.wait_for("noop_completed")
    assert wf["status"] == "COMPLETED"
    assert wf["output"]["workspace"]["ref"] == head
    assert store.branch_head(repo, "main") == head
    assert staging_branches(store, repo) == []


def test_same_size_rewrite_is_published(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    first = _one_step(conductor, unique, {"files": {"x.txt": "AAAA"}})
    with worker(env, tmp_path / "w.log"):
        assert wait_workflow(conductor, start(conductor, first, repo))["status"] == "COMPLETED"
        second = f"pt_wf_rewrite_{unique}"
        put_workflow(
            conductor,
            second,
            [
                simple_task(
                    f"pt_write_{unique}",
                    "step",
                    "${workflow.input.workspace}",
                    {"files": {"x.txt": "BBBB"}},
                )
            ],
        )
        wf = wait_workflow(conductor, start(conductor, second, repo))
    assert wf["status"] == "COMPLETED"
    assert _text(store, repo, wf["output"]["workspace"]["ref"], "data/x.txt") == "BBBB"
    assert len(publications(store, repo)) == 2


def test_deletes_are_published(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    first = _one_step(conductor, unique, {"files": {f"f{i}.txt": str(i) for i in range(5)}})
    with worker(env, tmp_path / "w.log"):
        assert wait_workflow(conductor, start(conductor, first, repo))["status"] == "COMPLETED"
        second = f"pt_wf_del_{unique}"
        put_workflow(
            conductor,
            second,
            [
                simple_task(
                    f"pt_write_{unique}",
                    "step",
                    "${workflow.input.workspace}",
                    {"delete": ["f1.txt", "f3.txt"]},
                )
            ],
        )
        wf = wait_workflow(conductor, start(conductor, second, repo))
    assert wf["status"] == "COMPLETED"
    ref = wf["output"]["workspace"]["ref"]
    assert sorted(o.path for o in store.list_objects(repo, ref, "data/")) == [
        "data/f0.txt",
        "data/f2.txt",
        "data/f4.txt",
    ]


@pytest.mark.parametrize(
    ("workspace", "params", "needle"),
    [
        (
            {"repository": "no-such-repo-x", "branch": "main"},
            {},
            "repository 'no-such-repo-x' does not exist",
        ),
        ({"repository": "REPO", "branch": "nope"}, {}, "branch 'nope' does not exist"),
        (
            {"repository": "REPO", "branch": "main", "ref": "deadbeef"},
            {},
            "ref 'deadbeef' does not exist",
        ),
        ({"repository": "REPO", "branch": "main"}, {"files": "not-a-dict"}, "invalid params"),
        ({"repository": "REPO"}, {}, "invalid workspace input: branch"),
    ],
    ids=[
        "missing-repository",
        "missing-branch",
        "missing-ref",
        "invalid-params",
        "invalid-workspace",
    ],
)
def test_pre_guardrail_failures_are_terminal(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    workspace: dict[str, Any],
    params: dict[str, Any],
    needle: str,
) -> None:
    ws = {k: (repo if v == "REPO" else v) for k, v in workspace.items()}
    name = f"pt_wf_bad_{unique}"
    put_workflow(
        conductor,
        name,
        [
            {
                **simple_task(f"pt_write_{unique}", "step", "${workflow.input.workspace}", {}),
                "inputParameters": {"workspace": "${workflow.input.workspace}", "params": params},
            }
        ],
    )
    head = store.branch_head(repo, "main")
    with worker(env, tmp_path / "w.log") as w:
        wf = wait_workflow(conductor, conductor.start_workflow(name, {"workspace": ws}))
        w.wait_for("pre_guardrails_failed")
        assert not [e for e in w.events() if e.get("event") == "body_finished"]
    steps = attempts(wf, "step")
    assert wf["status"] == "FAILED"
    assert [t["status"] for t in steps] == ["FAILED_WITH_TERMINAL_ERROR"]  # no retry
    assert needle in steps[0]["reasonForIncompletion"]
    assert store.branch_head(repo, "main") == head


@pytest.mark.parametrize(
    ("params", "status", "needle"),
    [
        (
            {"fail": "error", "files": {"a": "1"}},
            "FAILED",
            "task body: RuntimeError: the body failed on purpose",
        ),
        (
            {"fail": "terminal", "files": {"a": "1"}},
            "FAILED_WITH_TERMINAL_ERROR",
            "the body refused on purpose",
        ),
        ({"bad_result": True, "files": {"a": "1"}}, "FAILED", "does not validate as WriteResult"),
        ({"symlink": {"leak": "/etc/passwd"}, "files": {"a": "1"}}, "FAILED", "symlink 'leak'"),
    ],
    ids=["body-error", "task-error-terminal", "invalid-result", "symlink-escape"],
)
def test_failures_publish_nothing(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    params: dict[str, Any],
    status: str,
    needle: str,
) -> None:
    env = {**env, "PERAGO_TEST_RETRIES": "1"}
    register_tasks(env)
    name = _one_step(conductor, unique, params)
    head = store.branch_head(repo, "main")
    with worker(env, tmp_path / "w.log"):
        wf = wait_workflow(conductor, start(conductor, name, repo))
    steps = attempts(wf, "step")
    assert wf["status"] == "FAILED"
    assert steps[0]["status"] == status
    assert needle in steps[0]["reasonForIncompletion"]
    assert len(steps) == (1 if status == "FAILED_WITH_TERMINAL_ERROR" else 2)
    assert store.branch_head(repo, "main") == head
    assert publications(store, repo) == []
    assert staging_branches(store, repo) == []


def test_worker_killed_after_publish_retry_replaces_abandoned_publication(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = _one_step(conductor, unique, {"files": {"out.txt": "data"}})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    with worker({**env, "PERAGO_FAILPOINTS": "after_publish=kill"}, tmp_path / "w1.log") as w1:
        assert w1.proc.wait(timeout=60) == -signal.SIGKILL
    abandoned = store.branch_head(repo, "main")
    assert abandoned != input_ref
    # Conductor times the silent attempt out and retries it on a fresh worker (on another
    # work directory, so it knows nothing of the dead one: the response-timeout path).
    with worker({**env, "PERAGO_WORK_DIR": str(tmp_path / "other")}, tmp_path / "w2.log") as w2:
        wf = wait_workflow(conductor, wid, timeout=90)
        w2.wait_for("published", mode="replace")
    assert wf["status"] == "COMPLETED"
    steps = attempts(wf, "step")
    assert [t["status"] for t in steps] == ["TIMED_OUT", "COMPLETED"]
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert wf["output"]["workspace"]["ref"] == head.id
    assert head.parents[0] == input_ref  # exactly one publication on top of the input
    assert head.metadata["perago.retry_count"] == "1"
    assert [c.id for c in publications(store, repo)] == [head.id]
    # the replaced head stays reachable through its tag
    assert store.get_tag(repo, f"perago-replaced-{abandoned[:16]}-r1") == abandoned
    assert _text(store, repo, head.id, "data/out.txt") == "data"


def test_noop_retry_relocates_abandoned_publication(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = _one_step(conductor, unique, {"files": {"once.txt": "x"}, "only_on_first_attempt": True})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    with worker({**env, "PERAGO_FAILPOINTS": "after_publish=kill"}, tmp_path / "w1.log") as w1:
        assert w1.proc.wait(timeout=60) == -signal.SIGKILL
    assert store.branch_head(repo, "main") != input_ref
    with worker(env, tmp_path / "w2.log") as w2:
        wf = wait_workflow(conductor, wid, timeout=90)
        w2.wait_for("noop_relocated")
    assert wf["status"] == "COMPLETED"
    assert wf["output"]["workspace"]["ref"] == input_ref
    assert store.branch_head(repo, "main") == input_ref


def test_stale_attempt_fails_its_fence_and_publishes_nothing(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = _one_step(conductor, unique, {"files": {"v.txt": "value"}})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    with worker(
        {**env, "PERAGO_FAILPOINTS": "after_body=pause:3"}, tmp_path / "stale.log"
    ) as stale:
        stale.wait_for("failpoint_hit", failpoint="after_body")
        stale.signal(signal.SIGSTOP)  # a GC pause / partition: no lease extension, no progress
        try:
            with worker(env, tmp_path / "fresh.log"):
                wf = wait_workflow(conductor, wid, timeout=90)
        finally:
            stale.signal(signal.SIGCONT)
        assert wf["status"] == "COMPLETED"
        published = store.branch_head(repo, "main")
        failed = stale.wait_for("attempt_finished", timeout=30)
    assert failed["status"] == "FAILED"
    assert "attempt fence" in failed["reason"]
    assert store.branch_head(repo, "main") == published
    assert [c.id for c in publications(store, repo)] == [published]
    assert staging_branches(store, repo) == []


def test_foreign_head_is_never_replaced(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = {**env, "PERAGO_TEST_RETRIES": "0"}
    register_tasks(env)
    name = _one_step(conductor, unique, {"files": {"mine.txt": "perago"}})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    with worker({**env, "PERAGO_FAILPOINTS": "after_fence2=pause:4"}, tmp_path / "w.log") as w:
        w.wait_for("failpoint_hit", failpoint="after_fence2")
        # someone else commits on the target branch, on top of the same input ref
        foreign_file = tmp_path / "foreign.txt"
        foreign_file.write_text("not perago")
        store.upload(repo, "main", "other/foreign.txt", foreign_file)
        foreign = store.commit(repo, "main", message="a human commit", metadata={})
        wf = wait_workflow(conductor, wid)
    assert foreign.parents[0] == input_ref
    assert wf["status"] == "FAILED"
    assert "publish fence" in attempts(wf, "step")[0]["reasonForIncompletion"]
    assert store.branch_head(repo, "main") == foreign.id
    assert publications(store, repo) == []
    assert staging_branches(store, repo) == []


def test_perago_run_exit_codes(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    ok = _one_step(conductor, unique, {"files": {"r.txt": "run"}})
    bad = f"pt_wf_badrun_{unique}"
    put_workflow(
        conductor,
        bad,
        [
            simple_task(
                f"pt_write_{unique}", "step", "${workflow.input.workspace}", {"fail": "terminal"}
            )
        ],
    )
    ws = json.dumps({"workspace": {"repository": repo, "branch": "main"}})
    with worker(env, tmp_path / "w.log"):
        good = perago_cli(["run", ok, "--input", ws, "--wait", "--timeout", "60"], env)
        (tmp_path / "in.json").write_text(ws)
        failed = perago_cli(
            ["run", bad, "--input", f"@{tmp_path / 'in.json'}", "--wait", "--timeout", "60"], env
        )
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["workspace"]["ref"] == store.branch_head(repo, "main")
    assert failed.returncode == 3  # FAILED
    assert "task step" in failed.stderr and "the body refused on purpose" in failed.stderr
    garbage = perago_cli(["run", ok, "--input", "{not json", "--wait"], env)
    assert garbage.returncode == 1 and "--input is not valid JSON" in garbage.stderr

    # No worker from here on: the wait runs out (6), and a terminated workflow is 5.
    waited = perago_cli(["run", ok, "--input", ws, "--wait", "--timeout", "1"], env)
    assert waited.returncode == 6, waited.stderr
    assert "is still RUNNING after 1s" in waited.stderr
    conductor.terminate_workflow(_started_id(waited.stderr), "test over")
    run = subprocess.Popen(
        [sys.executable, "-m", "perago", "run", ok, "--input", ws, "--wait", "--timeout", "120"],
        cwd=ROOT,
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert run.stderr is not None
    started = run.stderr.readline()
    conductor.terminate_workflow(_started_id(started), "terminated by the test")
    assert run.wait(timeout=120) == 5
    assert "TERMINATED" in run.stderr.read()
    run.stderr.close()


def _started_id(stderr: str) -> str:
    match = re.search(r"started workflow \S+ \((\S+)\)", stderr)
    assert match, stderr
    return match.group(1)


def test_register_rejects_a_workflow_with_an_unknown_task(
    env: dict[str, str], tmp_path: Path, unique: str
) -> None:
    wf_dir = tmp_path / "wfs"
    wf_dir.mkdir()
    (wf_dir / "x.json").write_text(
        json.dumps(
            {
                "name": f"pt_unknown_{unique}",
                "tasks": [{"name": f"nope_{unique}", "taskReferenceName": "n", "type": "SIMPLE"}],
            }
        )
    )
    done = perago_cli(
        ["register", "tests.integration.taskmods.tasks", "--workflows", str(wf_dir)], env
    )
    assert done.returncode == 1
    assert f"uses task 'nope_{unique}'" in done.stderr


def test_register_refuses_a_misspelled_params_key_the_worker_would_refuse(
    env: dict[str, str], tmp_path: Path, unique: str
) -> None:
    """`perago register` applies the worker's params rule: a typo is caught before any run;
    with PERAGO_PARAMS_EXTRA=ignore (the workers drop unknown keys) it registers."""
    wf_dir = tmp_path / "wfs"
    wf_dir.mkdir()
    step = {
        "name": f"pt_write_{unique}",
        "taskReferenceName": "w",
        "type": "SIMPLE",
        "inputParameters": {"workspace": "${workflow.input.workspace}", "params": {"slep": 1}},
    }
    (wf_dir / "typo.json").write_text(json.dumps({"name": f"pt_typo_{unique}", "tasks": [step]}))
    args = ["register", "tests.integration.taskmods.tasks", "--workflows", str(wf_dir)]
    done = perago_cli(args, env)
    assert done.returncode == 1, done.stderr
    assert "params ['slep'] are not fields of WriteParams" in done.stderr
    ignored = perago_cli(args, {**env, "PERAGO_PARAMS_EXTRA": "ignore"})
    assert ignored.returncode == 0, ignored.stderr


def test_registered_task_definitions_carry_their_json_schemas_only_when_asked(
    env: dict[str, str], unique: str
) -> None:
    """Conductor copies a definition into every task it schedules: by default it stays small;
    `perago register --schemas` stores each task's input and output schema with it."""
    import httpx

    from tests.integration.taskmods.tasks import WriteParams

    url = env["CONDUCTOR_SERVER_URL"].rstrip("/")
    name = f"pt_write_{unique}"
    plain = httpx.get(f"{url}/metadata/taskdefs/{name}", timeout=10).json()
    assert plain["inputKeys"] == ["workspace", "params"]
    assert "inputSchema" not in plain and "outputSchema" not in plain
    done = perago_cli(["register", "--schemas", "tests.integration.taskmods.tasks"], env)
    assert done.returncode == 0, done.stderr
    defn = httpx.get(f"{url}/metadata/taskdefs/{name}", timeout=10).json()
    assert defn["inputSchema"]["data"]["properties"]["params"] == WriteParams.model_json_schema()
    assert defn["outputSchema"]["data"]["required"] == ["workspace", "result"]
    assert defn["enforceSchema"] is False
    again = perago_cli(["register", "tests.integration.taskmods.tasks"], env)
    assert again.returncode == 0, again.stderr
    assert "inputSchema" not in httpx.get(f"{url}/metadata/taskdefs/{name}", timeout=10).json()


def test_lease_extension_keeps_a_long_body_alive(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """The body outlives the 6 s response timeout; lease extension keeps it the only attempt."""
    name = _one_step(conductor, unique, {"files": {"slow.txt": "s"}, "sleep": 14})
    with worker(env, tmp_path / "w.log"):
        wf = wait_workflow(conductor, start(conductor, name, repo))
    assert wf["status"] == "COMPLETED"
    assert [t["status"] for t in attempts(wf, "step")] == ["COMPLETED"]
    assert len(publications(store, repo)) == 1


def test_sigterm_lets_the_in_flight_attempt_finish_and_publish_once(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = _one_step(conductor, unique, {"files": {"drain.txt": "d"}, "sleep": 3})
    wid = start(conductor, name, repo)
    with worker({**env, "PERAGO_SHUTDOWN_GRACE": "30"}, tmp_path / "w.log") as w:
        w.wait_for("pre_guardrails_passed")
        assert w.stop(timeout=60) == 0
        assert not [e for e in w.events() if e.get("event") == "interrupting_attempt"]
    wf = wait_workflow(conductor, wid)
    assert wf["status"] == "COMPLETED"
    assert [t["status"] for t in attempts(wf, "step")] == ["COMPLETED"]
    assert len(publications(store, repo)) == 1


def test_a_body_that_checks_cancelled_stops_at_sigterm_and_shows_its_progress(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """The body notes its progress (Conductor shows it in the task's execution log) and
    checks perago.wait_cancelled(): at SIGTERM it stops before the 30 s grace ends (never
    interrupted), and the attempt is reported drained with nothing published."""
    name = _one_step(conductor, unique, {"files": {"half.txt": "h"}, "patient": 60})
    wid = start(conductor, name, repo)
    settings = {**env, "PERAGO_SHUTDOWN_GRACE": "30", "PERAGO_EXTENSION_INTERVAL": "1"}
    with worker(settings, tmp_path / "w.log") as w:
        w.wait_for("attempt_progress")
        deadline = time.monotonic() + 20
        while True:
            (task,) = attempts(conductor.get_workflow(wid), "step")
            notes = [x for x in conductor.task_logs(task["taskId"]) if x.startswith("progress: ")]
            if notes:
                break
            assert time.monotonic() < deadline, "no progress note in the task's log"
            time.sleep(0.5)
        assert notes[0].endswith("of 60 s") and task["status"] == "IN_PROGRESS"
        w.signal(signal.SIGTERM)
        w.wait_for("body_cancelled", timeout=10)
        w.wait_for("draining")
        assert w.proc.wait(timeout=60) == 0
    assert not [e for e in w.events() if e.get("event") == "interrupting_attempt"]
    (first,) = attempts(conductor.get_workflow(wid), "step")[:1]
    assert first["status"] == "FAILED"
    assert "cancelled (the worker is draining" in first["reasonForIncompletion"]
    assert publications(store, repo) == []


def test_an_attempt_outliving_the_grace_is_failed_and_retried_elsewhere(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = _one_step(
        conductor, unique, {"files": {"late.txt": "l"}, "sleep": 20, "only_on_first_attempt": False}
    )
    wid = start(conductor, name, repo)
    with worker({**env, "PERAGO_SHUTDOWN_GRACE": "1"}, tmp_path / "w1.log") as w:
        w.wait_for("pre_guardrails_passed")
        assert w.stop(timeout=60) == 0
        w.wait_for("interrupting_attempt")
        failed = w.wait_for("attempt_finished")
    assert failed["status"] == "FAILED" and "worker shutdown" in failed["reason"]
    assert publications(store, repo) == []
    with worker(env, tmp_path / "w2.log"):
        wf = wait_workflow(conductor, wid, timeout=120)
    steps = attempts(wf, "step")
    assert [t["status"] for t in steps] == ["FAILED", "COMPLETED"]
    assert "worker shutdown" in steps[0]["reasonForIncompletion"]
    assert len(publications(store, repo)) == 1


def test_retry_of_an_unpinned_input_replaces_instead_of_stacking(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """Without ``ref`` the head is pinned at attempt start; a retry must not pin the abandoned
    publication of its own step as its input (that would publish the step twice)."""
    name = _one_step(conductor, unique, {"files": {"u.txt": "unpinned"}, "stamp_retry": True})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo)  # no ref
    with worker({**env, "PERAGO_FAILPOINTS": "after_publish=kill"}, tmp_path / "w1.log") as w1:
        assert w1.proc.wait(timeout=60) == -signal.SIGKILL
    with worker(env, tmp_path / "w2.log") as w2:
        wf = wait_workflow(conductor, wid, timeout=90)
        w2.wait_for("published", mode="replace")
    assert wf["status"] == "COMPLETED"
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.parents[0] == input_ref
    assert [c.id for c in publications(store, repo)] == [head.id]


def test_a_paused_lease_holder_loses_to_the_taker(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """A replacement frozen past its branch lease: the taker gets a higher token and publishes;
    the sleeper's reset, when it wakes, is refused by the lease check (default backend)."""
    name = _one_step(conductor, unique, {"files": {"l.txt": "leased"}, "stamp_retry": True})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    with worker({**env, "PERAGO_FAILPOINTS": "after_publish=kill"}, tmp_path / "w0.log") as w0:
        assert w0.proc.wait(timeout=60) == -signal.SIGKILL
    abandoned = store.branch_head(repo, "main")
    # Retry 1 takes the lease to replace the abandoned publication and freezes (SIGSTOP, all
    # threads: no Conductor lease extension either) right before its hard reset.
    with worker({**env, "PERAGO_FAILPOINTS": "before_reset=stop"}, tmp_path / "w1.log") as w1:
        w1.wait_for("failpoint_hit", failpoint="before_reset", timeout=90)
        slept = w1.wait_for("branch_lease_acquired")["fencing_token"]
        try:
            with worker(env, tmp_path / "w2.log") as w2:
                wf = wait_workflow(conductor, wid, timeout=150, nudge=True)
                reset = w2.wait_for("reset_under_lease")
        finally:
            w1.signal(signal.SIGCONT)
        lost = w1.wait_for("attempt_finished", timeout=60)
    assert wf["status"] == "COMPLETED"
    assert reset["fencing_token"] > slept
    assert lost["status"] == "FAILED" and "lease lost" in lost["reason"]
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert head.parents[0] == input_ref and head.metadata["perago.retry_count"] == "2"
    assert head.metadata["perago.fencing_token"] == str(reset["fencing_token"])
    assert [c.id for c in publications(store, repo)] == [head.id]
    assert store.get_tag(repo, f"perago-replaced-{abandoned[:16]}-r2") == abandoned
    # The killed attempt's staging branch is the janitor's (no other attempt's is left).
    assert len(staging_branches(store, repo)) == 1
    done = perago_cli(["janitor", "--repository", repo], env)
    assert done.returncode == 0, done.stderr
    assert staging_branches(store, repo) == []
