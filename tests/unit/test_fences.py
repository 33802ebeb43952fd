"""The publish-fence decision table and the attempt fence, on plain data."""

from __future__ import annotations

import pytest

from perago.errors import AttemptFenceError, PublishFenceError
from perago.orchestrator import TaskSnapshot
from perago.publish import AttemptIdentity, HeadDecision, check_attempt, decide_publication
from perago.store import Commit

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


def test_a_walk_cut_at_its_limit_says_so_and_a_rewritten_branch_says_that() -> None:
    """Issue 26: 500 publications since the input ref were reported as a rewritten branch."""
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
    with pytest.raises(PublishFenceError, match="not among the newest 5 commits") as cut:
        decide_publication(siblings[0], "r0", me, siblings)
    assert "Split the fan-out into rounds" in cut.value.message
    rooted = [*siblings[:4], Commit("c4", (), metadata=siblings[4].metadata)]
    with pytest.raises(PublishFenceError, match="reset or rewritten since"):
        decide_publication(rooted[0], "r0", me, rooted)
