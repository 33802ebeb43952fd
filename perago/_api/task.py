"""``@task``: turn a plain typed function into a Conductor task Perago can run.

The decorator checks the function's shape when the module is imported, so a mistake is
found by ``perago register`` and not by the first attempt in production.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from pydantic import BaseModel

from perago._api.inputs import ISOLATION_LEVELS, Isolation, check_input_name, template_overlap
from perago._api.prefix_templates import render_prefix, template_fields
from perago.core import lakefs_names as names
from perago.errors import GuardrailError, TaskDefinitionError

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
    """Which lakeFS folder a task writes, which it reads, and whether it may change them.

    ``prefix`` is the output: the folder the attempt's workspace holds and publishes.
    ``inputs`` names read-only folders the task reads beside it (``{"customers":
    "dims/customers/"}``, templated like the prefix); the body gets them through its
    ``inputs`` parameter, each read at one commit (the workspace's input ref unless the
    workflow points it elsewhere). ``isolation="serializable"`` also refuses to publish when
    an input read from the target branch changed before the publication (docs/protocol.md).

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
    inputs: Mapping[str, str] = field(default_factory=dict, hash=False)
    isolation: Isolation = "snapshot"
    #: Narrow the worker's PERAGO_ALLOWED_TARGETS / _SOURCES for this task (globs of
    #: ``repository/branch`` and ``repository/ref``; empty: the worker's settings alone).
    allowed_targets: tuple[str, ...] = ()
    allowed_sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize_prefix(self.prefix))
        template_fields(self.prefix)  # a malformed template fails at import time
        if self.read_only and self.in_place:
            raise TaskDefinitionError(
                "WorkspaceSpec(read_only=True, in_place=True) makes no sense: a read-only task "
                "publishes nothing; drop in_place"
            )
        if self.isolation not in ISOLATION_LEVELS:
            raise TaskDefinitionError(
                f"isolation {self.isolation!r} is not one of {list(ISOLATION_LEVELS)}: "
                '"snapshot" (the default) or "serializable" (docs/protocol.md, isolation)'
            )
        if self.read_only and self.isolation == "serializable":
            raise TaskDefinitionError(
                'WorkspaceSpec(read_only=True, isolation="serializable") makes no sense: a '
                "read-only task publishes nothing, so there is no publication to check; drop "
                "isolation"
            )
        object.__setattr__(self, "inputs", self._checked_inputs(self.inputs))
        for name in ("allowed_targets", "allowed_sources"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(g, str) and g for g in value):
                raise TaskDefinitionError(
                    f"WorkspaceSpec {name} must be a tuple of globs such as "
                    f'("analytics/main",), got {value!r}'
                )
            object.__setattr__(self, name, tuple(value))

    def _checked_inputs(self, inputs: object) -> dict[str, str]:
        if not isinstance(inputs, Mapping):
            raise TaskDefinitionError(
                f"WorkspaceSpec inputs must map names to lakeFS folders, e.g. "
                f'inputs={{"customers": "dims/customers/"}}; got {inputs!r}'
            )
        checked = {}
        for name, prefix in inputs.items():
            check_input_name(name)
            try:
                normalized = normalize_prefix(prefix)
                template_fields(normalized)
            except TaskDefinitionError as e:
                raise TaskDefinitionError(f"input {name!r}: {e.message}") from e
            if template_overlap(self.prefix, normalized) == "always":
                raise TaskDefinitionError(
                    f"input {name!r} ({normalized!r}) overlaps the output prefix "
                    f"{self.prefix!r}: a task reads its own output through its workspace; "
                    "point the input at another folder, or drop it"
                )
            checked[name] = normalized
        return dict(sorted(checked.items()))

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

    def render_inputs(self, params: BaseModel) -> dict[str, str]:
        """Each input's folder with its fields filled from ``params`` (``GuardrailError`` for
        a bad value, or an input that then overlaps the rendered output)."""
        values = dict(params)
        scope = self.render(params)
        rendered = {}
        for name, template in self.inputs.items():
            try:
                prefix = normalize_prefix(render_prefix(template, values))
            except TaskDefinitionError as e:
                raise GuardrailError(f"input {name!r}: {e.message}") from e
            rendered[name] = prefix
            if template_overlap(scope, prefix) != "never":
                raise GuardrailError(
                    f"input {name!r} renders to {prefix!r}, which overlaps the output "
                    f"{scope!r} with these params: a task reads its own output through its "
                    "workspace; fix the params or the task's inputs"
                )
        return rendered


