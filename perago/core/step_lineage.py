"""Which logical step an attempt is, across retried sub-workflows.

A retried SUB_WORKFLOW runs a new child workflow with a new id, so a step of the child
cannot be recognised by (workflow id, task reference) alone: the earlier child's
publication would look foreign (the retry fails closed forever) or the step would publish
twice. Conductor records each child's parent workflow and parent task, so the step key
``<root workflow id>/<parent task ref>/.../<task ref>`` is the same in every retried child,
and the parent tasks' retry counts order the attempts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["MAX_DEPTH", "ParentStep", "ParentSteps", "step_lineage"]

#: Sub-workflow nesting followed at most; deeper parents are left out of the key.
MAX_DEPTH = 8


@dataclass(frozen=True)
class ParentStep:
    """The task of a parent workflow that started a child workflow."""

    workflow_id: str
    reference_name: str
    retry_count: int


@runtime_checkable
class ParentSteps(Protocol):
    def parent_step(self, workflow_id: str) -> ParentStep | None:
        """The task that started ``workflow_id``, or ``None`` for a top-level workflow."""
        ...


def step_lineage(
    source: ParentSteps, workflow_id: str, reference_name: str
) -> tuple[str | None, tuple[int, ...]]:
    """(step key, parent retry counts outermost first); ``(None, ())`` at top level."""
    refs: list[str] = []
    retries: list[int] = []
    current = workflow_id
    for _ in range(MAX_DEPTH):
        parent = source.parent_step(current)
        if parent is None:
            break
        refs.insert(0, parent.reference_name)
        retries.insert(0, parent.retry_count)
        current = parent.workflow_id
    if not refs:
        return None, ()
    return "/".join([current, *refs, reference_name]), tuple(retries)
