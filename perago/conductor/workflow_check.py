"""Check workflow definitions against the Perago tasks they use, before Conductor runs them.

A workflow that hands a task bad constant params, no workspace, no value for a templated
prefix field, or points an input the task does not declare (or at no valid source) would
fail at run time, possibly after earlier steps published. ``perago
register`` runs this over every task, nested ones included (FORK_JOIN branches, DYNAMIC
fork settings, DO_WHILE bodies, SWITCH cases, inline SUB_WORKFLOW definitions), and reports
every problem naming the workflow, the task reference and what to fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from perago._api.prefix_templates import render_prefix, template_fields
from perago._api.task import TaskDefinition
from perago._api.task_io import InputSourceOverride, unknown_param_keys
from perago.core.orchestrator import WorkflowStep
from perago.errors import GuardrailError

__all__ = ["fork_retry_warnings", "workflow_problems"]


def _is_expression(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _task_problems(
    defn: TaskDefinition[Any, Any], inputs: Any, params_extra: str = "forbid"
) -> list[str]:
    if not isinstance(inputs, Mapping):
        return ['has no inputParameters: pass {"workspace": ..., "params": {...}}']
    problems = [
        f'inputParameters lack "{key}"' for key in ("workspace", "params") if key not in inputs
    ]
    problems += _input_source_problems(defn, inputs.get("inputs"))
    params = inputs.get("params")
    if params is None or _is_expression(params):
        return problems  # decided at run time (the pre-guardrail checks it then)
    if not isinstance(params, Mapping):
        return [*problems, f'"params" must be an object, got {type(params).__name__}']
    unknown = unknown_param_keys(defn, dict(params)) if params_extra == "forbid" else []
    if unknown:
        problems.append(
            f"params {unknown} are not fields of {defn.params_type.__name__} (its params are "
            f"{sorted(defn.params_type.model_fields) or 'none'}): the worker refuses them "
            "(terminal); fix the names, or set PERAGO_PARAMS_EXTRA=ignore to drop them"
        )
    constants = {k: v for k, v in params.items() if not _contains_expression(v)}
    try:
        defn.params_type.model_validate(constants)
    except ValidationError as e:
        for err in e.errors():
            loc = err["loc"]
            missing_but_dynamic = err["type"] == "missing" and loc and loc[0] in params
            if err["type"] == "missing" and not missing_but_dynamic:
                problems.append(f"params field {'.'.join(map(str, loc))!r} is required")
            elif loc and loc[0] in constants:
                where = ".".join(str(x) for x in loc)
                problems.append(f"params {where!r}: {err['msg']}")
    spec = defn.workspace
    templates = [("the workspace prefix", spec.prefix)]
    templates += [(f"input {k!r}", v) for k, v in spec.inputs.items()]
    for what, template in templates:
        for name in template_fields(template):
            if name not in params:
                problems.append(f"params lack {name!r}, which fills {what} {template!r}")
            elif name in constants:
                try:
                    render_prefix(template, {name: constants[name]})
                except GuardrailError as e:
                    problems.append(e.message)
    return list(dict.fromkeys(problems))


def _input_source_problems(defn: TaskDefinition[Any, Any], sources: Any) -> list[str]:
    """The step's ``"inputs"`` (where it points the task's named inputs), where constant."""
    if sources is None or _is_expression(sources):
        return []
    if not isinstance(sources, Mapping):
        return [f'"inputs" must be an object naming inputs, got {type(sources).__name__}']
    declared = defn.workspace.inputs
    problems = []
    unknown = sorted(str(k) for k in sources if k not in declared)
    if unknown:
        problems.append(
            f'"inputs" names {unknown}, which the task does not declare (its inputs are '
            f"{sorted(declared) or 'none'})"
        )
    for name, source in sources.items():
        if name not in declared or source is None or _is_expression(source):
            continue
        if not isinstance(source, Mapping):
            problems.append(
                f'"inputs" {name!r} must be {{"repository": ..., "ref": ...}} or null, got '
                f"{type(source).__name__}"
            )
            continue
        constants = {k: v for k, v in source.items() if not _contains_expression(v)}
        try:
            InputSourceOverride.model_validate(constants)
        except ValidationError as e:
            for err in e.errors():
                where = ".".join(str(x) for x in err["loc"])
                problems.append(f'"inputs" {name!r} {where}: {err["msg"]}')
    return problems


def _contains_expression(value: Any) -> bool:
    if _is_expression(value):
        return True
    if isinstance(value, Mapping):
        return any(_contains_expression(v) for v in value.values())
    if isinstance(value, list):
        return any(_contains_expression(v) for v in value)
    return False


def workflow_problems(
    steps: Iterable[WorkflowStep],
    tasks: Mapping[str, TaskDefinition[Any, Any]],
    *,
    params_extra: str = "forbid",
) -> list[str]:
    """Every problem of a workflow's use of the Perago tasks in ``tasks`` (by task type);
    ``steps`` from the orchestrator adapter (``perago.adapters.conductor.workflow_steps``).
    ``params_extra`` is the workers' ``PERAGO_PARAMS_EXTRA``: unknown params keys are
    problems unless it is ``ignore`` (the rule the worker applies, ``unknown_param_keys``)."""
    found = []
    for step in steps:
        where = f"workflow {step.workflow!r}, task {step.reference_name!r}"
        found += [f"{where}: {problem}" for problem in step.problems]
        defn = tasks.get(step.task_type)
        if defn is None or step.dynamic:
            continue
        problems = _task_problems(defn, step.inputs, params_extra)
        found += [f"{where} ({defn.name}): {p}" for p in problems]
    return found


def fork_retry_warnings(
    steps: Iterable[WorkflowStep], tasks: Mapping[str, TaskDefinition[Any, Any]]
) -> list[str]:
    """What ``perago register`` warns about a fork: a forked task that leaves a failed body
    to Conductor's retries (``body_retries=0`` with a ``retry_count``). Conductor's JOIN
    may fail the workflow on such a FAILED attempt before its retry exists, cancelling the
    retry, when several branches fail at once (docs/tasks.md, "Retries")."""
    warnings = []
    for step in steps:
        defn = tasks.get(step.task_type)
        if defn is None or not step.forked:
            continue
        options = defn.options
        if options.body_tries == 1 and options.retry_count > 0:
            warnings.append(
                f"workflow {step.workflow!r}, task {step.reference_name!r} ({defn.name}) runs in "
                f"a fork and leaves a failed body to Conductor's retries (body_retries=0, "
                f"retry_count={options.retry_count}): Conductor's JOIN may cancel those "
                "retries when several branches fail at once, failing the workflow. Drop "
                "body_retries=0 (the body is then tried again inside its attempt), or wrap "
                "the task in a SUB_WORKFLOW per branch (docs/tasks.md, Retries)"
            )
    return warnings
