"""Where an attempt starts: join refs, and the input ref of an input without ``ref``.

The step after a fan-out starts from a head that holds every writer's output.

A workspace input may name the refs its input must contain (``"after": [...]``, the fork
writers' output refs). The input ref is then the branch head, and every listed ref must be
on the head's first-parent history: Perago publications land on the target branch itself
(as merges or replacement heads), so a fork writer's output ref is always there once it
published, and a no-op's or reader's output is an earlier head. Anything else fails closed.
"""

from __future__ import annotations

from collections.abc import Sequence

from perago.core.store import VersionStore
from perago.errors import GuardrailError, NotFoundError
from perago.publish.identity import AttemptIdentity

__all__ = ["JOIN_HISTORY_LIMIT", "RETRY_HISTORY_LIMIT", "check_contains", "unpinned_input_ref"]

#: How far back a retry without ``ref`` looks for its earlier attempt's publication. A wider
#: fan-out pins its ref (``${workflow.input.workspace.ref}``, as the examples do): the
#: publish fence then reads down to it, however many siblings published since.
RETRY_HISTORY_LIMIT = 500

#: How far back the head's first-parent history is searched for the listed refs.
JOIN_HISTORY_LIMIT = 1000


def check_contains(
    store: VersionStore, repository: str, branch: str, input_ref: str, after: Sequence[str]
) -> None:
    """Raise ``GuardrailError`` unless every ref of ``after`` is in ``input_ref``'s history."""
    wanted = {}
    for ref in after:
        try:
            wanted[store.get_commit(repository, ref).id] = ref
        except NotFoundError as e:
            raise GuardrailError(
                f'workspace "after" names {ref!r}, which does not exist in {repository!r}; '
                "pass the output refs of the steps this one joins "
                '("${step.output.workspace.ref}")'
            ) from e
    history = {c.id for c in store.log(repository, input_ref, amount=JOIN_HISTORY_LIMIT)}
    missing = [ref for cid, ref in wanted.items() if cid not in history]
    if missing:
        raise GuardrailError(
            f"the head {input_ref[:12]} of {branch!r} does not contain {missing} named in "
            'workspace "after": those steps did not publish onto this branch (or it was reset '
            "since). Check that the join waits for them and that they target the same branch"
        )


def unpinned_input_ref(store: VersionStore, repository: str, head: str, me: AttemptIdentity) -> str:
    """The input ref of an input without ``ref``: the head, unless an earlier attempt of this
    very step published on the branch's first-parent history (the head itself, or under
    sibling publications of a fan-out); then that attempt's input ref. So the retry replaces
    the abandoned publication (a scoped replacement under siblings) instead of stacking a
    second publication of the step on top of it. A first attempt (retry 0, first delivery,
    no retried parent) has nothing earlier and reads nothing."""
    if me.retry_count == 0 and me.poll_count <= 1 and not any(me.lineage_retries):
        return head
    for commit in store.log(repository, head, amount=RETRY_HISTORY_LIMIT):
        owner = AttemptIdentity.from_commit(commit)
        pinned = commit.metadata.get("perago.input_ref")
        if owner is not None and pinned and me.is_earlier_attempt_of_same_step(owner):
            return pinned
    return head
