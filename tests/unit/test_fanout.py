"""Fan-out publication: scopes, templated prefixes, the fence over a head's history, markers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from perago._api.prefix_templates import render_prefix, template_fields
from perago._api.task import WorkspaceSpec, task
from perago.adapters.conductor import TaskSnapshot
from perago.core.step_lineage import ParentStep, ParentSteps, step_lineage
from perago.core.store import Commit
from perago.errors import ConflictError, GuardrailError, PublishFenceError, TaskDefinitionError
from perago.publish import AttemptIdentity, HeadDecision, Publisher, WorkspaceTarget
from perago.publish import decide_publication as decide
from perago.publish.joins import check_contains, unpinned_input_ref
from perago.publish.scope import overlaps, scope_markers
from perago.testing import MemoryStore, StaticLedger
from perago.workspace import Diff


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("a/", "a/b/", True),
        ("a/b/", "a/", True),
        ("a/", "a/", True),
        ("a/", "ab/", False),
        ("a/b/", "a/c/", False),
        ("events/day=1/", "events/day=10/", False),
        ("", "x/", True),
        (None, "x/", True),
    ],
)
def test_scopes_overlap_by_path_segment(a: str | None, b: str | None, expected: bool) -> None:
    assert overlaps(a, b) is expected


def test_templated_prefix_renders_one_safe_segment_per_field() -> None:
    assert template_fields("events/day={day}/h={hour}/") == ("day", "hour")
    assert render_prefix("events/day={day}/", {"day": "2024-01-31"}) == "events/day=2024-01-31/"
    for bad in ["..", "a/b", "", ".hidden", "x" * 200, "a\\b"]:
        with pytest.raises(GuardrailError, match="one path segment"):
            render_prefix("events/day={day}/", {"day": bad})
    with pytest.raises(GuardrailError, match="needs params field"):
        render_prefix("events/day={day}/", {})


class Day(BaseModel):
    day: str


class Out(BaseModel):
    n: int = 0


def test_a_templated_prefix_needs_its_fields_in_the_params_model() -> None:
    @task("fanout_day", workspace=WorkspaceSpec(prefix="events/day={day}/"))
    def ok(workspace: Path, params: Day) -> Out:
        return Out()

    assert ok.workspace.render(Day(day="d1")) == "events/day=d1/"
    with pytest.raises(TaskDefinitionError, match=r"\['day'\]"):

        @task("fanout_bad", workspace=WorkspaceSpec(prefix="events/day={day}/"))
        def bad(workspace: Path, params: Out) -> Out:
            return Out()

    for template in ["events/{day.x}/", "events/{day!r}/", "events/{0}/", "events/{day/"]:
        with pytest.raises(TaskDefinitionError):
            WorkspaceSpec(prefix=template)


def test_markers_conflict_exactly_for_overlapping_scopes_from_one_input_ref() -> None:
    def changes(scope: str, claim: bytes, ref: str = "R") -> dict[str, bytes]:
        return scope_markers(ref, scope, claim)

    def conflict(x: dict[str, bytes], y: dict[str, bytes]) -> bool:
        return any(p in y and y[p] != v for p, v in x.items())

    assert not conflict(changes("a/b/", b"1"), changes("a/c/", b"2"))  # siblings
    assert conflict(changes("a/", b"1"), changes("a/b/", b"2"))  # ancestor
    assert conflict(changes("a/b/", b"1"), changes("a/b/", b"2"))  # same scope
    assert conflict(changes("", b"1"), changes("x/", b"2"))  # the root scope
    assert not conflict(changes("a/", b"1", "R1"), changes("a/", b"2", "R2"))  # other refs


def ident(ref: str, scope: str | None, task_id: str = "", retry: int = 0) -> AttemptIdentity:
    return AttemptIdentity("wf", ref, task_id or f"t-{ref}-{retry}", retry, 1, "tt", scope=scope)


LEFT, RIGHT, WIDE = ident("left", "a/l/"), ident("right", "a/r/"), ident("wide", "a/")


def chain(*owners: AttemptIdentity | None) -> list[Commit]:
    """A first-parent history on top of input ref ``R``, newest first."""
    commits, parent = [], "R"
    for i, owner in enumerate(owners):
        meta = owner.metadata("R", kind="publication") if owner else {}
        commits.append(Commit(f"c{i}", (parent, f"s{i}"), metadata=meta))
        parent = f"c{i}"
    return [*reversed(commits), Commit("R")]


def test_the_fence_publishes_beside_disjoint_publications() -> None:
    history = chain(LEFT, ident("other", "b/"))
    assert decide(history[0], "R", RIGHT, history) is HeadDecision.BESIDE
    one = chain(LEFT)
    assert decide(one[0], "R", RIGHT) is HeadDecision.BESIDE  # the head sits on R


@pytest.mark.parametrize(
    ("owners", "me", "needle"),
    [
        ((LEFT, RIGHT), WIDE, "step 'right' (scope 'a/r/')"),
        ((None, LEFT), RIGHT, "not Perago"),
        ((LEFT, ident("legacy", None)), RIGHT, "step 'legacy'"),
        ((ident("left", "a/l/", retry=2), RIGHT), ident("left", "a/l/", retry=1), "a later"),
    ],
    ids=["overlap", "foreign", "unknown-scope", "later-attempt-under-sibling"],
)
def test_the_fence_fails_closed_naming_the_step_or_foreign_commit(
    owners: tuple[AttemptIdentity | None, ...], me: AttemptIdentity, needle: str
) -> None:
    history = chain(*owners)
    with pytest.raises(PublishFenceError, match="refusing") as e:
        decide(history[0], "R", me, history)
    assert needle in str(e.value)


def test_an_earlier_attempt_under_siblings_is_a_scoped_replacement() -> None:
    history = chain(ident("left", "a/l/", retry=0), RIGHT)
    me = ident("left", "a/l/", retry=1)
    assert decide(history[0], "R", me, history) is HeadDecision.SCOPED_REPLACE


def test_own_publication_under_siblings_is_landed_and_a_rewritten_branch_fails() -> None:
    history = chain(RIGHT, LEFT)
    assert decide(history[0], "R", RIGHT, history) is HeadDecision.LANDED
    # The walk reached the branch's first commit without meeting R: the branch was rewritten.
    rewritten = [*history[:-2], Commit(history[-2].id, (), metadata=history[-2].metadata)]
    with pytest.raises(PublishFenceError, match="reset or rewritten since"):
        decide(rewritten[0], "R", ident("x", "z/"), rewritten)


def snap(me: AttemptIdentity) -> TaskSnapshot:
    return TaskSnapshot(
        me.task_id,
        "tt",
        me.reference_name,
        me.workflow_id,
        "IN_PROGRESS",
        me.retry_count,
        me.poll_count,
        "w",
        60,
        {},
    )


class _MergeBarrier(MemoryStore):
    """Both publishers reach the merge having passed the fence on the same head."""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=10)

    def merge(self, *args: object, **kwargs: object) -> str:
        self.barrier.wait()
        return super().merge(*args, **kwargs)  # type: ignore[arg-type]


def _race(tmp_path: Path, a: AttemptIdentity, b: AttemptIdentity) -> tuple[MemoryStore, dict]:
    store = _MergeBarrier()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    results: dict[str, object] = {}

    def run(me: AttemptIdentity) -> None:
        ws = tmp_path / me.reference_name
        ws.mkdir()
        (ws / "part.txt").write_text(me.reference_name)
        pub = Publisher(store, StaticLedger(snap(me)), worker_id="w")
        target = WorkspaceTarget("r", "main", base)
        try:
            results[me.reference_name] = pub.publish(
                me, target, me.scope or "", ws, Diff(added=("part.txt",))
            ).ref
        except PublishFenceError as e:
            results[me.reference_name] = e

    threads = [threading.Thread(target=run, args=(me,)) for me in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return store, results


def test_racing_disjoint_merges_both_land(tmp_path: Path) -> None:
    store, results = _race(tmp_path, LEFT, RIGHT)
    assert all(isinstance(r, str) for r in results.values()), results
    tree = store.tree("r", "main")
    assert tree["a/l/part.txt"] == b"left" and tree["a/r/part.txt"] == b"right"


def test_racing_overlapping_merges_one_loses_in_the_store(tmp_path: Path) -> None:
    _, results = _race(tmp_path, LEFT, WIDE)
    lost = [r for r in results.values() if isinstance(r, PublishFenceError)]
    assert len(lost) == 1 and "lakeFS rejected the merge" in str(lost[0])
    assert isinstance(lost[0].__cause__, ConflictError)


def test_a_serial_fan_out_publishes_beside_and_a_noop_completes_on_its_input_ref(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    target = WorkspaceTarget("r", "main", base)
    refs = []
    for me in (LEFT, RIGHT):
        ws = tmp_path / me.reference_name
        ws.mkdir()
        (ws / "part.txt").write_text(me.reference_name)
        pub = Publisher(store, StaticLedger(snap(me)), worker_id="w")
        refs.append(pub.publish(me, target, me.scope or "", ws, Diff(added=("part.txt",))).ref)
    head = store.get_commit("r", "main")
    assert refs[1] == head.id and head.parents[0] == refs[0]
    noop = ident("noop", "c/")
    pub = Publisher(store, StaticLedger(snap(noop)), worker_id="w")
    assert pub.publish(noop, target, "c/", tmp_path, Diff()).ref == base
    assert store.branch_head("r", "main") == head.id
    with pytest.raises(PublishFenceError, match=r"step 'right' .scope 'a/r/'.* overlapping"):
        wide = ident("wide", "a/")
        ws = tmp_path / "wide"
        ws.mkdir()
        (ws / "x.txt").write_text("x")
        Publisher(store, StaticLedger(snap(wide)), worker_id="w").publish(
            wide, target, "a/", ws, Diff(added=("x.txt",))
        )


def test_a_join_starts_only_from_a_head_holding_every_after_ref() -> None:
    store = MemoryStore()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    store.upload_bytes("r", "main", "x/1", b"1")
    first = store.commit("r", "main", message="1", metadata={}).id
    store.create_branch("r", "side", base)
    store.upload_bytes("r", "side", "y/1", b"1")
    elsewhere = store.commit("r", "side", message="side", metadata={}).id
    check_contains(store, "r", "main", first, [base, first])
    with pytest.raises(GuardrailError, match="does not contain") as e:
        check_contains(store, "r", "main", first, [first, elsewhere])
    assert e.value.non_retryable
    with pytest.raises(GuardrailError, match="does not exist"):
        check_contains(store, "r", "main", first, ["nope"])


def _publish_part(
    store: MemoryStore, me: AttemptIdentity, tmp_path: Path, base: str, files: dict[str, str]
) -> str:
    ws = tmp_path / f"{me.task_id}-{len(list(tmp_path.iterdir()))}"
    ws.mkdir()
    for name, body in files.items():
        (ws / name).write_text(body)
    pub = Publisher(store, StaticLedger(snap(me)), worker_id="w")
    target = WorkspaceTarget("r", "main", base)
    return pub.publish(me, target, me.scope or "", ws, Diff(added=tuple(files))).ref


@pytest.mark.parametrize("noop", [False, True], ids=["changed", "noop"])
def test_a_retry_under_a_sibling_replaces_its_scope_without_undoing_the_sibling(
    tmp_path: Path, noop: bool
) -> None:
    store = MemoryStore()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    first = ident("left", "a/l/", task_id="l0", retry=0)
    abandoned = _publish_part(store, first, tmp_path, base, {"x.txt": "first", "old.txt": "o"})
    sibling = _publish_part(store, RIGHT, tmp_path, base, {"y.txt": "right"})
    retry = ident("left", "a/l/", task_id="l1", retry=1)
    out = _publish_part(store, retry, tmp_path, base, {} if noop else {"x.txt": "retry"})
    head = store.get_commit("r", "main")
    assert out == head.id and head.parents[0] == sibling
    assert head.metadata["perago.replaces"] == abandoned
    tree = store.tree("r", "main")
    assert tree["a/r/y.txt"] == b"right"  # the sibling's publication is kept
    data = {p: v for p, v in tree.items() if p.startswith("a/l/")}
    assert data == ({} if noop else {"a/l/x.txt": b"retry"})  # the scope is the retry's tree
    history = [c.id for c in store.log("r", "main", amount=10)]
    assert abandoned in history  # reachable, never reset away
    assert store.list_branches("r", prefix="perago-stg-") == []


def test_an_unpinned_retry_under_a_sibling_starts_from_its_earlier_attempts_input(
    tmp_path: Path,
) -> None:
    """Without ``ref`` a retry would start from the head (the sibling's publication) and
    publish its step a second time beside the abandoned one; it pins the earlier attempt's
    input ref instead, so the fence sees a scoped replacement."""

    class Counting(MemoryStore):
        logs = 0

        def log(self, *args: Any, **kwargs: Any) -> Any:
            self.logs += 1
            return super().log(*args, **kwargs)

    store = Counting()
    store.create_repository("r")
    base = store.branch_head("r", "main")
    first = ident("left", "a/l/", task_id="l0", retry=0)
    _publish_part(store, first, tmp_path, base, {"x.txt": "first"})
    sibling = _publish_part(store, RIGHT, tmp_path, base, {"y.txt": "right"})
    retry = ident("left", "a/l/", task_id="l1", retry=1)
    assert unpinned_input_ref(store, "r", sibling, retry) == base
    out = _publish_part(store, retry, tmp_path, base, {"x.txt": "retry"})
    assert store.get_commit("r", out).metadata["perago.replaces"]
    # another step's retry, and a first attempt (which reads nothing), start from the head
    assert unpinned_input_ref(store, "r", out, ident("other", "b/", retry=1)) == out
    before = store.logs
    assert unpinned_input_ref(store, "r", out, ident("new", "c/")) == out
    assert store.logs == before


class _Parents:
    """Conductor's parent links of a root workflow, its child, and the retried child."""

    def __init__(self) -> None:
        self.links = {
            "child-1": ParentStep("root", "sub", 0),
            "child-2": ParentStep("root", "sub", 1),
            "grandchild": ParentStep("child-2", "inner", 0),
        }

    def parent_step(self, workflow_id: str) -> ParentStep | None:
        return self.links.get(workflow_id)


def test_a_step_of_a_retried_sub_workflow_is_the_same_logical_step() -> None:
    source = _Parents()
    assert isinstance(source, ParentSteps)
    assert step_lineage(source, "root", "a") == (None, ())
    assert step_lineage(source, "grandchild", "w") == ("root/sub/inner/w", (1, 0))

    def child(wf: str, task_id: str, retry: int = 0) -> AttemptIdentity:
        key, retries = step_lineage(source, wf, "write")
        return AttemptIdentity(
            wf, "write", task_id, retry, 1, "tt", scope="a/", step_key=key, lineage_retries=retries
        )

    first, again = child("child-1", "t1", retry=2), child("child-2", "t2")
    published = Commit("head", ("R",), metadata=first.metadata("R", kind="publication"))
    assert AttemptIdentity.from_commit(published) == first
    assert again.is_earlier_attempt_of_same_step(first)
    assert not first.is_earlier_attempt_of_same_step(again)
    assert decide(published, "R", again) is HeadDecision.REPLACE
    with pytest.raises(PublishFenceError, match="refusing"):
        decide(Commit("head", ("R",), metadata=again.metadata("R")), "R", first)
