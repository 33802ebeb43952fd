"""Named inputs: declared at import, resolved to commits, read-only, recorded, and checked
at publish time under serializable isolation; against the stub orchestrator and the
in-memory store (tests/integration/test_inputs.py does it on the real servers)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from perago import Inputs, TaskDefinitionError, WorkspaceSpec, task
from perago._api.inputs import ResolvedInput, template_overlap
from perago._api.task_io import input_schema, output_schema
from perago.core.orchestrator import Outcome
from perago.publish.identity import AttemptIdentity
from perago.testing import MemoryStore, StubOrchestrator, run_task, running_worker


class Month(BaseModel):
    month: str = "01"


class Joined(BaseModel):
    rows: int
    customers: str


#: What a test makes happen while the body runs (e.g. a sibling publishing an input).
DURING_BODY: list[Any] = []


@task(
    "month_report",
    workspace=WorkspaceSpec(
        prefix="reports/month={month}/",
        inputs={"facts": "clean/month={month}/", "customers": "dims/customers/"},
    ),
)
def month_report(workspace: Path, params: Month, inputs: Inputs[Path]) -> Joined:
    for hook in DURING_BODY:
        hook()
    facts = (inputs["facts"] / "rows.csv").read_text().splitlines()
    customers = (inputs["customers"] / "names.csv").read_text().strip()
    (workspace / "report.txt").write_text(f"{len(facts)} rows; customers {customers}")
    return Joined(rows=len(facts), customers=customers)


@task(
    "month_report_serializable",
    workspace=WorkspaceSpec(
        prefix="reports/month={month}/",
        inputs={"facts": "clean/month={month}/", "customers": "dims/customers/"},
        isolation="serializable",
    ),
)
def month_report_serializable(workspace: Path, params: Month, inputs: Inputs[Path]) -> Joined:
    return month_report.fn(workspace, params, inputs=inputs)


@task("input_writer", workspace=WorkspaceSpec(prefix="out/", inputs={"src": "dims/customers/"}))
def input_writer(workspace: Path, params: Month, inputs: Inputs[Path]) -> Joined:
    (inputs["src"] / "names.csv").write_text("changed by the body")
    return Joined(rows=0, customers="")


#: The commits each run of ``month_peek`` read its inputs at.
SEEN: list[dict[str, str]] = []


@task(
    "month_peek",
    workspace=WorkspaceSpec(
        prefix="reports/month={month}/",
        read_only=True,
        inputs={"facts": "clean/month={month}/", "customers": "dims/customers/"},
    ),
    body_retries=0,  # its tests are about Conductor's retries, which resolve the head again
)
def month_peek(workspace: Path, params: Month, inputs: Inputs[Path]) -> Joined:
    SEEN.append({name: inputs.source(name).commit for name in inputs})
    return month_report.fn(workspace, params, inputs=inputs)


TASKS = [month_report, month_report_serializable, input_writer, month_peek]


# -- declaring ----------------------------------------------------------------------------------


def test_overlap_of_templates() -> None:
    assert template_overlap("reports/month={month}/", "clean/month={month}/") == "never"
    assert template_overlap("a/", "a/b/") == "always"
    assert template_overlap("data/{day}/", "data/{day}/x/") == "always"
    assert template_overlap("data/{a}/", "data/{b}/") == "maybe"
    assert template_overlap("data/day={a}/", "data/month={b}/") == "never"
    assert template_overlap("ab/", "a/") == "never"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"prefix": "out/", "inputs": {"bad-name": "x/"}}, "input name 'bad-name' is not valid"),
        ({"prefix": "out/", "inputs": {"x": "../up/"}}, "input 'x': workspace prefix"),
        ({"prefix": "out/", "inputs": {"x": "out/sub/"}}, "overlaps the output prefix"),
        ({"prefix": "out/", "inputs": {"x": "_perago/"}}, "reserved"),
        ({"prefix": "out/", "inputs": ["x/"]}, "must map names to lakeFS folders"),
        ({"prefix": "out/", "isolation": "strict"}, "isolation 'strict' is not one of"),
        (
            {"prefix": "out/", "read_only": True, "isolation": "serializable"},
            "read-only task publishes nothing",
        ),
    ],
)
def test_bad_inputs_are_refused_at_import(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(TaskDefinitionError, match=message):
        WorkspaceSpec(**spec)


def test_the_body_must_take_inputs_exactly_when_it_declares_them() -> None:
    with pytest.raises(TaskDefinitionError, match="has no `inputs` parameter"):

        @task("t1", workspace=WorkspaceSpec(prefix="out/", inputs={"x": "in/"}))
        def t1(workspace: Path, params: Month) -> Joined:
            raise NotImplementedError

    with pytest.raises(TaskDefinitionError, match="declares none"):

        @task("t2", workspace=WorkspaceSpec(prefix="out/"))
        def t2(workspace: Path, params: Month, inputs: Inputs[Path]) -> Joined:
            raise NotImplementedError

    with pytest.raises(TaskDefinitionError, match=r"input 'x' 'in/\{day\}/' is filled from"):

        @task("t3", workspace=WorkspaceSpec(prefix="out/", inputs={"x": "in/{day}/"}))
        def t3(workspace: Path, params: Month, inputs: Inputs[Path]) -> Joined:
            raise NotImplementedError

    with pytest.raises(TaskDefinitionError, match="unexpected parameter 'extra'"):

        @task("t4", workspace=WorkspaceSpec(prefix="out/"))
        def t4(workspace: Path, params: Month, extra: int) -> Joined:
            raise NotImplementedError


def test_the_registered_schemas_show_the_inputs() -> None:
    schema = input_schema(month_report)["properties"]["inputs"]
    assert sorted(schema["properties"]) == ["customers", "facts"]
    assert "clean/month={month}/" in schema["properties"]["facts"]["description"]
    assert schema["additionalProperties"] is False
    out = output_schema(month_report)
    assert "inputs" in out["required"]
    assert "inputs" not in input_schema(month_report)["required"]


def test_run_task_hands_the_body_its_inputs(tmp_path: Path) -> None:
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "rows.csv").write_text("a\nb\n")
    (tmp_path / "dims").mkdir()
    (tmp_path / "dims" / "names.csv").write_text("ann")
    (tmp_path / "ws").mkdir()
    result = run_task(
        month_report,
        tmp_path / "ws",
        {"month": "02"},
        inputs={"facts": tmp_path / "facts", "customers": tmp_path / "dims"},
    )
    assert result == Joined(rows=2, customers="ann")
    with pytest.raises(TaskDefinitionError, match="pass exactly those"):
        run_task(month_report, tmp_path / "ws", {}, inputs={"facts": tmp_path})


def test_an_unknown_input_name_says_which_exist() -> None:
    inputs = Inputs({"a": Path("/x")}, {})
    with pytest.raises(KeyError, match=r"no input named 'b': this task declares \['a'\]"):
        inputs["b"]


# -- running ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_hooks() -> Iterator[None]:
    DURING_BODY.clear()
    SEEN.clear()
    yield
    DURING_BODY.clear()


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore()
    s.create_repository("repo")
    s.upload_bytes("repo", "main", "clean/month=01/rows.csv", b"1\n2\n3\n")
    s.upload_bytes("repo", "main", "clean/month=02/rows.csv", b"1\n")
    s.upload_bytes("repo", "main", "dims/customers/names.csv", b"ann,bob")
    s.commit("repo", "main", message="seed", metadata={})
    s.create_repository("reference")
    s.upload_bytes("reference", "main", "dims/customers/names.csv", b"v2024")
    s.commit("reference", "main", message="v2024", metadata={})
    s.create_tag("reference", "v2024", "main")
    s.upload_bytes("reference", "main", "dims/customers/names.csv", b"newer")
    s.commit("reference", "main", message="newer", metadata={})
    return s


def running(stub: StubOrchestrator, store: MemoryStore, tmp_path: Path) -> Any:
    return running_worker(
        TASKS, store=store, orchestrator=stub, work_dir=tmp_path / "work", concurrency=2
    )


def submit(
    stub: StubOrchestrator,
    task_type: str = "month_report",
    *,
    ref: str | None = None,
    inputs: Any = None,
    retries: int = 0,
    **params: Any,
) -> str:
    wid = f"wf-{len(stub.updates)}-{id(params)}"
    workspace = {"repository": "repo", "branch": "main", **({"ref": ref} if ref else {})}
    body: dict[str, Any] = {"workspace": workspace, "params": params}
    if inputs is not None:
        body["inputs"] = inputs
    stub.submit(task_type, body, workflow_id=wid, reference_name="step", retries=retries)
    return wid


def settle(stub: StubOrchestrator, wid: str) -> Outcome:
    stub.wait_for(lambda s: s.settled(wid))
    outcome = stub.outcome(stub.final(wid).task_id)
    assert outcome is not None
    return outcome


def test_inputs_are_read_at_their_commits_and_recorded(store: MemoryStore, tmp_path: Path) -> None:
    stub = StubOrchestrator(gate_timeout=20)
    head = store.branch_head("repo", "main")
    tag = store.get_commit("reference", "v2024").id
    with running(stub, store, tmp_path):
        wid = submit(stub, inputs={"customers": {"repository": "reference", "ref": "v2024"}})
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED", outcome.reason
    assert outcome.output["result"] == {"rows": 3, "customers": "v2024"}
    assert outcome.output["inputs"] == {
        "customers": {
            "repository": "reference",
            "ref": "v2024",
            "commit": tag,
            "prefix": "dims/customers/",
        },
        "facts": {"repository": "repo", "ref": head, "commit": head, "prefix": "clean/month=01/"},
    }
    published = store.get_commit("repo", outcome.output["workspace"]["ref"])
    assert ResolvedInput.from_metadata(published.metadata) == {
        "customers": f"reference@{tag}/dims/customers/",
        "facts": f"repo@{head}/clean/month=01/",
    }
    assert store.tree("repo", published.id)["reports/month=01/report.txt"] == (
        b"3 rows; customers v2024"
    )


def test_a_null_inputs_key_means_every_default(store: MemoryStore, tmp_path: Path) -> None:
    stub = StubOrchestrator(gate_timeout=20)
    with running(stub, store, tmp_path):
        outcome = settle(stub, submit(stub, inputs=None, month="02"))
        nulled = settle(stub, submit(stub, inputs={"customers": None}, month="02"))
    assert outcome.status == nulled.status == "COMPLETED", (outcome.reason, nulled.reason)
    assert outcome.output["result"] == {"rows": 1, "customers": "ann,bob"}


@pytest.mark.parametrize(
    ("inputs", "params", "reason"),
    [
        ({"dimension": {"ref": "main"}}, {}, r"names \['dimension'\], which month_report does not"),
        ({"customers": {"ref": "nope"}}, {}, "ref 'nope' does not exist in 'repo'"),
        ({"customers": {"repository": "absent"}}, {}, "repository 'absent' does not exist"),
        ({"customers": {"branch": "main"}}, {}, "invalid source"),
        ("customers", {}, "must be an object naming inputs"),
        (None, {"month": "03"}, r"nothing under 'clean/month=03/' in repo@"),
    ],
)
def test_bad_input_sources_are_terminal_and_publish_nothing(
    store: MemoryStore, tmp_path: Path, inputs: Any, params: dict[str, Any], reason: str
) -> None:
    stub = StubOrchestrator(gate_timeout=20)
    head = store.branch_head("repo", "main")
    with running(stub, store, tmp_path):
        outcome = settle(stub, submit(stub, inputs=inputs, retries=2, **params))
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert reason in outcome.reason or re.search(reason, outcome.reason), outcome
    assert store.branch_head("repo", "main") == head


def test_a_body_cannot_write_to_an_input(store: MemoryStore, tmp_path: Path) -> None:
    stub = StubOrchestrator(gate_timeout=20)
    with running(stub, store, tmp_path):
        outcome = settle(stub, submit(stub, "input_writer"))
    if os.geteuid() == 0:  # file modes do not stop root: the check after the body does
        assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
        assert "the body changed its input 'src' (names.csv)" in outcome.reason
    else:
        assert outcome.status == "FAILED"
        assert "Permission denied" in outcome.reason
    assert store.tree("repo", "main")["dims/customers/names.csv"] == b"ann,bob"


def _sibling_publishes_facts(store: MemoryStore) -> None:
    """A sibling in the fork publishes the folder the task reads, while its body runs."""
    if DURING_BODY and getattr(_sibling_publishes_facts, "done", False):
        return
    _sibling_publishes_facts.done = True  # type: ignore[attr-defined]
    sibling = AttemptIdentity(
        "wf-sibling", "clean", "t-sibling", 0, 1, "cleaner", scope="clean/month=01/"
    )
    base = store.branch_head("repo", "main")
    store.upload_bytes("repo", "main", "clean/month=01/rows.csv", b"1\n2\n3\n4\n5\n")
    metadata = sibling.metadata(base, kind="publication")
    store.commit("repo", "main", message="a sibling's publication", metadata=metadata)


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_an_input_changed_by_a_sibling_while_the_body_runs(
    store: MemoryStore, tmp_path: Path, isolation: str
) -> None:
    """Snapshot: publishes at once, from the old data. Serializable: refused (naming the
    input and the commit), retried, publishes output computed from the sibling's data."""
    _sibling_publishes_facts.done = False  # type: ignore[attr-defined]
    DURING_BODY.append(lambda: _sibling_publishes_facts(store))
    stub = StubOrchestrator(gate_timeout=20)
    name = "month_report" if isolation == "snapshot" else "month_report_serializable"
    with running(stub, store, tmp_path):
        wid = submit(stub, name, retries=1)
        outcome = settle(stub, wid)
    attempts = stub.attempts(wid)
    assert outcome.status == "COMPLETED", outcome.reason
    if isolation == "snapshot":
        assert len(attempts) == 1
        assert outcome.output["result"]["rows"] == 3
        return
    assert len(attempts) == 2
    first = stub.outcome(attempts[0].task_id)
    assert first is not None and first.status == "FAILED"
    assert "serializable isolation: input 'facts' (clean/month=01/) changed on main" in first.reason
    assert "published by step 'clean' of workflow wf-sibling" in first.reason, first.reason
    assert outcome.output["result"]["rows"] == 5


