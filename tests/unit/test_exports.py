"""Freezes the public façade: changing it must be a deliberate act."""

import types

import perago


def test_public_names() -> None:
    assert sorted(perago.__all__) == sorted(
        [
            "AttemptFenceError",
            "AttemptInfo",
            "CODE_ERRORS",
            "ConfigError",
            "FenceError",
            "GuardrailError",
            "Inputs",
            "Interrupt",
            "PeragoError",
            "PublishFenceError",
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
    )
    # Nothing public is reachable that the façade does not name (submodules aside).
    public = {
        name
        for name, value in vars(perago).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(perago.__all__)


def test_errors_share_one_root_and_interrupts_escape_except_exception() -> None:
    for name in perago.__all__:
        obj = getattr(perago, name)
        if isinstance(obj, type) and name.endswith("Error"):
            assert issubclass(obj, perago.PeragoError)
    assert not issubclass(perago.WorkerShutdown, Exception)
    assert issubclass(perago.WorkerShutdown, perago.Interrupt)
