"""The publish-fence decision table and the attempt fence, on plain data."""

from __future__ import annotations

import pytest

from perago.core.orchestrator import TaskSnapshot
from perago.core.store import Commit
from perago.errors import AttemptFenceError, PublishFenceError
from perago.publish import AttemptIdentity, HeadDecision, check_attempt, decide_publication
from perago.publish.first_parents import FirstParents
from perago.testing import MemoryStore

ME = AttemptIdentity("wf-1", "clean", "task-2", retry_count=1, poll_count=1, task_type="t")
EARLIER = AttemptIdentity("wf-1", "clean", "task-1", retry_count=0, poll_count=1, task_type="t")
OTHER_WF = AttemptIdentity("wf-9", "clean", "task-9", retry_count=0, poll_count=1, task_type="t")
OTHER_STEP = AttemptIdentity("wf-1", "report", "task-8", retry_count=0, poll_count=1, task_type="t")
LATER = AttemptIdentity("wf-1", "clean", "task-3", retry_count=2, poll_count=1, task_type="t")


def head(parent: str, owner: AttemptIdentity | None) -> Commit:
    return Commit("head", (parent,), metadata=owner.metadata("in") if owner else {})


def test_head_at_input_ref_is_a_first_publication() -> None:
    assert decide_publication(Commit("in"), "in", ME) is HeadDecision.FIRST


def test_abandoned_publication_of_an_earlier_attempt_is_replaced() -> None:
    assert decide_publication(head("in", EARLIER), "in", ME) is HeadDecision.REPLACE


def test_own_publication_is_recognised_as_landed() -> None:
    assert decide_publication(head("in", ME), "in", ME) is HeadDecision.LANDED


@pytest.mark.parametrize(
    "owner",
    [None, OTHER_WF, OTHER_STEP, LATER],
    ids=["foreign", "other-workflow", "other-step", "later"],
)
def test_a_head_on_the_input_ref_not_ours_is_never_replaced(owner: AttemptIdentity | None) -> None:
    with pytest.raises(PublishFenceError, match="refusing to replace"):
        decide_publication(head("in", owner), "in", ME)


def test_a_head_elsewhere_fails_closed() -> None:
    with pytest.raises(PublishFenceError, match="moved"):
        decide_publication(head("somewhere", EARLIER), "in", ME)


class Ledger:
    def __init__(self, snap: TaskSnapshot | None) -> None:
        self.snap = snap

    def get_task(self, task_id: str) -> TaskSnapshot | None:
        return self.snap


def snap(**kw: object) -> TaskSnapshot:
    base: dict[str, object] = dict(
        task_id="task-2",
        task_type="t",
        reference_name="clean",
        workflow_id="wf-1",
        status="IN_PROGRESS",
        retry_count=1,
        poll_count=1,
        worker_id="w",
        response_timeout_seconds=5,
        input={},
    )
    base.update(kw)
    return TaskSnapshot(**base)  # type: ignore[arg-type]


def test_attempt_fence_passes_for_the_same_delivery() -> None:
    check_attempt(Ledger(snap()), ME, worker_id="w")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"status": "TIMED_OUT"}, "status is TIMED_OUT"),
        ({"status": "COMPLETED"}, "status is COMPLETED"),
        ({"retry_count": 2}, "retry count is 2"),
        ({"poll_count": 2}, "delivered again"),
        ({"workflow_id": "wf-x"}, "workflow is wf-x"),
        ({"worker_id": "someone-else"}, "belongs to worker"),
    ],
)
def test_attempt_fence_rejects_anything_else(change: dict[str, object], needle: str) -> None:
    with pytest.raises(AttemptFenceError, match=needle):
        check_attempt(Ledger(snap(**change)), ME, worker_id="w")


def test_attempt_fence_rejects_an_unknown_task() -> None:
    with pytest.raises(AttemptFenceError, match="unknown"):
        check_attempt(Ledger(None), ME, worker_id="w")


def test_identity_round_trips_through_commit_metadata() -> None:
    assert AttemptIdentity.from_commit(Commit("c", metadata=ME.metadata("in"))) == ME
    assert AttemptIdentity.from_commit(Commit("c", metadata={"perago.task_id": "x"})) is None


