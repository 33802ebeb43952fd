"""Incremental re-runs (issue 40): an incremental step whose inputs, params and code did
not change since its last publication, onto a scope nobody changed, is not run again; any
change runs it. A generated sequence of edits and re-runs checks that a skip never hides
a change: after every run each partition's output is what a run from scratch gives."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from perago import Inputs, TaskDefinitionError, WorkspaceSpec, task
from perago.core.orchestrator import Outcome
from perago.telemetry import metrics
from perago.testing import MemoryStore, StubOrchestrator, running_worker

PARTS = ("a", "b")


class Part(BaseModel):
    part: str
    factor: int = 1


class Total(BaseModel):
    part: str
    total: int


#: The bodies that ran: (task type, part).
RUNS: list[tuple[str, str]] = []
LOCK = threading.Lock()


def expected(values: str, dim: str, factor: int, version: str) -> str:
    """What a run from scratch writes: the function the incremental task promises."""
    total = sum(int(v) for v in values.split()) * factor + int(dim)
    return f"{total} {version}\n"


def _body(version: str) -> Any:
    def body(workspace: Path, params: Part, inputs: Inputs[Path]) -> Total:
        with LOCK:
            RUNS.append((version, params.part))
        values = (inputs["src"] / "values.txt").read_text()
        dim = (inputs["dim"] / "dim.txt").read_text()
        text = expected(values, dim, params.factor, version)
        (workspace / "total.txt").write_text(text)
        return Total(part=params.part, total=int(text.split()[0]))

    return body


SPEC = WorkspaceSpec(prefix="out/p={part}/", inputs={"src": "src/p={part}/", "dim": "dims/"})
v1 = task("inc_total", workspace=SPEC, incremental=True, code_version="v1")(_body("v1"))
v2 = task("inc_total", workspace=SPEC, incremental=True, code_version="v2")(_body("v2"))
plain = task("inc_plain", workspace=SPEC)(_body("plain"))


def seed(store: MemoryStore) -> None:
    store.create_repository("repo")
    for part in PARTS:
        store.upload_bytes("repo", "main", f"src/p={part}/values.txt", b"1 2")
    store.upload_bytes("repo", "main", "dims/dim.txt", b"10")
    store.commit("repo", "main", message="seed", metadata={})


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    RUNS.clear()
    s = MemoryStore()
    seed(s)
    yield s


def edit(store: MemoryStore, path: str, text: str) -> None:
    store.upload_bytes("repo", "main", path, text.encode())
    store.commit("repo", "main", message=f"edit {path}", metadata={})


def run(
    store: MemoryStore,
    tmp_path: Path,
    version: Any = v1,
    *,
    parts: tuple[str, ...] = PARTS,
    factor: int = 1,
    **extra: Any,
) -> dict[str, Outcome]:
    stub = StubOrchestrator()
    out = {}
    tasks = [version] if version is plain else [version, plain]
    with running_worker(tasks, store=store, orchestrator=stub, work_dir=tmp_path):
        for part in parts:
            body = {
                "workspace": {"repository": "repo", "branch": "main"},
                "params": {"part": part, "factor": factor},
                **extra,
            }
            stub.submit(version.name, body, workflow_id=f"wf-{part}", reference_name=f"p_{part}")
            stub.wait_for(lambda s, part=part: s.settled(f"wf-{part}"))
            outcome = stub.outcome(stub.final(f"wf-{part}").task_id)
            assert outcome is not None
            out[part] = outcome
    return out


def ran() -> list[str]:
    parts = [part for _, part in RUNS]
    RUNS.clear()
    return parts


def text(store: MemoryStore, path: str) -> str:
    import io

    buf = io.BytesIO()
    store.download("repo", "main", path, buf)
    return buf.getvalue().decode()


def test_an_unchanged_step_is_reused_and_answers_what_it_answered(
    store: MemoryStore, tmp_path: Path
) -> None:
    first = run(store, tmp_path)
    assert ran() == ["a", "b"]
    published = store.get_commit("repo", store.branch_head("repo", "main"))
    assert published.metadata["perago.code_version"] == "v1"
    reused_before = metrics.STEPS_REUSED.labels("inc_total")._value.get()  # type: ignore[attr-defined]
    again = run(store, tmp_path)
    assert ran() == []  # no body ran
    assert store.branch_head("repo", "main") == published.id  # nothing published
    for part in PARTS:
        outcome = again[part]
        assert outcome.status == "COMPLETED", outcome.reason
        assert outcome.output["result"] == first[part].output["result"]
        assert outcome.output["workspace"]["ref"] == published.id
        assert outcome.output["reused"]["workflow_id"] == f"wf-{part}"
        assert outcome.output["inputs"]["src"]["prefix"] == f"src/p={part}/"
    assert outcome.output["reused"]["commit"] == first["b"].output["workspace"]["ref"]
    reused = metrics.STEPS_REUSED.labels("inc_total")._value.get() - reused_before  # type: ignore[attr-defined]
    assert reused == 2


def test_each_change_runs_exactly_the_steps_it_touches(store: MemoryStore, tmp_path: Path) -> None:
    run(store, tmp_path)
    assert ran() == ["a", "b"]
    edit(store, "src/p=a/values.txt", "1 2 3")  # one partition's facts
    run(store, tmp_path)
    assert ran() == ["a"]
    edit(store, "dims/dim.txt", "20")  # the shared dimension
    run(store, tmp_path)
    assert ran() == ["a", "b"]
    run(store, tmp_path, parts=("b",), factor=2)  # params
    assert ran() == ["b"]
    run(store, tmp_path, v2, parts=("a",))  # the code
    assert ran() == ["a"]
    edit(store, "out/p=a/total.txt", "tampered")  # a foreign edit of one output
    run(store, tmp_path, v2, parts=("a",))
    assert ran() == ["a"]
    assert text(store, "out/p=a/total.txt") == expected("1 2 3", "20", 1, "v2")
    run(store, tmp_path, v2, parts=("a",), recompute=True)  # the workflow forces a run
    assert ran() == ["a"]
    run(store, tmp_path, v2, parts=("a",))
    assert ran() == []


def test_a_task_that_is_not_incremental_always_runs(store: MemoryStore, tmp_path: Path) -> None:
    run(store, tmp_path, plain, parts=("a",))
    run(store, tmp_path, plain, parts=("a",))
    assert ran() == ["a", "a"]
    head = store.get_commit("repo", store.branch_head("repo", "main"))
    assert "perago.params_digest" not in head.metadata


def test_a_bad_recompute_value_is_refused_before_anything_runs(
    store: MemoryStore, tmp_path: Path
) -> None:
    [outcome] = run(store, tmp_path, parts=("a",), recompute="yes").values()
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    assert '"recompute" must be true or false' in outcome.reason
    assert ran() == []


def test_incremental_options_are_checked_at_import() -> None:
    with pytest.raises(TaskDefinitionError, match="read-only task makes no sense"):
        task("inc_ro", workspace=WorkspaceSpec(prefix="x/", read_only=True), incremental=True)
    with pytest.raises(TaskDefinitionError, match="only read by incremental tasks"):
        task("inc_cv", workspace=WorkspaceSpec(prefix="x/"), code_version="1")
    assert plain.code_version.startswith("src:")  # the module's source stands in


EDITS = st.lists(
    st.one_of(
        st.tuples(st.just("values"), st.sampled_from(PARTS), st.sampled_from(["1 2", "3", "4 4"])),
        st.tuples(st.just("dim"), st.just(""), st.sampled_from(["10", "20"])),
        st.tuples(st.just("factor"), st.just(""), st.sampled_from(["1", "3"])),
        st.tuples(st.just("code"), st.just(""), st.sampled_from(["v1", "v2"])),
        st.tuples(st.just("foreign"), st.sampled_from(PARTS), st.just("tampered")),
        st.tuples(st.just("rerun"), st.just(""), st.just("")),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(edits=EDITS)
def test_a_skip_never_hides_a_change(tmp_path: Path, edits: list[tuple[str, str, str]]) -> None:
    """After each edit and re-run, every partition's output equals a run from scratch."""
    RUNS.clear()
    store = MemoryStore()
    seed(store)
    state = {"values": dict.fromkeys(PARTS, "1 2"), "dim": "10", "factor": 1, "code": "v1"}
    versions = {"v1": v1, "v2": v2}
    run(store, tmp_path, v1)
    for kind, part, value in edits:
        if kind == "values":
            state["values"][part] = value  # type: ignore[index]
            edit(store, f"src/p={part}/values.txt", value)
        elif kind == "dim":
            state["dim"] = value
            edit(store, "dims/dim.txt", value)
        elif kind == "factor":
            state["factor"] = int(value)
        elif kind == "code":
            state["code"] = value
        elif kind == "foreign":
            edit(store, f"out/p={part}/total.txt", value)
        run(store, tmp_path, versions[str(state["code"])], factor=int(state["factor"]))  # type: ignore[call-overload]
        for p in PARTS:
            want = expected(
                state["values"][p], str(state["dim"]), int(state["factor"]), str(state["code"])
            )  # type: ignore[index, call-overload]
            assert text(store, f"out/p={p}/total.txt") == want, (kind, part, value)