@dataclass(frozen=True)
class RemoteWorkspace:
    """What an in-place task body gets: where to read its input and write its output, and
    each named input's ``s3a://`` URI at the commit it is read at."""

    input_uri: str
    output_uri: str
    repository: str
    input_ref: str
    staging_branch: str
    prefix: str
    inputs: Mapping[str, str] = field(default_factory=dict, hash=False)


#: Errors no retry can fix, by default terminal (``@task(terminal_errors=...)``): a name or
#: attribute that does not exist, a call with the wrong types, a missing module, and a Spark
#: query that does not analyse (an unknown column or table).
CODE_ERRORS: tuple[type[BaseException] | str, ...] = (
    NameError,
    TypeError,
    AttributeError,
    ImportError,
    SyntaxError,
    "pyspark.errors.AnalysisException",
)


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
    #: Attempts of this task one worker runs at once (0: only the worker's total limit).
    concurrency: int = 0
    #: Errors of the body that no retry can fix: they end the task terminally.
    terminal_errors: tuple[type[BaseException] | str, ...] = CODE_ERRORS
    #: Tries of a failing body repeated inside the same Conductor attempt (None: as many as
    #: ``retry_count``; 0: a failing body is reported FAILED for Conductor to retry).
    body_retries: int | None = None
    #: The body's output is a function of its named inputs, params and code: an attempt
    #: whose earlier publication read the same is not run again (docs/tasks.md).
    incremental: bool = False
    #: What changes when the code's output would ("": a digest of the task's module source).
    code_version: str = ""

    @property
    def body_tries(self) -> int:
        """How many times one attempt may run the body (1 + its body retries)."""
        retries = self.retry_count if self.body_retries is None else self.body_retries
        return 1 + retries

    def __post_init__(self) -> None:
        if self.domain and not _DOMAIN.fullmatch(self.domain):
            raise TaskDefinitionError(
                f"domain {self.domain!r} is not a Conductor task domain: use letters, digits, "
                "'-' and '_' only"
            )
        if self.retry_count < 0:
            raise TaskDefinitionError("retry_count must be >= 0")
        if self.body_retries is not None and (
            not isinstance(self.body_retries, int) or self.body_retries < 0
        ):
            raise TaskDefinitionError(
                f"body_retries must be a whole number >= 0 (or None: as many as retry_count), "
                f"got {self.body_retries!r}"
            )
        if not isinstance(self.concurrency, int) or self.concurrency < 0:
            raise TaskDefinitionError(
                f"concurrency must be a whole number >= 1 (or 0: no limit of its own), got "
                f"{self.concurrency!r}"
            )
        for kind in self.terminal_errors:
            if not (
                (isinstance(kind, type) and issubclass(kind, BaseException))
                or (isinstance(kind, str) and "." in kind)
            ):
                raise TaskDefinitionError(
                    f"terminal_errors takes exception classes or dotted class names "
                    f"('pyspark.errors.AnalysisException'), not {kind!r}"
                )
        if not isinstance(self.code_version, str) or len(self.code_version) > 128:
            raise TaskDefinitionError(
                f"code_version must be a string of at most 128 characters (bump it when the "
                f"output of the code changes), got {self.code_version!r}"
            )
        if self.code_version and not self.incremental:
            raise TaskDefinitionError(
                "code_version is only read by incremental tasks: add incremental=True, or "
                "drop code_version"
            )
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
    #: The body takes an ``inputs`` parameter (perago._api.inputs.Inputs).
    wants_inputs: bool = False
    #: A task the worker runs itself (``perago.wap``), not a body: its name, else "".
    system: str = ""
    #: The body is ``async def``: the worker awaits it on its event loop (no thread held).
    is_async: bool = False

    @functools.cached_property
    def code_version(self) -> str:
        """The task's ``code_version``, else ``src:`` and a digest of the source of the
        module that defines it (of the function's code where the source is not at hand)."""
        if self.options.code_version:
            return self.options.code_version
        try:
            source = inspect.getsource(inspect.getmodule(self.fn) or self.fn).encode()
        except (OSError, TypeError):
            source = self.fn.__code__.co_code
        return "src:" + hashlib.sha256(source).hexdigest()[:20]

    def __call__(self, workspace: Any, params: P, **kwargs: Any) -> R:
        """Call the body directly (handy in unit tests): no lakeFS, no Conductor. An
        ``async def`` body returns its coroutine (await it, or use perago.testing.run_task)."""
        return self.fn(workspace, params, **kwargs)