def test_a_walk_cut_short_says_so_and_a_rewritten_branch_says_that() -> None:
    """Issue 26: 500 publications since the input ref were reported as a rewritten branch.
    The fence reads down to the input ref (issue 41), so a chain that stops short of it
    and of the branch's first commit is a caller's bug, and says so."""
    me = AttemptIdentity("wf", "step", "t1", 0, 1, "tt", scope="p=0/")
    siblings = [
        Commit(
            f"c{i}",
            (f"c{i + 1}",),
            metadata=AttemptIdentity(
                "wf", f"p{i}", f"s{i}", 0, 1, "tt", scope=f"p={i + 1}/"
            ).metadata("r0", kind="publication"),
        )
        for i in range(5)
    ]
    with pytest.raises(PublishFenceError, match="not among the 5 commits read") as cut:
        decide_publication(siblings[0], "r0", me, siblings)
    assert "This is a bug in the caller" in cut.value.message
    rooted = [*siblings[:4], Commit("c4", (), metadata=siblings[4].metadata)]
    with pytest.raises(PublishFenceError, match="reset or rewritten since"):
        decide_publication(rooted[0], "r0", me, rooted)


def test_the_fence_reads_any_number_of_sibling_publications_down_to_the_input_ref() -> None:
    """Issue 41: no ceiling. 6,000 disjoint sibling publications since the input ref (the
    fence used to stop at 5,000 and fail closed), walked through the fences' commit cache
    on a store, as the publisher walks them: the publication goes beside them, and an
    earlier attempt of this step deep under them is still found and replaced."""
    store = MemoryStore()
    store.create_repository("repo")
    input_ref = store.branch_head("repo", "main")
    for i in range(6000):
        owner = AttemptIdentity("wf", f"p{i}", f"s{i}", 0, 1, "tt", scope=f"parts/p={i}/")
        metadata = owner.metadata(input_ref, kind="publication")
        if i == 7:  # an earlier attempt of `me`, merged deep under the siblings
            earlier = AttemptIdentity("wf", "me", "t0", 0, 1, "tt", scope="parts/me/")
            store.create_branch("repo", "staging", "main")
            store.upload_bytes("repo", "staging", "parts/me/f", b"x")
            store.commit("repo", "staging", message="stage", metadata={})
            metadata = earlier.metadata(input_ref, kind="publication")
            store.merge("repo", "staging", "main", message="me", metadata=metadata)
            continue
        store.upload_bytes("repo", "main", f"parts/p={i}/f", b"x")
        store.commit("repo", "main", message=f"p{i}", metadata=metadata)
    first_parents = FirstParents(store)
    head = store.get_commit("repo", "main")
    chain = first_parents.chain("repo", head, stop_at=input_ref)
    assert len(chain) == 6001 and chain[-1].id == input_ref
    other = AttemptIdentity("wf", "other", "t9", 0, 1, "tt", scope="parts/other/")
    assert decide_publication(head, input_ref, other, chain) is HeadDecision.BESIDE
    me = AttemptIdentity("wf", "me", "t1", 1, 1, "tt", scope="parts/me/")
    assert decide_publication(head, input_ref, me, chain) is HeadDecision.SCOPED_REPLACE


def test_the_commit_cache_keeps_the_recently_used_and_reads_the_rest_again() -> None:
    """FirstParents' cache is a least-recently-used one of ``capacity`` commits: a chain
    longer than it is still walked whole, re-reading from lakeFS only what was evicted."""

    class CountingLog(MemoryStore):
        pages = 0

        def log(self, repository: str, ref: str, *, amount: int = 100) -> list[Commit]:
            CountingLog.pages += 1
            return super().log(repository, ref, amount=amount)

    store = CountingLog()
    store.create_repository("repo")
    input_ref = store.branch_head("repo", "main")
    for i in range(10):
        store.upload_bytes("repo", "main", f"f{i}", b"x")
        store.commit("repo", "main", message=f"c{i}", metadata={})
    first_parents = FirstParents(store, page=2, capacity=4)
    head = store.get_commit("repo", "main")
    chain = first_parents.chain("repo", head, stop_at=input_ref)
    assert [c.id for c in chain[:3]] == [c.id for c in store.log("repo", "main", amount=3)]
    assert len(chain) == 11 and chain[-1].id == input_ref
    walked = CountingLog.pages
    assert first_parents.chain("repo", head, stop_at=input_ref) == chain
    assert CountingLog.pages > walked, "evicted commits are read again"
    assert first_parents._get("repo", chain[-1].id) == chain[-1], "the last used is kept"
    assert first_parents._get("repo", chain[0].id) is None, "the least recently used went"
