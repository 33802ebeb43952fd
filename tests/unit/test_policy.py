"""Least privilege: allowed targets and sources, protected branches, hostile task input;
against the stub orchestrator and the in-memory store (tests/integration/test_policy.py
does it on the real servers)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from perago import Inputs, WorkspaceSpec, task, wap
from perago.core.orchestrator import Outcome
from perago.core.policy import AccessPolicy, patterns
from perago.errors import PolicyError
from perago.telemetry import metrics
from perago.testing import MemoryStore, StubOrchestrator, running_worker


class P(BaseModel):
    text: str = "x"


class R(BaseModel):
    n: int = 0


@task("pol_write", workspace=WorkspaceSpec(prefix="data/"))
def pol_write(workspace: Path, params: P) -> R:
    (workspace / "out.txt").write_text(params.text)
    return R(n=1)


@task("pol_read", workspace=WorkspaceSpec(prefix="data/", read_only=True))
def pol_read(workspace: Path, params: P) -> R:
    return R(n=len(list(workspace.iterdir())))


@task("pol_join", workspace=WorkspaceSpec(prefix="out/", inputs={"dim": "dims/"}))
def pol_join(workspace: Path, params: P, inputs: Inputs[Path]) -> R:
    (workspace / "n.txt").write_text(str(len(list(inputs["dim"].iterdir()))))
    return R(n=1)


@task(
    "pol_narrow",
    workspace=WorkspaceSpec(prefix="data/", allowed_targets=("repo/dev",)),
)
def pol_narrow(workspace: Path, params: P) -> R:
    (workspace / "out.txt").write_text(params.text)
    return R(n=1)


TASKS = [pol_write, pol_read, pol_join, pol_narrow, wap.perago_wap_begin, wap.perago_wap_publish]


class CountingStore(MemoryStore):
    """The in-memory store, counting the calls that read or write a repository."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.counting = False

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if (
            callable(attr)
            and not name.startswith("_")
            and name not in ("tree", "create_repository", "list_repositories")
            and object.__getattribute__(self, "counting")
        ):
            object.__getattribute__(self, "calls").append(name)
        return attr


@pytest.fixture
def store() -> CountingStore:
    s = CountingStore()
    for repo in ("repo", "other"):
        s.create_repository(repo)
        s.upload_bytes(repo, "main", "data/in.txt", b"input")
        s.upload_bytes(repo, "main", "dims/d.csv", b"d")
        s.commit(repo, "main", message="seed", metadata={})
        s.create_branch(repo, "dev", "main")
    s.counting = True
    return s


@contextmanager
def running(store: MemoryStore, tmp_path: Path, **policy: str) -> Iterator[StubOrchestrator]:
    stub = StubOrchestrator(gate_timeout=20)
    with running_worker(
        TASKS, store=store, orchestrator=stub, work_dir=tmp_path / "work", **policy
    ):
        yield stub


def run(stub: StubOrchestrator, task_type: str, body: dict[str, Any]) -> Outcome:
    wid = f"wf-{len(stub.updates)}-{task_type}"
    stub.submit(task_type, body, workflow_id=wid, reference_name="step", retries=2)
    stub.wait_for(lambda s: s.settled(wid))
    outcome = stub.outcome(stub.final(wid).task_id)
    assert outcome is not None
    return outcome


def ws(repo: str = "repo", branch: str = "main", **extra: Any) -> dict[str, Any]:
    return {"repository": repo, "branch": branch, **extra}


def test_patterns_and_the_policy_alone() -> None:
    assert patterns(" repo/main , other/*,") == ("repo/main", "other/*")
    policy = AccessPolicy(("repo/main", "repo/dev-*"), ("repo/*",), ("main",))
    policy.check_target("repo", "dev-x", task="t")
    policy.check_target("repo", "perago-wap-123", task="t")  # a WAP branch of an allowed repo
    policy.check_target("repo", "main", task="t", audited=True)
    with pytest.raises(PolicyError, match="PERAGO_ALLOWED_TARGETS allows only"):
        policy.check_target("other", "dev-x", task="t")
    with pytest.raises(PolicyError, match="protected"):
        policy.check_target("repo", "main", task="t")
    with pytest.raises(PolicyError, match="PERAGO_ALLOWED_SOURCES"):
        policy.check_source("other", "main", what="x")
    with pytest.raises(PolicyError, match=r"WorkspaceSpec\(allowed_sources"):
        policy.check_source("repo", "main", what="x", narrowed=("repo/dev",))


