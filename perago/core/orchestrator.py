"""What the worker runtime needs from a workflow orchestrator (Conductor in production).

The worker, the runner, the fences and the janitor talk to these types only;
``perago.adapters.conductor`` implements :class:`Orchestrator` over Conductor's REST API and
``perago.testing.StubOrchestrator`` in memory, so the failure matrix can be unit-tested.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "IN_PROGRESS",
    "AttemptLedger",
    "Orchestrator",
    "Outcome",
    "Status",
    "StepOutputs",
    "TaskSnapshot",
    "WorkflowLedger",
    "WorkflowStep",
]

#: The only state in which an attempt may still publish (attempt fence).
IN_PROGRESS = "IN_PROGRESS"

#: How an attempt ended; ``FAILED`` may be retried by the orchestrator, the terminal one not.
Status = Literal["COMPLETED", "FAILED", "FAILED_WITH_TERMINAL_ERROR"]


@dataclass(frozen=True)
class TaskSnapshot:
    """One delivery of a task as the orchestrator describes it: what fencing and running need.

    ``status`` is the orchestrator's word for the task's state (shown in messages; only
    :data:`IN_PROGRESS` is interpreted); ``terminal`` says the task can no longer change.
    """

    task_id: str
    task_type: str
    reference_name: str
    workflow_id: str
    status: str
    retry_count: int
    poll_count: int
    worker_id: str
    response_timeout_seconds: int
    input: dict[str, Any]
    update_time_ms: int = 0
    terminal: bool = False
    #: The workflow's name (Conductor's workflowType; "" where unknown).
    workflow_type: str = ""


@dataclass(frozen=True)
class WorkflowStep:
    """One step of a workflow definition, nested ones included, as `perago register` checks
    it (the orchestrator adapter reads its definition language)."""

    #: The workflow's name; an inline sub-workflow's is ``"<outer> > <inner>"``.
    workflow: str
    reference_name: str
    #: The task type a worker polls for; "" for steps the orchestrator runs itself.
    task_type: str
    #: The step's input mapping as written (expressions unresolved); None if it has none.
    inputs: Any
    #: What is wrong with the step's own orchestration settings (e.g. a dynamic fork
    #: without its task list), found by the adapter.
    problems: tuple[str, ...] = ()
    #: The step runs inside a fork (a branch of a static fork, or a dynamic fork's task),
    #: whose JOIN reads its attempts.
    forked: bool = False
    #: The task a dynamic fork runs once per element of a list it reads at run time: its
    #: inputs are not known before (``inputs`` is None).
    dynamic: bool = False


@dataclass(frozen=True)
class Outcome:
    """What an attempt reports: its status, its output (on success) and why (on failure)."""

    status: Status
    output: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    #: The task author's traceback of a failure (``perago.telemetry.failure_text.user_traceback``):
    #: what the orchestrator keeps as the task's execution log ("": none).
    details: str = ""


class AttemptLedger(Protocol):
    """Where the truth about attempts lives: the read the attempt fence and janitor need."""

    def get_task(self, task_id: str) -> TaskSnapshot | None: ...


@runtime_checkable
class WorkflowLedger(Protocol):
    """What the janitor needs to judge a write-audit-publish branch: its workflow's state."""

    def workflow_status(self, workflow_id: str) -> str | None:
        """``RUNNING``, ``PAUSED``, ``COMPLETED``, ``FAILED``, ``TIMED_OUT``, ``TERMINATED``;
        None if the orchestrator does not know the workflow."""
        ...


@runtime_checkable
class StepOutputs(Protocol):
    """What a write-audit-publish publication reads to record its read-only steps' inputs:
    the outputs of a workflow's completed steps."""

    def completed_outputs(self, workflow_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(task reference, output) of each COMPLETED task of the workflow itself, in order
        (a sub-workflow's tasks are its own: its publications record their reads)."""
        ...


class Orchestrator(AttemptLedger, Protocol):
    """Hands out task deliveries and takes their reports.

    Implementations translate their own failures into :class:`perago.errors.OrchestratorError`.
    An answer to :meth:`report` or :meth:`extend` proves nothing (Conductor accepts stale
    updates silently); only a fresh :meth:`get_task` does.
    """

    def poll(
        self,
        task_type: str,
        *,
        worker_id: str,
        count: int,
        domain: str | None = None,
        wait_ms: int = 100,
    ) -> list[TaskSnapshot]:
        """Up to ``count`` deliveries of ``task_type`` (in task ``domain``, if given), now
        IN_PROGRESS for ``worker_id``; waits up to ``wait_ms`` for one when none is ready
        (0: answers at once)."""
        ...

    def give_back(self, task: TaskSnapshot, *, worker_id: str) -> None:
        """Put a delivery this worker will not run back in the queue, for any worker to
        poll again at once (a drain that a long-poll answered late)."""
        ...

    def extend(self, task: TaskSnapshot, *, worker_id: str, progress: str | None = None) -> None:
        """Push the delivery's response timeout back: the worker is still at it (with the
        body's newest progress note, if any)."""
        ...

    def report(
        self,
        task: TaskSnapshot,
        outcome: Outcome,
        *,
        worker_id: str,
        timeout: float | None = None,
    ) -> None:
        """Send the delivery's final outcome; with ``timeout``: one try, within that many
        seconds (a guarded write under the branch lease must not outlive it)."""
        ...
