"""What a Perago task takes and gives in Conductor: ``{"workspace", "params", "inputs"}``
in, ``{"workspace", "result", "inputs"}`` out, as pydantic models and as the JSON schemas
registered with each task definition (``inputSchema``/``outputSchema``), so Conductor's
side documents them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from perago._api.task import TaskDefinition
from perago.errors import GuardrailError

__all__ = [
    "InputOutput",
    "InputSourceOverride",
    "WorkspaceInput",
    "WorkspaceOutput",
    "check_param_keys",
    "input_schema",
    "output_schema",
    "unknown_param_keys",
]

_REPOSITORY = r"^[a-z0-9][a-z0-9-]{2,62}$"
_BAD_REF = re.compile(r"[\s\x00-\x1f\x7f\\]|\.\.")


def _check_ref(ref: str) -> str:
    """A lakeFS ref as a workflow may name it: a branch, tag or commit id, optionally with
    lakeFS's ``~N`` / ``^N`` modifiers."""
    if _BAD_REF.search(ref):
        raise ValueError(
            "not a lakeFS ref: name a branch, tag or commit id (no whitespace, control "
            "characters, backslashes or '..')"
        )
    return ref


Ref = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_check_ref)]
#: At most this much JSON in a task's params (Conductor keeps the task input in its store).
MAX_PARAMS_BYTES = 1024 * 1024


class WorkspaceInput(BaseModel):
    """The ``workspace`` part of a task's input."""

    model_config = ConfigDict(extra="forbid")
    repository: str = Field(min_length=3, max_length=63, pattern=_REPOSITORY)
    branch: str = Field(min_length=1, max_length=256, pattern=r"^\w[-\w]*$")
    ref: Ref | None = None
    #: Join refs: start from the branch head, which must contain each of these commits.
    after: list[Ref] | None = Field(default=None, max_length=1000)


class InputSourceOverride(BaseModel):
    """Where the workflow points one named input (``"inputs": {"customers": {...}}``):
    another repository, and/or a branch, tag or commit. A missing ``ref`` means the
    repository's default branch (another repository) or the workspace's input ref (this one).
    """

    model_config = ConfigDict(extra="forbid")
    repository: str | None = Field(default=None, min_length=3, max_length=63, pattern=_REPOSITORY)
    ref: Ref | None = None


class InputOutput(BaseModel):
    """One input as a COMPLETED task's output lists it: where it was read, to the commit."""

    repository: str
    ref: str
    commit: str
    prefix: str


class WorkspaceOutput(BaseModel):
    """The ``workspace`` part of a task's output: the ref the next step starts from."""

    repository: str
    branch: str
    ref: str


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": True,  # Conductor adds its own keys (e.g. _createdBy)
    }


def input_schema(defn: TaskDefinition[Any, Any]) -> dict[str, Any]:
    """JSON schema of the task's input: the workspace, the params model and, for a task
    with named inputs, where the workflow may point each (all optional)."""
    properties = {
        "workspace": WorkspaceInput.model_json_schema(),
        "params": defn.params_type.model_json_schema(),
    }
    if defn.workspace.inputs:
        override = InputSourceOverride.model_json_schema()
        properties["inputs"] = {
            "type": ["object", "null"],
            "properties": {
                name: {
                    "anyOf": [override, {"type": "null"}],
                    "description": f"Input {name!r}, by default {prefix} at the workspace's "
                    "input ref; null or absent: the default",
                }
                for name, prefix in defn.workspace.inputs.items()
            },
            "additionalProperties": False,
        }
    return _object(properties, ["workspace"])


def output_schema(defn: TaskDefinition[Any, Any]) -> dict[str, Any]:
    """JSON schema of a COMPLETED task's output: the published ref, the result model and,
    for a task with named inputs, the commit each was read at."""
    properties = {
        "workspace": WorkspaceOutput.model_json_schema(),
        "result": defn.result_type.model_json_schema(),
    }
    required = ["workspace", "result"]
    if defn.workspace.inputs:
        properties["inputs"] = {
            "type": "object",
            "properties": {name: InputOutput.model_json_schema() for name in defn.workspace.inputs},
            "additionalProperties": False,
        }
        required.append("inputs")
    return _object(properties, required)


def unknown_param_keys(defn: TaskDefinition[Any, Any], params: Any) -> list[str]:
    """The params keys the task's model does not know (a typo such as ``"rnak"``), unless
    the model itself says what to do with extra keys (``model_config["extra"]``). The one
    rule the worker (``check_param_keys``) and ``perago register`` both apply."""
    model = defn.params_type
    if not isinstance(params, dict) or "extra" in model.model_config:
        return []
    known: set[str] = set()
    for name, field in model.model_fields.items():
        known.add(name)
        if isinstance(field.alias, str):
            known.add(field.alias)
        if isinstance(field.validation_alias, str):
            known.add(field.validation_alias)
    return sorted(str(k) for k in params if k not in known)


def check_param_keys(defn: TaskDefinition[Any, Any], params: Any) -> None:
    """``GuardrailError`` (terminal) naming the unknown params keys, if any: otherwise the
    key would be dropped silently and the field's default used."""
    unknown = unknown_param_keys(defn, params)
    if unknown:
        raise GuardrailError(
            f"unknown params {unknown} for {defn.name} (its params are "
            f"{sorted(defn.params_type.model_fields) or 'none'}); fix the workflow's task "
            "input, or set PERAGO_PARAMS_EXTRA=ignore to drop unknown keys"
        )
