"""Write-audit-publish for a whole workflow: two built-in tasks a worker runs like its own.

``perago_wap_begin`` creates the workflow's isolated branch (``perago-wap-<workflow id>``)
from the target branch's head and hands the steps a workspace on it; the steps publish there
as usual, audit steps check it (a failing audit fails the workflow, and the target never sees
any of it); ``perago_wap_publish`` publishes everything the isolated branch changed since
the base onto the target as **one** Perago publication (staged on its own staging branch,
attempt fences, branch lease, publish fence with "the target must still be at the base",
did-it-land on a lost answer), then removes the isolated branch (``PERAGO_WAP_KEEP_BRANCH``
keeps it). Add this module to the worker's and to ``perago register``'s modules:
``perago worker my.tasks perago.wap``. Workflow shape: ``workflows/orders_wap.json``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field

from perago._api.task import TaskDefinition, TaskOptions, WorkspaceSpec

__all__ = [
    "BEGIN",
    "PUBLISH",
    "BeginParams",
    "BeginResult",
    "PublishParams",
    "PublishResult",
    "perago_wap_begin",
    "perago_wap_publish",
]

BEGIN = "perago_wap_begin"
PUBLISH = "perago_wap_publish"


class BeginParams(BaseModel):
    pass


class BeginResult(BaseModel):
    target_branch: str
    base: str = Field(description="The target's head the isolated branch started from.")
    wap_branch: str


class PublishParams(BaseModel):
    target_branch: str = Field(description='"${begin.output.result.target_branch}"')
    base: str = Field(description='"${begin.output.result.base}"')


class PublishResult(BaseModel):
    published: bool
    changes: int
    wap_branch_kept: bool


def _run_by_the_worker(*_: Any, **__: Any) -> Any:
    raise TypeError(
        "perago.wap tasks are run by the Perago worker itself (they create and publish "
        "branches); they have no body to call"
    )


def _system(name: str, params: type[BaseModel], result: type[BaseModel], doc: str) -> Any:
    return TaskDefinition(
        name=name,
        fn=_run_by_the_worker,
        workspace=WorkspaceSpec(prefix="_wap/", read_only=True),
        params_type=params,
        result_type=result,
        options=TaskOptions(retry_count=3, response_timeout=timedelta(minutes=2), description=doc),
        system=name,
    )


perago_wap_begin: TaskDefinition[BeginParams, BeginResult] = _system(
    BEGIN,
    BeginParams,
    BeginResult,
    "Write-audit-publish: create the workflow's isolated branch from the target's head.",
)
perago_wap_publish: TaskDefinition[PublishParams, PublishResult] = _system(
    PUBLISH,
    PublishParams,
    PublishResult,
    "Write-audit-publish: publish the isolated branch onto the target as one publication.",
)
