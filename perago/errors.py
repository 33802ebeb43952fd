"""Every error Perago raises, under one root.

The retry policy is data on the exception: ``non_retryable=True`` maps to Conductor's
FAILED_WITH_TERMINAL_ERROR, anything else to FAILED (Conductor may retry).

::

    PeragoError
    ├── ConfigError                 settings missing or malformed
    ├── StackError                  the local dev stack cannot be built or started
    ├── TaskDefinitionError         a @task function has the wrong shape
    ├── RegistrationError           task or workflow definitions cannot be registered
    ├── GuardrailError              pre-guardrail: params or workspace input invalid (terminal)
    ├── TaskError                   raised by task authors; non_retryable is their choice
    ├── ResultValidationError       post-guardrail: the result does not validate
    ├── WorkspaceError              materialize or diff failed
    │   └── UnsafePathError         symlink, device, or a path leaving the attempt directory
    ├── FenceError
    │   ├── AttemptFenceError       the Conductor attempt is no longer ours
    │   └── PublishFenceError       the target head cannot be explained: nothing published
    ├── StoreError                  lakeFS answered with an error
    │   ├── NotFoundError
    │   └── ConflictError
    ├── OrchestratorError           Conductor answered with an error
    └── WorkflowRunError            `perago run`: the workflow did not complete

    Interrupt (BaseException)       signals user code must not swallow
    └── WorkerShutdown              the worker is draining and the grace ran out
"""

from __future__ import annotations

__all__ = [
    "AttemptFenceError",
    "ConfigError",
    "ConflictError",
    "FenceError",
    "GuardrailError",
    "Interrupt",
    "NotFoundError",
    "OrchestratorError",
    "PeragoError",
    "PublishFenceError",
    "RegistrationError",
    "ResultValidationError",
    "StackError",
    "StoreError",
    "TaskDefinitionError",
    "TaskError",
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


class TaskError(PeragoError):
    """Raised by task authors. ``TaskError(msg, non_retryable=True)`` is terminal."""


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


class StoreError(PeragoError):
    def __init__(
        self, message: str, *, status: int | None = None, non_retryable: bool | None = None
    ) -> None:
        super().__init__(message, non_retryable=non_retryable)
        self.status = status


class NotFoundError(StoreError):
    pass


class ConflictError(StoreError):
    pass


class OrchestratorError(PeragoError):
    def __init__(
        self, message: str, *, status: int | None = None, non_retryable: bool | None = None
    ) -> None:
        super().__init__(message, non_retryable=non_retryable)
        self.status = status


class WorkflowRunError(PeragoError):
    pass


class Interrupt(BaseException):
    """Stops an attempt from the outside; derives from BaseException so bodies cannot swallow it."""


class WorkerShutdown(Interrupt):
    pass
