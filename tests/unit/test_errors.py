"""One error tree: every Perago exception is in perago.errors, drawn in its docstring."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from perago import errors
from perago.coord import errors as coord_errors
from perago.coord import put_and_verify
from perago.core.orchestrator import Outcome
from perago.worker import failpoints
from perago.worker.runtime import SHUTDOWN, outcome_of


def _public_errors() -> list[type[BaseException]]:
    return [getattr(errors, n) for n in errors.__all__]


def test_every_error_descends_from_one_root_and_is_drawn() -> None:
    doc = errors.__doc__ or ""
    for cls in _public_errors():
        assert issubclass(cls, errors.PeragoError | errors.Interrupt), cls
        assert f" {cls.__name__} " in doc or f" {cls.__name__}\n" in doc, cls


def test_no_public_exception_class_is_defined_outside_the_tree() -> None:
    import perago

    for info in pkgutil.walk_packages(perago.__path__, "perago."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and module is not errors
            ):
                assert name.startswith("_"), f"{info.name}.{name}: define it in perago.errors"
    assert failpoints.FailpointError is errors.FailpointError
    assert put_and_verify.TargetExistsError is errors.TargetExistsError
    assert coord_errors.LeaseLostError is errors.LeaseLostError


def test_coordination_errors_have_their_own_lineage() -> None:
    assert not issubclass(errors.CoordStoreError, errors.StoreError)  # not "lakeFS answered"
    assert issubclass(errors.CoordStoreError, errors.ServiceError)
    assert issubclass(errors.StoreError, errors.ServiceError)
    assert issubclass(errors.OrchestratorError, errors.ServiceError)
    assert issubclass(errors.TargetExistsError, errors.PredicateFailedError)
    assert issubclass(errors.LeaseBusyError, errors.CoordinationError)
    # one story for a lease that no longer covers a write: the holder stops writing
    for ended in (errors.LeaseLostError, errors.LeaseExpiringError):
        assert issubclass(ended, errors.LeaseEndedError)
        assert issubclass(ended, errors.Interrupt)
        assert not issubclass(ended, Exception)  # bodies and cleanups cannot swallow it
    assert errors.CoordStoreError("x", status=503).status == 503


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (errors.WorkerShutdown(), SHUTDOWN),
        (
            errors.LeaseLostError("taken over"),
            Outcome("FAILED", reason="publish: lease lost: taken over; the attempt was cancelled"),
        ),
        (
            errors.LeaseExpiringError("too little left"),
            Outcome(
                "FAILED", reason="publish: lease lost: too little left; the attempt was cancelled"
            ),
        ),
        (
            errors.GuardrailError("bad input"),
            Outcome("FAILED_WITH_TERMINAL_ERROR", reason="publish: bad input"),
        ),
        (errors.TaskError("flaky"), Outcome("FAILED", reason="publish: flaky")),
        (KeyError("boom"), Outcome("FAILED", reason="publish: KeyError: 'boom'")),
    ],
)
def test_one_place_maps_an_exception_to_an_outcome(error: BaseException, outcome: Outcome) -> None:
    assert outcome_of(error, where="publish") == outcome


def test_lakefs_answers_are_typed_where_they_are_read() -> None:
    """Issue 42: the publisher decides on types, never on lakeFS's text. The adapter reads
    the expected-head hook's refusal (HTTP 412 carrying the hook's Lua error) once, as a
    HeadMovedError; any other 412 or 409 stays a plain ConflictError."""
    from perago.adapters.objects import error_for
    from perago.core.lakefs_names import HEAD_MOVED
    from perago.errors import ConflictError, HeadMovedError
    from perago.publish.expected_head_hook import HOOK_YAML

    assert HEAD_MOVED in HOOK_YAML  # the hook says what the adapter looks for
    moved = error_for(412, "", f"hook failed: {HEAD_MOVED}abc, expected def", "lakeFS merge")
    assert type(moved) is HeadMovedError and moved.status == 412
    for status, body in ((412, "pre-merge hook: some other check failed"), (409, "conflict")):
        other = error_for(status, "", body, "lakeFS merge")
        assert type(other) is ConflictError