def _wap_run(store: MemoryStore, tmp_path: Path, n: int) -> dict[str, Outcome]:
    from perago import wap

    stub = StubOrchestrator()
    out = {}
    with running_worker(
        [v1, wap.perago_wap_begin, wap.perago_wap_publish],
        store=store,
        orchestrator=stub,
        work_dir=tmp_path,
    ):

        def step(name: str, body: dict[str, Any], wid: str) -> Outcome:
            stub.submit(name, body, workflow_id=wid, reference_name=wid.split("-")[0])
            stub.wait_for(lambda s: s.settled(wid))
            outcome = stub.outcome(stub.final(wid).task_id)
            assert outcome is not None and outcome.status == "COMPLETED", outcome
            return outcome

        begin = step(wap.BEGIN, {"workspace": {"repository": "repo", "branch": "main"}}, f"b-{n}")
        for part in PARTS:
            body = {"workspace": begin.output["workspace"], "params": {"part": part}}
            out[part] = step(v1.name, body, f"p_{part}-{n}")
        params = {"target_branch": "main", "base": begin.output["result"]["base"]}
        source = {**begin.output["workspace"], "ref": out[PARTS[-1]].output["workspace"]["ref"]}
        out["publish"] = step(wap.PUBLISH, {"workspace": source, "params": params}, f"pub-{n}")
    return out


def test_write_audit_publish_steps_find_their_publications_through_the_kept_history(
    store: MemoryStore, tmp_path: Path
) -> None:
    """The isolated branch is deleted after publishing; its history stays under a tag that
    the publication on main names, so the next run's steps find what they published and
    the input commits they recorded stay resolvable."""
    first = _wap_run(store, tmp_path, 1)
    assert ran() == ["a", "b"]
    head = store.get_commit("repo", store.branch_head("repo", "main"))
    tag = head.metadata["perago.wap_tag"]
    kept = store.get_tag("repo", tag)
    assert [b for b, _ in store.list_branches("repo", prefix="perago-wap-")] == []
    recorded = store.get_commit("repo", first["a"].output["workspace"]["ref"])
    for location in recorded.metadata.values():
        if location.startswith("repo@"):
            store.get_commit("repo", location.partition("@")[2].partition("/")[0])
    assert store.log("repo", kept, amount=10)[0].id == kept
    again = _wap_run(store, tmp_path, 2)
    assert ran() == []
    assert again["a"].output["reused"]["commit"] == first["a"].output["workspace"]["ref"]
    assert store.branch_head("repo", "main") == head.id  # nothing changed: nothing published
