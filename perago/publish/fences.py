"""The two fences: is this attempt still ours (Conductor), may it move the target (lakeFS)?

Both fail closed: a state the Conductor attempt and the lakeFS head cannot explain is an
error, never a guess.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from perago.core.orchestrator import IN_PROGRESS, AttemptLedger, TaskSnapshot
from perago.core.store import Commit
from perago.errors import AttemptFenceError, PublishFenceError
from perago.publish.identity import AttemptIdentity
from perago.publish.scope import overlaps

__all__ = [
    "AttemptLedger",
    "HeadDecision",
    "check_attempt",
    "check_current",
    "decide_publication",
    "earlier_publications",
]


def check_attempt(ledger: AttemptLedger, me: AttemptIdentity, *, worker_id: str) -> None:
    """Attempt fence: re-read the task; it must still be this very delivery, in progress.

    The server accepts updates from stale workers silently, so its answer to an update never
    proves anything: only a fresh read does.
    """
    check_current(ledger.get_task(me.task_id), me, worker_id=worker_id)


def check_current(current: TaskSnapshot | None, me: AttemptIdentity, *, worker_id: str) -> None:
    """:func:`check_attempt` on a read of the task already made."""
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
    LANDED = "already_landed"  # this very attempt's publication is on the branch (answer lost)
    BESIDE = "disjoint_publication"  # only disjoint-scope publications since the input ref: merge
    #: an earlier attempt of this step published, disjoint siblings merged on top: revert it
    #: and merge this attempt's change, as one publication (never a reset over a sibling)
    SCOPED_REPLACE = "scoped_replacement"


def _who(owner: AttemptIdentity | None, commit: Commit) -> str:
    if owner is None:
        return f"a writer that is not Perago (commit {commit.id[:12]}, {commit.message[:60]!r})"
    return (
        f"attempt {owner.task_id} (retry {owner.retry_count}) of workflow {owner.workflow_id} "
        f"step {owner.reference_name!r} (scope {owner.scope!r})"
    )


def decide_publication(
    head: Commit, input_ref: str, me: AttemptIdentity, history: Sequence[Commit] = ()
) -> HeadDecision:
    """Publish fence on the target head the attempt just read.

    ``history`` is the head's first-parent chain, newest first (``history[0]`` is the head),
    reaching back at least to the input ref; without it only the serial rules apply. The
    head may have moved past the input ref only through Perago publications of scopes
    disjoint from this attempt's (a fan-out); anything else fails closed, naming the
    overlapping step or the foreign commit.
    """
    if head.id == input_ref:
        return HeadDecision.FIRST
    owner = AttemptIdentity.from_commit(head)
    if owner is not None and owner.same_attempt(me):
        return HeadDecision.LANDED
    if (
        head.parents
        and head.parents[0] == input_ref
        and owner is not None
        and me.is_earlier_attempt_of_same_step(owner)
    ):
        return HeadDecision.REPLACE
    chain = list(history)
    if not chain or chain[0].id != head.id:
        chain = [head]
    if len(chain) == 1 and head.parents[:1] != (input_ref,):
        raise PublishFenceError(
            f"publish fence: the target branch moved from the input ref {input_ref[:12]} to "
            f"{head.id[:12]}, which is neither the input ref nor an abandoned publication of "
            "this step; nothing was published. Re-run the workflow from the new head"
        )
    earlier = False
    for commit in chain:
        if commit.id == input_ref:
            return HeadDecision.SCOPED_REPLACE if earlier else HeadDecision.BESIDE
        owner = AttemptIdentity.from_commit(commit)
        if owner is not None and owner.same_attempt(me):
            return HeadDecision.LANDED
        if (
            owner is not None
            and me.is_earlier_attempt_of_same_step(owner)
            and commit.metadata.get("perago.kind") == "publication"
            and len(commit.parents) == 2
        ):
            earlier = True
            continue
        if owner is None or overlaps(owner.scope, me.scope) or owner.same_step(me):
            return _refuse(head, input_ref, me, commit, owner)
    if len(chain) == 1:  # the head sits right on the input ref
        return HeadDecision.SCOPED_REPLACE if earlier else HeadDecision.BESIDE
    if chain[-1].parents:  # a caller's walk stopped short of the branch's first commit
        raise PublishFenceError(
            f"publish fence: the input ref {input_ref[:12]} is not among the {len(chain)} "
            f"commits read under the target head {head.id[:12]}, and the walk stopped before "
            "the branch's first commit; nothing was published. This is a bug in the caller "
            "(the fence reads down to the input ref): report it with this message"
        )
    raise PublishFenceError(
        f"publish fence: the input ref {input_ref[:12]} is not on the first-parent history of "
        f"the target head {head.id[:12]} (all {len(chain)} commits read): the branch was reset "
        "or rewritten since; nothing was published. Re-run the workflow from the new head"
    )


def _refuse(
    head: Commit,
    input_ref: str,
    me: AttemptIdentity,
    commit: Commit,
    owner: AttemptIdentity | None,
) -> HeadDecision:
    if owner is not None and owner.same_step(me):
        why = (
            "a later attempt of this step, or an earlier one that was not published by a "
            "merge (only merged publications are reverted under sibling publications)"
        )
    elif owner is not None:
        why = f"overlapping this step's scope {me.scope!r}, not by an earlier attempt of this step"
    else:
        why = "not by an earlier attempt of this step"
    where = (
        "the target head"
        if commit.id == head.id
        else f"commit {commit.id[:12]} under the target head {head.id[:12]}"
    )
    raise PublishFenceError(
        f"publish fence: {where} (published since the input ref {input_ref[:12]}) was "
        f"written by {_who(owner, commit)}, {why}; refusing to replace it or publish beside "
        "it. Check who writes this branch (overlapping scopes need one writer at a time)"
    )


def earlier_publications(
    history: Sequence[Commit], input_ref: str, me: AttemptIdentity
) -> list[Commit]:
    """The merged publications of earlier attempts of this step since the input ref, newest
    first: what a scoped replacement reverts."""
    found = []
    for commit in history:
        if commit.id == input_ref:
            break
        owner = AttemptIdentity.from_commit(commit)
        if owner is not None and me.is_earlier_attempt_of_same_step(owner):
            found.append(commit)
    return found