def test_a_target_that_is_not_allowed_is_refused_before_anything_is_read(
    store: CountingStore, tmp_path: Path
) -> None:
    refusals = metrics.POLICY_REFUSALS.labels("target")
    before = refusals._value.get()
    with running(store, tmp_path, allowed_targets="repo/*") as stub:
        outcome = run(stub, "pol_write", {"workspace": ws("other"), "params": {}})
        ok = run(stub, "pol_write", {"workspace": ws("repo", "dev"), "params": {}})
    assert refusals._value.get() == before + 1, "the refusal is counted, the publication not"
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "pol_write may not publish to other/main: PERAGO_ALLOWED_TARGETS" in outcome.reason
    assert ok.status == "COMPLETED", ok.reason
    # the pre-guardrail's first read is the branch head: only the allowed attempt made it
    assert store.calls.count("branch_head") == 1, "the refused attempt read nothing"
    assert store.tree("other", "main") == {"data/in.txt": b"input", "dims/d.csv": b"d"}


def test_read_only_tasks_need_only_an_allowed_source(store: CountingStore, tmp_path: Path) -> None:
    with running(store, tmp_path, allowed_targets="repo/dev", allowed_sources="repo/*") as stub:
        read = run(stub, "pol_read", {"workspace": ws("repo", "main"), "params": {}})
        other = run(stub, "pol_read", {"workspace": ws("other", "main"), "params": {}})
        pinned = run(stub, "pol_read", {"workspace": ws("repo", "main", ref="v1"), "params": {}})
    assert read.status == "COMPLETED", read.reason
    assert other.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "the workspace of pol_read may not be read from other/main" in other.reason
    assert pinned.status == "FAILED_WITH_TERMINAL_ERROR"  # "v1" is checked as repo/v1 ...
    assert "ref 'v1' does not exist" in pinned.reason  # ... and allowed: then not found


def test_an_input_from_a_source_that_is_not_allowed_is_refused(
    store: CountingStore, tmp_path: Path
) -> None:
    with running(store, tmp_path, allowed_sources="repo/*,other/main") as stub:
        tag = run(
            stub,
            "pol_join",
            {
                "workspace": ws(),
                "params": {},
                "inputs": {"dim": {"repository": "other", "ref": "dev"}},
            },
        )
        unknown = run(
            stub,
            "pol_join",
            {"workspace": ws(), "params": {}, "inputs": {"dim": {"repository": "secret"}}},
        )
        fine = run(
            stub,
            "pol_join",
            {"workspace": ws(), "params": {}, "inputs": {"dim": {"repository": "other"}}},
        )
    assert tag.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "input 'dim' of pol_join may not be read from other/dev" in tag.reason
    assert unknown.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "may not be read from repository secret" in unknown.reason
    assert fine.status == "COMPLETED", fine.reason


def test_a_protected_branch_takes_only_a_write_audit_publish(
    store: CountingStore, tmp_path: Path
) -> None:
    with running(store, tmp_path, protected_branches="main") as stub:
        direct = run(stub, "pol_write", {"workspace": ws(), "params": {}})
        begin = run(stub, wap.BEGIN, {"workspace": ws(), "params": {}})
        assert begin.status == "COMPLETED", begin.reason
        step = run(stub, "pol_write", {"workspace": begin.output["workspace"], "params": {}})
        assert step.status == "COMPLETED", step.reason
        params = {"target_branch": "main", "base": begin.output["result"]["base"]}
        published = run(
            stub, wap.PUBLISH, {"workspace": step.output["workspace"], "params": params}
        )
    assert direct.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "the branch is protected (PERAGO_PROTECTED_BRANCHES=main)" in direct.reason
    assert "write-audit-publish" in direct.reason
    assert published.status == "COMPLETED", published.reason
    assert store.tree("repo", "main")["data/out.txt"] == b"x"


def test_a_task_narrows_the_worker_s_targets(store: CountingStore, tmp_path: Path) -> None:
    with running(store, tmp_path) as stub:
        refused = run(stub, "pol_narrow", {"workspace": ws(), "params": {}})
        fine = run(stub, "pol_narrow", {"workspace": ws("repo", "dev"), "params": {}})
    assert refused.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "WorkspaceSpec(allowed_targets=...) allows only repo/dev" in refused.reason
    assert fine.status == "COMPLETED", fine.reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"workspace": ws(ref="main..dev"), "params": {}}, "not a lakeFS ref"),
        ({"workspace": ws(ref="main\nx"), "params": {}}, "not a lakeFS ref"),
        ({"workspace": ws("a/b"), "params": {}}, "repository: String should match pattern"),
        ({"workspace": ws(after=["x..y"]), "params": {}}, "not a lakeFS ref"),
        ({"workspace": ws(), "params": {"text": "x" * 2_000_000}}, "more than 1,048,576"),
        (
            {"workspace": ws(), "params": {}, "inputs": {"dim": {"ref": "../../etc"}}},
            "not a lakeFS ref",
        ),
    ],
)
def test_hostile_task_input_is_refused_cleanly(
    store: CountingStore, tmp_path: Path, body: dict[str, Any], reason: str
) -> None:
    task_type = "pol_join" if "inputs" in body else "pol_write"
    with running(store, tmp_path) as stub:
        outcome = run(stub, task_type, body)
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert reason in outcome.reason, outcome.reason
    assert "Traceback" not in outcome.reason
    assert store.calls == [], "a hostile input read nothing"
