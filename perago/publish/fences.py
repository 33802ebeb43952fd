"""The two fences: is this attempt still ours (Conductor), may it move the target (lakeFS)?

Both fail closed: a state the Conductor attempt and the lakeFS head cannot explain is an
error, never a guess.
"""

from __future__ import annotations

import enum

from perago.errors import AttemptFenceError, PublishFenceError
from perago.orchestrator import IN_PROGRESS, AttemptLedger
from perago.publish.identity import AttemptIdentity
from perago.store import Commit

__all__ = ["AttemptLedger", "HeadDecision", "check_attempt", "decide_publication"]


def check_attempt(ledger: AttemptLedger, me: AttemptIdentity, *, worker_id: str) -> None:
    """Attempt fence: re-read the task; it must still be this very delivery, in progress.

    The server accepts updates from stale workers silently, so its answer to an update never
    proves anything: only a fresh read does.
    """
    current = ledger.get_task(me.task_id)
    if current is None:
        raise AttemptFenceError(
            f"attempt fence: task {me.task_id} is unknown to Conductor; this attempt is stale "
            "and publishes nothing"
        )
    problems = []
    if current.status != IN_PROGRESS:
        problems.append(f"status is {current.status}")
    if current.workflow_id != me.workflow_id:
        problems.append(f"workflow is {current.workflow_id}")
    if current.retry_count != me.retry_count:
        problems.append(f"retry count is {current.retry_count}")
    if current.poll_count != me.poll_count:
        problems.append(f"it was delivered again (poll count {current.poll_count})")
    if current.worker_id and current.worker_id != worker_id:
        problems.append(f"it belongs to worker {current.worker_id}")
    if problems:
        raise AttemptFenceError(
            f"attempt fence: task {me.task_id} (retry {me.retry_count}) is no longer this "
            f"attempt's: {', '.join(problems)}. Conductor has moved on (timeout or retry); "
            "nothing was published by this attempt"
        )


class HeadDecision(enum.Enum):
    FIRST = "first_publication"  # head == input ref: merge
    REPLACE = "replacement_publication"  # head is an abandoned publication of this step
    LANDED = "already_landed"  # head is this very attempt's publication (answer was lost)


def decide_publication(head: Commit, input_ref: str, me: AttemptIdentity) -> HeadDecision:
    """Publish fence on the target head the attempt just read."""
    if head.id == input_ref:
        return HeadDecision.FIRST
    owner = AttemptIdentity.from_commit(head)
    if owner is not None and owner.same_attempt(me):
        return HeadDecision.LANDED
    if head.parents and head.parents[0] == input_ref:
        if owner is not None and me.is_earlier_attempt_of_same_step(owner):
            return HeadDecision.REPLACE
        who = (
            f"attempt {owner.task_id} (retry {owner.retry_count}) of workflow "
            f"{owner.workflow_id} step {owner.reference_name!r}"
            if owner
            else "a writer that is not Perago"
        )
        raise PublishFenceError(
            f"publish fence: the target head {head.id[:12]} sits on the input ref but was "
            f"written by {who}, not by an earlier attempt of this step; refusing to replace "
            "it. Check who writes this branch (one writer per step and branch is assumed)"
        )
    raise PublishFenceError(
        f"publish fence: the target branch moved from the input ref {input_ref[:12]} to "
        f"{head.id[:12]}, which is neither the input ref nor an abandoned publication of this "
        "step; nothing was published. Re-run the workflow from the new head"
    )
