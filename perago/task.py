"""``@task``: turn a plain typed function into a Conductor task Perago can run.

The decorator checks the function's shape when the module is imported, so a mistake is
found by ``perago register`` and not by the first attempt in production.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from pydantic import BaseModel

from perago import lakefs_names as names
from perago.errors import TaskDefinitionError
from perago.prefix_templates import render_prefix, template_fields

__all__ = ["RemoteWorkspace", "TaskDefinition", "TaskOptions", "WorkspaceSpec", "task"]

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)

#: Paths Perago keeps for itself on every target branch; no task prefix may reach them.
RESERVED_PREFIXES = names.RESERVED_PREFIXES
_TASK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,127}$")
_DOMAIN = re.compile(r"[A-Za-z0-9_\-]{1,128}")


def normalize_prefix(prefix: str) -> str:
    """Return ``prefix`` as a lakeFS path prefix ending in ``/``; reject anything that escapes."""
    if not isinstance(prefix, str) or not prefix.strip("/"):
        raise TaskDefinitionError(
            f"workspace prefix {prefix!r} is empty: name the lakeFS folder the task works on, "
            'e.g. WorkspaceSpec(prefix="orders/")'
        )
    if prefix.startswith("/") or "\\" in prefix or "\x00" in prefix:
        raise TaskDefinitionError(
            f"workspace prefix {prefix!r} must be a relative lakeFS path such as 'orders/' "
            "(no leading '/', no backslashes, no NUL)"
        )
    parts = prefix.strip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise TaskDefinitionError(
            f"workspace prefix {prefix!r} contains an empty, '.' or '..' segment; "
            "write it as a plain path such as 'orders/clean/'"
        )
    normalized = "/".join(parts) + "/"
    if any(normalized.startswith(r) for r in RESERVED_PREFIXES):
        raise TaskDefinitionError(
            f"workspace prefix {prefix!r} is reserved for Perago/lakeFS ({RESERVED_PREFIXES}); "
            "choose another folder"
        )
    return normalized


@dataclass(frozen=True)
class WorkspaceSpec:
    """Which lakeFS folder a task sees, and whether it may change it.

    ``in_place=True`` is for data too big to copy: the body receives a
    :class:`RemoteWorkspace` (URIs through the lakeFS S3 gateway) instead of a local ``Path``.

    ``renames_are_noops``: a change that only replaces files by files with the same bytes in
    the same folder (Spark's random ``part-00000-<uuid>`` names on a re-run) publishes
    nothing. ``None`` (the default) turns it on for Spark tasks only.
    """

    prefix: str
    read_only: bool = False
    in_place: bool = False
    renames_are_noops: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize_prefix(self.prefix))
        template_fields(self.prefix)  # a malformed template fails at import time
        if self.read_only and self.in_place:
            raise TaskDefinitionError(
                "WorkspaceSpec(read_only=True, in_place=True) makes no sense: a read-only task "
                "publishes nothing; drop in_place"
            )

    @property
    def fields(self) -> tuple[str, ...]:
        """The params fields a templated prefix (``"events/day={day}/"``) is filled from."""
        return template_fields(self.prefix)

    def render(self, params: BaseModel) -> str:
        """The attempt's scope: the prefix with its fields filled from ``params``.

        A value that is not one safe path segment is a ``GuardrailError`` (terminal).
        """
        if not self.fields:
            return self.prefix
        return normalize_prefix(render_prefix(self.prefix, dict(params)))


@dataclass(frozen=True)
class RemoteWorkspace:
    """What an in-place task body gets: where to read its input and write its output."""

    input_uri: str
    output_uri: str
    repository: str
    input_ref: str
    staging_branch: str
    prefix: str


@dataclass(frozen=True)
class TaskOptions:
    """Conductor task-definition options; defaults suit minutes-long data steps."""

    retry_count: int = 3
    retry_delay: timedelta = timedelta(seconds=1)
    timeout: timedelta = timedelta(hours=2)
    response_timeout: timedelta = timedelta(minutes=2)
    description: str = ""
    #: Conductor task domain the worker polls this task in ("": the worker's domain).
    domain: str = ""

    def __post_init__(self) -> None:
        if self.domain and not _DOMAIN.fullmatch(self.domain):
            raise TaskDefinitionError(
                f"domain {self.domain!r} is not a Conductor task domain: use letters, digits, "
                "'-' and '_' only"
            )
        if self.retry_count < 0:
            raise TaskDefinitionError("retry_count must be >= 0")
        if self.response_timeout < timedelta(seconds=1):
            raise TaskDefinitionError("response_timeout must be at least 1 second")
        if self.timeout and self.response_timeout > self.timeout:
            raise TaskDefinitionError(
                f"response_timeout ({self.response_timeout}) must not exceed timeout "
                f"({self.timeout}); Conductor rejects such a task definition"
            )


@dataclass(frozen=True)
class TaskDefinition(Generic[P, R]):
    """A checked task: the function, its models, its workspace and its Conductor options."""

    name: str
    fn: Callable[..., R]
    workspace: WorkspaceSpec
    params_type: type[P]
    result_type: type[R]
    options: TaskOptions = field(default_factory=TaskOptions)
    wants_spark: bool = False
    #: A task the worker runs itself (``perago.wap``), not a body: its name, else "".
    system: str = ""

    def __call__(self, workspace: Any, params: P, **kwargs: Any) -> R:
        """Call the body directly (handy in unit tests): no lakeFS, no Conductor."""
        return self.fn(workspace, params, **kwargs)


def _check_model(annotation: Any, what: str, fn_name: str) -> type[BaseModel]:
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        raise TaskDefinitionError(
            f"task function {fn_name!r}: {what} must be annotated with a pydantic BaseModel "
            f"subclass, got {annotation!r}"
        )
    return annotation


def _inspect(fn: Callable[..., Any], spec: WorkspaceSpec) -> tuple[type[Any], type[Any], bool]:
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:
        raise TaskDefinitionError(f"task function {name!r}: cannot resolve annotations: {e}") from e
    params = list(inspect.signature(fn).parameters.values())
    if len(params) not in (2, 3) or any(
        p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params[:2]
    ):
        raise TaskDefinitionError(
            f"task function {name!r} must look like fn(workspace: Path, params: Params) -> Result "
            "(optionally with a third parameter spark: SparkSession)"
        )
    ws_type = hints.get(params[0].name)
    expected = RemoteWorkspace if spec.in_place else Path
    if ws_type is not expected:
        mode = "in_place=True" if spec.in_place else "a local workspace"
        raise TaskDefinitionError(
            f"task function {name!r}: its first parameter must be annotated {expected.__name__} "
            f"for {mode}, got {ws_type!r}"
        )
    params_type = _check_model(hints.get(params[1].name), "the params parameter", name)
    missing = [f for f in spec.fields if f not in params_type.model_fields]
    if missing:
        raise TaskDefinitionError(
            f"task function {name!r}: the workspace prefix {spec.prefix!r} is filled from "
            f"params fields {missing}, which {params_type.__name__} does not declare; add them "
            "(each a value that is one path segment, e.g. a date string)"
        )
    result_type = _check_model(hints.get("return"), "the return type", name)
    wants_spark = False
    if len(params) == 3:
        if params[2].name != "spark":
            raise TaskDefinitionError(
                f"task function {name!r}: the only optional third parameter is `spark`"
            )
        wants_spark = True
    return params_type, result_type, wants_spark


class _Decorator:
    def __init__(self, name: str, workspace: WorkspaceSpec, options: TaskOptions) -> None:
        self._name, self._workspace, self._options = name, workspace, options

    @overload
    def __call__(self, fn: Callable[[Path, P], R]) -> TaskDefinition[P, R]: ...
    @overload
    def __call__(self, fn: Callable[[Path, P, Any], R]) -> TaskDefinition[P, R]: ...
    @overload
    def __call__(self, fn: Callable[[RemoteWorkspace, P], R]) -> TaskDefinition[P, R]: ...
    @overload
    def __call__(self, fn: Callable[[RemoteWorkspace, P, Any], R]) -> TaskDefinition[P, R]: ...
    def __call__(self, fn: Callable[..., Any]) -> TaskDefinition[Any, Any]:
        params_type, result_type, wants_spark = _inspect(fn, self._workspace)
        return TaskDefinition(
            name=self._name,
            fn=fn,
            workspace=self._workspace,
            params_type=params_type,
            result_type=result_type,
            options=self._options,
            wants_spark=wants_spark,
        )


def task(
    name: str,
    *,
    workspace: WorkspaceSpec,
    retry_count: int = 3,
    retry_delay: timedelta = timedelta(seconds=1),
    timeout: timedelta = timedelta(hours=2),
    response_timeout: timedelta = timedelta(minutes=2),
    description: str = "",
    domain: str = "",
) -> _Decorator:
    """Declare a Perago task; ``name`` is the Conductor task type.

    ``response_timeout`` is how long Conductor waits without hearing from the worker before
    it retries the task elsewhere; the worker extends it while the body runs. ``domain`` is
    the Conductor task domain its worker polls (``PERAGO_TASK_DOMAINS`` overrides it).
    """
    if not isinstance(name, str) or not _TASK_NAME.match(name):
        raise TaskDefinitionError(
            f"task name {name!r} is not a valid Conductor task type: use letters, digits, "
            "'_' or '-', starting with a letter"
        )
    if not isinstance(workspace, WorkspaceSpec):
        raise TaskDefinitionError("@task(..., workspace=WorkspaceSpec(prefix=...)) is required")
    options = TaskOptions(
        retry_count=retry_count,
        retry_delay=retry_delay,
        timeout=timeout,
        response_timeout=response_timeout,
        description=description,
        domain=domain,
    )
    return _Decorator(name, workspace, options)