def _check_model(annotation: Any, what: str, fn_name: str) -> type[BaseModel]:
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        raise TaskDefinitionError(
            f"task function {fn_name!r}: {what} must be annotated with a pydantic BaseModel "
            f"subclass, got {annotation!r}"
        )
    return annotation


@dataclass(frozen=True)
class _Shape:
    params_type: type[Any]
    result_type: type[Any]
    wants_spark: bool
    wants_inputs: bool
    is_async: bool


#: The parameters a body may take after ``workspace`` and ``params``, by name.
_OPTIONAL = ("inputs", "spark")


def _inspect(fn: Callable[..., Any], spec: WorkspaceSpec) -> _Shape:
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:
        raise TaskDefinitionError(f"task function {name!r}: cannot resolve annotations: {e}") from e
    params = list(inspect.signature(fn).parameters.values())
    shape = (
        "fn(workspace: Path, params: Params) -> Result, optionally with the parameters "
        "inputs: Inputs (for WorkspaceSpec inputs) and spark: SparkSession"
    )
    if len(params) < 2 or any(
        p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params[:2]
    ):
        raise TaskDefinitionError(f"task function {name!r} must look like {shape}")
    extra = params[2:]
    for p in extra:
        if p.name not in _OPTIONAL or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TaskDefinitionError(
                f"task function {name!r}: unexpected parameter {p.name!r}; the only optional "
                f"parameters are {' and '.join(_OPTIONAL)} (a task must look like {shape})"
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
    for what, template, fields in [
        ("the workspace prefix", spec.prefix, spec.fields),
        *[(f"input {k!r}", v, template_fields(v)) for k, v in spec.inputs.items()],
    ]:
        missing = [f for f in fields if f not in params_type.model_fields]
        if missing:
            raise TaskDefinitionError(
                f"task function {name!r}: {what} {template!r} is filled from params fields "
                f"{missing}, which {params_type.__name__} does not declare; add them (each a "
                "value that is one path segment, e.g. a date string)"
            )
    result_type = _check_model(hints.get("return"), "the return type", name)
    takes = {p.name for p in extra}
    wants_inputs = "inputs" in takes
    if wants_inputs and not spec.inputs:
        raise TaskDefinitionError(
            f"task function {name!r} takes `inputs` but its WorkspaceSpec declares none; add "
            'inputs={"name": "folder/"} to the WorkspaceSpec, or drop the parameter'
        )
    if spec.inputs and not wants_inputs and not spec.in_place:
        raise TaskDefinitionError(
            f"task function {name!r}: its WorkspaceSpec declares inputs {sorted(spec.inputs)} "
            "but the function has no `inputs` parameter to receive them; add "
            "`inputs: Inputs` after `params`"
        )
    is_async = inspect.iscoroutinefunction(fn)
    if is_async and "spark" in takes:
        raise TaskDefinitionError(
            f"task function {name!r} is `async def` and takes `spark`: Spark jobs block the "
            "thread that runs them, which would stall every other async body of the worker; "
            "write a Spark task as a plain `def`"
        )
    return _Shape(params_type, result_type, "spark" in takes, wants_inputs, is_async)


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
    @overload
    def __call__(self, fn: Callable[[Path, P, Any, Any], R]) -> TaskDefinition[P, R]: ...
    @overload
    def __call__(self, fn: Callable[[RemoteWorkspace, P, Any, Any], R]) -> TaskDefinition[P, R]: ...
    def __call__(self, fn: Callable[..., Any]) -> TaskDefinition[Any, Any]:
        shape = _inspect(fn, self._workspace)
        return TaskDefinition(
            name=self._name,
            fn=fn,
            workspace=self._workspace,
            params_type=shape.params_type,
            result_type=shape.result_type,
            options=self._options,
            wants_spark=shape.wants_spark,
            wants_inputs=shape.wants_inputs,
            is_async=shape.is_async,
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
    concurrency: int = 0,
    terminal_errors: Sequence[type[BaseException] | str] = CODE_ERRORS,
    body_retries: int | None = None,
    incremental: bool = False,
    code_version: str = "",
) -> _Decorator:
    """Declare a Perago task; ``name`` is the Conductor task type.

    ``response_timeout`` is how long Conductor waits without hearing from the worker before
    it retries the task elsewhere; the worker extends it while the body runs. ``domain`` is
    the Conductor task domain its worker polls (``PERAGO_TASK_DOMAINS`` overrides it).
    ``concurrency`` caps how many attempts of this task one worker runs at once (a heavy
    Spark task beside light ones; ``PERAGO_TASK_CONCURRENCY`` overrides it), within the
    worker's total ``--concurrency``. ``terminal_errors``: errors of the body that no
    retry can fix end the task at once (FAILED_WITH_TERMINAL_ERROR); by default Python's
    programming errors and Spark's analysis errors (``CODE_ERRORS``). Pass ``()`` to retry
    every error, or ``(*CODE_ERRORS, MyError)`` to add your own; a dotted name matches a
    class of that name in that package (for optional libraries such as pyspark).

    A body that fails with any other error is tried again inside the same Conductor
    attempt, up to ``body_retries`` times (default: ``retry_count``), each try in a fresh
    workspace at the same input ref, ``retry_delay`` doubling between tries; when the tries
    run out the task fails terminally. Conductor's own ``retryCount`` (``retry_count``) is
    then left for what the attempt cannot repeat itself: a worker that died, a timeout, a
    failed publication. A fork's JOIN may cancel Conductor's retries of several branches
    that fail at once, never the tries inside an attempt (docs/tasks.md, "Retries").
    ``body_retries=0`` reports a failing body FAILED for Conductor to retry, as a plain
    Conductor worker does.

    ``incremental=True`` is the author's promise that the body's output is a function of
    its named inputs, its params and its code: an attempt whose step published before from
    inputs with the same content, the same params and the same ``code_version`` (by default
    a digest of the task's module source), onto a scope nobody changed since, is not run;
    it answers what that publication answered (docs/tasks.md, "Incremental re-runs").
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
        concurrency=concurrency,
        terminal_errors=tuple(terminal_errors),
        body_retries=body_retries,
        incremental=incremental,
        code_version=code_version,
    )
    if incremental and workspace.read_only:
        raise TaskDefinitionError(
            f"task {name}: incremental=True on a read-only task makes no sense: it publishes "
            "nothing that a re-run could reuse; drop incremental"
        )
    return _Decorator(name, workspace, options)


def is_terminal(e: BaseException, kinds: Sequence[type[BaseException] | str]) -> bool:
    """Whether ``e`` is one of ``kinds``: a class (``isinstance``), or a dotted name
    ``package.Name`` that a class in ``e``'s hierarchy has (``Name``, defined under
    ``package``), so that a library need not be importable to be named."""
    for kind in kinds:
        if isinstance(kind, type):
            if isinstance(e, kind):
                return True
            continue
        package, _, name = kind.rpartition(".")
        root = package.partition(".")[0]
        if any(
            c.__name__ == name and (c.__module__ or "").partition(".")[0] == root
            for c in type(e).__mro__
        ):
            return True
    return False
