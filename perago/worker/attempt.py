"""One object per running attempt: the delivery, who it is, where it writes, how far it got.

Built once when the runner takes a polled task (temporal's ``_RunningActivity`` is the
model). The publication identity, ``perago.info()`` and the log context all derive from it,
so no step passes them along: the log context is bound once (structlog contextvars) and the
current step is recorded here for the outcome's reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from pydantic import BaseModel

from perago._api.context import AttemptControl, AttemptInfo
from perago._api.task import TaskDefinition
from perago.core.orchestrator import TaskSnapshot
from perago.publish.identity import AttemptIdentity, WorkspaceTarget
from perago.telemetry import tracing
from perago.telemetry.steps import Phase

__all__ = ["PHASE_SPANS", "RunningAttempt"]

#: The span each phase opens in the attempt's trace (perago.telemetry.tracing); the publisher's step
#: boundaries split "stage" further into "fences" and "merge".
PHASE_SPANS = {
    Phase.START: "guardrails",
    Phase.REUSE_CHECK: "reuse check",
    Phase.MATERIALIZE: "materialize",
    Phase.BODY: "body",
    Phase.POST_GUARDRAIL: "post-guardrail",
    Phase.DIFF: "diff",
    Phase.STAGE: "staging branch",
    Phase.PUBLISH: "stage",
}


@dataclass
class RunningAttempt:
    """A delivery being run by this worker."""

    defn: TaskDefinition[Any, Any]
    task: TaskSnapshot
    identity: AttemptIdentity
    target: WorkspaceTarget | None = None
    params: BaseModel | None = None
    #: The workflow pinned the input ref (``workspace.ref``): every retry starts from it.
    pinned: bool = False
    #: What waits until the outcome is reported (the attempt directory's removal).
    after_report: ExitStack = field(default_factory=ExitStack)
    #: Cancellation and progress notes between the body and the worker.
    control: AttemptControl = field(default_factory=AttemptControl)
    #: It ended drained or cancelled (a lineage ABORT, not a FAIL).
    aborted: bool = False
    #: The body's try inside this attempt (0: the first; ``@task(body_retries)``).
    body_try: int = 0
    #: The earlier tries' failures (their tracebacks), for the task log.
    failed_tries: list[str] = field(default_factory=list)
    #: The body failed its last allowed try with an error a try could fix: terminal.
    tries_ran_out: bool = False

    @property
    def recompute(self) -> bool:
        """The workflow asked this step to run even if it could reuse (``"recompute"``)."""
        return self.task.input.get("recompute") is True

    @classmethod
    def start(
        cls,
        defn: TaskDefinition[Any, Any],
        task: TaskSnapshot,
        *,
        after_report: ExitStack,
        cluster_id: str = "",
        control: AttemptControl | None = None,
    ) -> RunningAttempt:
        identity = AttemptIdentity(
            workflow_id=task.workflow_id,
            reference_name=task.reference_name,
            task_id=task.task_id,
            retry_count=task.retry_count,
            poll_count=task.poll_count,
            task_type=task.task_type,
            cluster_id=cluster_id,
        )
        workspace = task.input.get("workspace")
        pinned = isinstance(workspace, dict) and workspace.get("ref") is not None
        return cls(
            defn,
            task,
            identity,
            pinned=pinned,
            after_report=after_report,
            control=control or AttemptControl(),
        )

    def resolved(self, target: WorkspaceTarget, params: BaseModel, scope: str) -> None:
        """The pre-guardrails passed: the target, the params and the scope are known."""
        self.target, self.params = target, params
        self.identity = replace(self.identity, scope=scope)

    @property
    def step(self) -> Phase:
        """Where the attempt is (kept once, on its control, which the worker shares)."""
        return self.control.phase or Phase.START

    def enter(self, phase: Phase) -> None:
        """The attempt goes on to ``phase`` (failure messages name it; its trace opens it)."""
        self.control.phase = phase
        tracing.phase(PHASE_SPANS[phase])

    @property
    def scope(self) -> str:
        """The rendered scope ("" before the pre-guardrails passed)."""
        return self.identity.scope or ""

    @property
    def prefix(self) -> str:
        """The lakeFS prefix this attempt reads and writes (its rendered scope)."""
        return self.identity.scope or self.defn.workspace.prefix

    def info(self) -> AttemptInfo:
        """What ``perago.info()`` returns to the body."""
        me, target = self.identity, self.resolved_target()
        return AttemptInfo(
            workflow_id=me.workflow_id,
            task_id=me.task_id,
            task_type=me.task_type,
            reference_name=me.reference_name,
            retry_count=me.retry_count,
            poll_count=me.poll_count,
            repository=target.repository,
            branch=target.branch,
            input_ref=target.input_ref,
            body_try=self.body_try,
        )

    def log_context(self) -> dict[str, Any]:
        me = self.identity
        context: dict[str, Any] = {
            "workflow_id": me.workflow_id,
            "task_id": me.task_id,
            "task_type": me.task_type,
            "task_ref": me.reference_name,
            "retry_count": me.retry_count,
        }
        if self.target is not None:
            context.update(
                repository=self.target.repository,
                branch=self.target.branch,
                input_ref=self.target.input_ref,
                scope=me.scope,
            )
        return context

    @contextmanager
    def logging(self) -> Iterator[None]:
        """Bind the log context for the ``with`` block (re-entered once the target is known)."""
        with structlog.contextvars.bound_contextvars(**self.log_context()):
            yield

    def resolved_params(self) -> BaseModel:
        if self.params is None:
            raise RuntimeError("the attempt has no params before its pre-guardrails passed")
        return self.params

    def resolved_target(self) -> WorkspaceTarget:
        if self.target is None:
            raise RuntimeError("the attempt has no target before its pre-guardrails passed")
        return self.target
