"""What a Perago task takes and gives in Conductor: ``{"workspace", "params"}`` in,
``{"workspace", "result"}`` out, as pydantic models and as the JSON schemas registered with
each task definition (``inputSchema``/``outputSchema``), so Conductor's side documents them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from perago.task import TaskDefinition

__all__ = ["WorkspaceInput", "WorkspaceOutput", "input_schema", "output_schema"]


class WorkspaceInput(BaseModel):
    """The ``workspace`` part of a task's input."""

    model_config = ConfigDict(extra="forbid")
    repository: str = Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9-]{2,62}$")
    branch: str = Field(min_length=1, max_length=256, pattern=r"^\w[-\w]*$")
    ref: str | None = Field(default=None, min_length=1, max_length=256)
    #: Join refs: start from the branch head, which must contain each of these commits.
    after: list[str] | None = Field(default=None, max_length=1000)


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
    """JSON schema of the task's input: the workspace and the params model."""
    return _object(
        {
            "workspace": WorkspaceInput.model_json_schema(),
            "params": defn.params_type.model_json_schema(),
        },
        ["workspace"],
    )


def output_schema(defn: TaskDefinition[Any, Any]) -> dict[str, Any]:
    """JSON schema of a COMPLETED task's output: the published ref and the result model."""
    return _object(
        {
            "workspace": WorkspaceOutput.model_json_schema(),
            "result": defn.result_type.model_json_schema(),
        },
        ["workspace", "result"],
    )