def test_serializable_refusal_is_terminal_when_the_ref_is_pinned(
    store: MemoryStore, tmp_path: Path
) -> None:
    _sibling_publishes_facts.done = False  # type: ignore[attr-defined]
    DURING_BODY.append(lambda: _sibling_publishes_facts(store))
    stub = StubOrchestrator(gate_timeout=20)
    pinned = store.branch_head("repo", "main")
    with running(stub, store, tmp_path):
        outcome = settle(stub, submit(stub, "month_report_serializable", ref=pinned, retries=2))
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert "changed on main" in outcome.reason and "Not retried" in outcome.reason


def test_a_pinned_retry_reads_the_same_commits(store: MemoryStore, tmp_path: Path) -> None:
    """The branch moves between two attempts: a pinned workspace ref reads the same commits
    again, an unpinned one reads the new head."""

    def fail_first() -> None:
        if len(SEEN) == 1:
            store.upload_bytes("repo", "main", "dims/customers/names.csv", b"moved on")
            store.commit("repo", "main", message="later", metadata={})
            raise RuntimeError("the first attempt fails")

    pinned = store.branch_head("repo", "main")
    DURING_BODY.append(fail_first)
    stub = StubOrchestrator(gate_timeout=20)
    with running(stub, store, tmp_path):
        outcome = settle(stub, submit(stub, "month_peek", ref=pinned, retries=1))
        assert outcome.status == "COMPLETED", outcome.reason
        assert len(SEEN) == 2 and all(s == {"customers": pinned, "facts": pinned} for s in SEEN)
        assert outcome.output["result"]["customers"] == "ann,bob"
        SEEN.clear()
        before = store.branch_head("repo", "main")
        outcome = settle(stub, submit(stub, "month_peek", retries=1))
    after = store.branch_head("repo", "main")
    assert outcome.status == "COMPLETED", outcome.reason
    assert before != after
    assert [s["customers"] for s in SEEN] == [before, after]


