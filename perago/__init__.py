"""Perago: plain typed task functions run as Conductor workers, published to lakeFS safely.

Task authors need only what is exported here; everything else is the runtime's business.
"""

from perago._api.context import (
    AttemptInfo,
    cancelled,
    info,
    progress,
    wait_cancelled,
    wait_cancelled_async,
)
from perago._api.inputs import Inputs, ResolvedInput
from perago._api.task import (
    CODE_ERRORS,
    RemoteWorkspace,
    TaskDefinition,
    TaskOptions,
    WorkspaceSpec,
    task,
)
from perago.core import VERSION
from perago.errors import (
    AttemptFenceError,
    ConfigError,
    FenceError,
    GuardrailError,
    Interrupt,
    PeragoError,
    PublishFenceError,
    ResultValidationError,
    StoreError,
    TaskDefinitionError,
    TaskError,
    UnsafePathError,
    WorkerShutdown,
    WorkspaceError,
)

__version__ = VERSION
del VERSION

__all__ = [
    # errors
    "CODE_ERRORS",
    "AttemptFenceError",
    # inside a running attempt
    "AttemptInfo",
    "ConfigError",
    "FenceError",
    "GuardrailError",
    "Inputs",
    "Interrupt",
    "PeragoError",
    "PublishFenceError",
    # defining tasks
    "RemoteWorkspace",
    "ResolvedInput",
    "ResultValidationError",
    "StoreError",
    "TaskDefinition",
    "TaskDefinitionError",
    "TaskError",
    "TaskOptions",
    "UnsafePathError",
    "WorkerShutdown",
    "WorkspaceError",
    "WorkspaceSpec",
    "cancelled",
    "info",
    "progress",
    "task",
    "wait_cancelled",
    "wait_cancelled_async",
]
