"""Every error Perago raises, under one root.

The retry policy is data on the exception: ``non_retryable=True`` maps to the orchestrator's
terminal failure (Conductor's FAILED_WITH_TERMINAL_ERROR), anything else to a failure the
orchestrator may retry. ``perago.worker.runtime.outcome_of`` is the one place that turns an
exception into an attempt's outcome.

::

    PeragoError
    ├── ConfigError                 settings missing or malformed
    ├── StackError                  the local dev stack cannot be built or started
    ├── TaskDefinitionError         a @task function has the wrong shape
    ├── RegistrationError           task or workflow definitions cannot be registered
    ├── GuardrailError              pre-guardrail: params or workspace input invalid (terminal)
    │   └── PolicyError             the worker's settings forbid that source or target
    ├── TaskError                   raised by task authors; non_retryable is their choice
    │   ├── CodeError               the body raised an error of the code (terminal)
    │   └── BodyTriesExhausted      the body failed every try its attempt allows (terminal)
    ├── ResultValidationError       post-guardrail: the result does not validate
    ├── WorkspaceError              materialize or diff failed
    │   └── UnsafePathError         symlink, device, or a path leaving the attempt directory
    ├── FenceError
    │   ├── AttemptFenceError       the Conductor attempt is no longer ours
    │   └── PublishFenceError       the target head cannot be explained: nothing published
    ├── ServiceError                an outside system failed or answered with an error (.status)
    │   ├── StoreError              lakeFS answered with an error
    │   │   ├── NotFoundError
    │   │   ├── ConflictError
    │   │   └── TransientStoreError a transfer failed in a way another try may mend
    │   ├── OrchestratorError       Conductor answered with an error
    │   └── CoordStoreError         the coordination backend failed; a write's fate may be unknown
    ├── CoordinationError           a lease or conditional write said no (nothing broke)
    │   ├── PredicateFailedError    a conditional write lost: the key changed (or never existed)
    │   │   └── TargetExistsError   put-and-verify: the target of an exclusive write exists
    │   └── LeaseBusyError          someone else holds the lease and it is not stale yet
    ├── FailpointError              a crash-test failpoint set to ``error`` fired
    ├── NoAttemptError              perago.info() outside an attempt (also a LookupError)
    └── WorkflowRunError            `perago run`: the workflow did not complete

    Interrupt (BaseException)       signals user code must not swallow
    ├── WorkerShutdown              the worker is draining and the grace ran out
    └── LeaseEndedError             the branch lease no longer covers a write: stop writing
        ├── LeaseLostError          it belongs to someone else now
        ├── LeaseExpiringError      too little of it is left to start a guarded write
        └── ReportWindowClosedError too late to report COMPLETED after leaving it
"""

from __future__ import annotations

__all__ = [
    "AttemptFenceError",
    "BodyTriesExhausted",
    "CodeError",
    "ConfigError",
    "ConflictError",
    "CoordStoreError",
    "CoordinationError",
    "FailpointError",
    "FenceError",
    "GuardrailError",
    "Interrupt",
    "LeaseBusyError",
    "LeaseEndedError",
    "LeaseExpiringError",
    "LeaseLostError",
    "NoAttemptError",
    "NotFoundError",
    "OrchestratorError",
    "PeragoError",
    "PolicyError",
    "PredicateFailedError",
    "PublishFenceError",
    "RegistrationError",
    "ReportWindowClosedError",
    "ResultValidationError",
    "ServiceError",
    "StackError",
    "StoreError",
    "TargetExistsError",
    "TaskDefinitionError",
    "TaskError",
    "TransientStoreError",
    "UnsafePathError",
    "WorkerShutdown",
    "WorkflowRunError",
    "WorkspaceError",
]