def test_a_write_audit_publish_publication_records_what_its_steps_read(
    store: MemoryStore, tmp_path: Path
) -> None:
    from perago import wap

    stub = StubOrchestrator(gate_timeout=20)
    with running_worker(
        [*TASKS, wap.perago_wap_begin, wap.perago_wap_publish],
        store=store,
        orchestrator=stub,
        work_dir=tmp_path / "work",
    ):
        workspace = {"repository": "repo", "branch": "main"}
        stub.submit(wap.BEGIN, {"workspace": workspace}, workflow_id="wap", reference_name="b")
        begin = settle(stub, "wap")
        assert begin.status == "COMPLETED", begin.reason
        stub.submit(
            "month_report",
            {"workspace": begin.output["workspace"], "params": {"month": "02"}},
            workflow_id="wap-step",
            reference_name="report",
        )
        step = settle(stub, "wap-step")
        assert step.status == "COMPLETED", step.reason
        params = {"target_branch": "main", "base": begin.output["result"]["base"]}
        stub.submit(
            wap.PUBLISH,
            {"workspace": step.output["workspace"], "params": params},
            workflow_id="wap-publish",
            reference_name="publish",
        )
        published = settle(stub, "wap-publish")
    assert published.status == "COMPLETED", published.reason
    commit = store.get_commit("repo", published.output["workspace"]["ref"])
    recorded = ResolvedInput.from_metadata(commit.metadata)
    assert recorded == {
        f"report.{name}": f"repo@{step.output['inputs'][name]['commit']}/{prefix}"
        for name, prefix in [("customers", "dims/customers/"), ("facts", "clean/month=02/")]
    }