class PeragoError(Exception):
    """Root of every Perago error; ``non_retryable`` picks FAILED_WITH_TERMINAL_ERROR."""

    non_retryable: bool = False

    def __init__(self, message: str, *, non_retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if non_retryable is not None:
            self.non_retryable = non_retryable


class ConfigError(PeragoError):
    non_retryable = True


class StackError(PeragoError):
    pass


class TaskDefinitionError(PeragoError):
    non_retryable = True


class RegistrationError(PeragoError):
    pass


class GuardrailError(PeragoError):
    """A pre-guardrail failed: the body never ran and a retry cannot help."""

    non_retryable = True


class PolicyError(GuardrailError):
    """The worker may not read from or publish to what the workflow named
    (``PERAGO_ALLOWED_SOURCES``, ``PERAGO_ALLOWED_TARGETS``, ``PERAGO_PROTECTED_BRANCHES``).
    ``refused`` says which: ``"source"``, ``"target"`` or ``"protected"`` (the metric's label)."""

    def __init__(self, message: str, *, refused: str) -> None:
        super().__init__(message)
        self.refused = refused


class TaskError(PeragoError):
    """Raised by task authors. ``TaskError(msg, non_retryable=True)`` is terminal."""


class CodeError(TaskError):
    """The body raised one of its task's ``terminal_errors`` (by default an error of the
    code, ``perago.CODE_ERRORS``): a retry would meet it again. The message is the error."""

    non_retryable = True
    #: What the outcome's reason adds after the error and the line it came from.
    ADVICE = (
        "not retried: an error of the code, which a retry would meet again (the task's "
        "terminal_errors; perago.CODE_ERRORS by default). Fix the task and re-run the "
        "workflow; @task(terminal_errors=()) retries such errors"
    )


class BodyTriesExhausted(TaskError):
    """The body failed each try its attempt allows (``@task(body_retries)``); Conductor does
    not try the task again, or every one of its retries would repeat as many tries. The
    message is the last try's error."""

    non_retryable = True

    def advice(self, tries: int) -> str:
        return (
            f"the body failed all {tries} tries of this attempt (@task body_retries; each "
            "try's traceback is in the task log). Not retried by Conductor: fix the cause "
            "and re-run the workflow, or raise @task(body_retries=...)"
        )


class ResultValidationError(PeragoError):
    pass


class WorkspaceError(PeragoError):
    pass


class UnsafePathError(WorkspaceError):
    """The attempt directory holds something Perago will not upload (FAILED, like a stage)."""


class FenceError(PeragoError):
    pass


class AttemptFenceError(FenceError):
    pass


class PublishFenceError(FenceError):
    pass


class ServiceError(PeragoError):
    """An outside system failed; ``status`` is its HTTP status when it answered at all."""

    def __init__(
        self, message: str, *, status: int | None = None, non_retryable: bool | None = None
    ) -> None:
        super().__init__(message, non_retryable=non_retryable)
        self.status = status


class StoreError(ServiceError):
    """lakeFS answered with an error (or could not be reached)."""


class NotFoundError(StoreError):
    pass


class ConflictError(StoreError):
    pass


class HeadMovedError(ConflictError):
    """lakeFS refused a publication's merge: the expected-head hook saw the destination head
    move after the publish fence (a fan-out sibling landed). Fence again on the new head."""


class TransientStoreError(StoreError):
    """A transfer failed in a way another try may mend (no answer, a reset, HTTP 429/5xx);
    libcurl batches (perago.adapters.curl) start it again from byte 0."""


class OrchestratorError(ServiceError):
    """Conductor answered with an error (or could not be reached)."""


class CoordStoreError(ServiceError):
    """The coordination backend failed; the outcome of a write may be unknown."""


class CoordinationError(PeragoError):
    """A lease or a conditional write refused: the coordination store works, the answer is no."""


class PredicateFailedError(CoordinationError):
    """The expected version is no longer current: re-read and decide again."""


class TargetExistsError(PredicateFailedError):
    """The target of an exclusive (put-and-verify) write exists already."""


class LeaseBusyError(CoordinationError):
    """The lease is held by a live (or not yet provably stale) holder."""

    def __init__(self, message: str, *, holder: str, token: int) -> None:
        super().__init__(message)
        self.holder = holder
        self.token = token


class FailpointError(PeragoError):
    """Raised by an ``error`` failpoint (PERAGO_FAILPOINTS), on purpose."""


class NoAttemptError(PeragoError, LookupError):
    """``perago.info()`` was called outside a running attempt."""


class WorkflowRunError(PeragoError):
    pass


class Interrupt(BaseException):
    """Stops an attempt from the outside; derives from BaseException so bodies cannot swallow it."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class WorkerShutdown(Interrupt):
    """The worker is draining and the attempt outlived the grace."""


class LeaseEndedError(Interrupt):
    """The branch lease no longer covers this holder's next write, so it stops writing: the
    attempt fails ("lease lost") and its retry decides from the branch. An ``Interrupt``, so
    no task body or cleanup swallows it."""


class LeaseLostError(LeaseEndedError):
    """Another owner holds the branch lease now: the attempt must stop writing."""


class LeaseExpiringError(LeaseEndedError):
    """Too little of the lease is left to start a write safely (renew it first)."""


class ReportWindowClosedError(LeaseEndedError):
    """A COMPLETED report could not be sent inside the window its attempt opened by leaving
    the branch lease: it reports FAILED, and the retry decides from the branch."""