def test_a_serializable_retry_after_a_lost_report_reads_the_new_input(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Finding F7 of the model check (docs/model-check.md): the first attempt publishes, its
    report is lost, a sibling then rewrites the folder it read. The retry's workspace starts
    from the first attempt's input ref (to replace that publication), but its inputs are read
    at the head it starts from: it publishes, from the sibling's data, in place of the first."""
    stub = StubOrchestrator(gate_timeout=20)
    stub.fail("report", applied=False)
    base = store.branch_head("repo", "main")
    with running(stub, store, tmp_path):
        wid = submit(stub, "month_report_serializable", retries=1)
        first = stub.attempts(wid)[0].task_id
        stub.wait_for(lambda s: len(s.reports(first)) == 1)
        assert stub.task(first).status == "IN_PROGRESS"
        _sibling_publishes_facts.done = False  # type: ignore[attr-defined]
        _sibling_publishes_facts(store)
        stub.time_out(first)
        outcome = settle(stub, wid)
    assert outcome.status == "COMPLETED", outcome.reason
    assert outcome.output["result"]["rows"] == 5
    head = store.get_commit("repo", outcome.output["workspace"]["ref"])
    assert outcome.output["inputs"]["facts"]["commit"] == head.parents[0]
    assert head.metadata.get("perago.replaces"), "the retry replaced the first publication"
    # one publication of the step in effect: the report's text is the retry's
    tree = store.tree("repo", head.id)
    assert tree["reports/month=01/report.txt"] == b"5 rows; customers ann,bob"
    assert base != head.id


@pytest.mark.parametrize("backend", ["none", "memory"])
def test_a_serializable_task_without_branch_leases_is_refused_at_start_up(
    tmp_path: Path, backend: str
) -> None:
    """Serializable needs the read-set check and the merge to be one step: without a lease
    backend nothing makes them so (a hook may not run), so the worker refuses to start."""
    from perago.config import load
    from perago.errors import ConfigError
    from perago.worker import Worker

    settings = load(env={"PERAGO_WORK_DIR": str(tmp_path), "PERAGO_COORD_BACKEND": backend})
    make = lambda: Worker(  # noqa: E731
        [month_report_serializable],
        settings=settings,
        store=MemoryStore(),
        orchestrator=StubOrchestrator(),
    )
    if backend == "memory":
        make()
        return
    with pytest.raises(ConfigError) as e:
        make()
    assert "PERAGO_COORD_BACKEND=none" in e.value.message
    assert (
        'isolation="snapshot"' in e.value.message and "month_report_serializable" in e.value.message
    )


def test_a_write_audit_publish_publication_records_what_its_read_only_audit_read(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Issue 40: a read-only step (an audit) publishes nothing, so its reads are recorded by
    the publication that follows it, from its output in the orchestrator."""
    from perago import wap

    stub = StubOrchestrator(gate_timeout=20)
    with running_worker(
        [*TASKS, wap.perago_wap_begin, wap.perago_wap_publish],
        store=store,
        orchestrator=stub,
        work_dir=tmp_path / "work",
    ):

        def step(name: str, ref: str, body: dict[str, Any]) -> Outcome:
            stub.submit(name, body, workflow_id="wap", reference_name=ref)
            outcome = settle(stub, "wap")
            assert outcome.status == "COMPLETED", outcome.reason
            return outcome

        begin = step(wap.BEGIN, "begin", {"workspace": {"repository": "repo", "branch": "main"}})
        ws = begin.output["workspace"]
        report = step("month_report", "report", {"workspace": ws, "params": {"month": "02"}})
        audit = step(
            "month_peek",
            "audit",
            {"workspace": report.output["workspace"], "params": {"month": "02"}},
        )
        params = {"target_branch": "main", "base": begin.output["result"]["base"]}
        published = step(
            wap.PUBLISH, "publish", {"workspace": audit.output["workspace"], "params": params}
        )
    recorded = ResolvedInput.from_metadata(
        store.get_commit("repo", published.output["workspace"]["ref"]).metadata
    )
    assert (
        recorded["audit.facts"]
        == f"repo@{audit.output['inputs']['facts']['commit']}/clean/month=02/"
    )
    assert set(recorded) == {"report.customers", "report.facts", "audit.customers", "audit.facts"}
