"""The only module that talks to Conductor.

It uses conductor-python's HTTP client (connection handling, auth) but exchanges plain JSON,
so the rest of Perago never sees the SDK's generated models. Errors become
:class:`perago.errors.OrchestratorError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from conductor.client.configuration.configuration import Configuration
from conductor.client.http.api_client import ApiClient
from conductor.client.http.rest import ApiException
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from perago.config import Settings
from perago.errors import OrchestratorError

__all__ = ["ConductorClient", "TaskSnapshot", "is_transient"]

T = TypeVar("T")
_JSON = {"Content-Type": "application/json", "Accept": "application/json"}


def is_transient(e: BaseException) -> bool:
    # The SDK reports a refused connection as HTTP status 0.
    return isinstance(e, OrchestratorError) and (not e.status or e.status >= 500 or e.status == 429)


#: A Conductor restart takes tens of seconds; idempotent calls ride it out, then re-read state.
_retry = retry(
    retry=retry_if_exception(is_transient),
    stop=stop_after_delay(120),
    wait=wait_exponential(multiplier=0.25, max=5),
    reraise=True,
)


@dataclass(frozen=True)
class TaskSnapshot:
    """The fields of a Conductor task that attempt fencing and execution need."""

    task_id: str
    task_type: str
    reference_name: str
    workflow_id: str
    status: str
    retry_count: int
    poll_count: int
    worker_id: str
    response_timeout_seconds: int
    input: dict[str, Any]
    update_time_ms: int = 0

    @classmethod
    def from_json(cls, t: dict[str, Any]) -> TaskSnapshot:
        return cls(
            task_id=str(t.get("taskId", "")),
            task_type=str(t.get("taskDefName") or t.get("taskType") or ""),
            reference_name=str(t.get("referenceTaskName", "")),
            workflow_id=str(t.get("workflowInstanceId", "")),
            status=str(t.get("status", "")),
            retry_count=int(t.get("retryCount") or 0),
            poll_count=int(t.get("pollCount") or 0),
            worker_id=str(t.get("workerId") or ""),
            response_timeout_seconds=int(t.get("responseTimeoutSeconds") or 0),
            input=dict(t.get("inputData") or {}),
            update_time_ms=int(t.get("updateTime") or t.get("endTime") or 0),
        )


class ConductorClient:
    """Typed JSON calls to the Conductor REST API (`/api`)."""

    def __init__(self, settings: Settings) -> None:
        self._url = settings.conductor_server_url
        self._timeout = settings.http_timeout.total_seconds()
        self._client = ApiClient(Configuration(server_api_url=self._url))

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        timeout: float | None = None,
        what: str,
    ) -> Any:
        try:
            resp = self._client.rest_client.request(
                method,
                self._url + path,
                query_params=query,
                headers=dict(_JSON),
                body=body,
                _request_timeout=timeout or self._timeout,
            )
        except ApiException as e:
            body_text = str(e.body)[:300] if e.body else ""
            raise OrchestratorError(
                f"Conductor {what} failed with HTTP {e.status}: {body_text or e.reason}",
                status=e.status,
            ) from e
        except (httpx.HTTPError, OSError) as e:
            raise OrchestratorError(
                f"Conductor {what} failed: cannot reach {self._url} ({e}); is Conductor running?"
            ) from e
        data = resp.data
        if resp.status == 204 or not data:
            return None
        text = data.decode() if isinstance(data, bytes) else str(data)
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    # -- worker side ---------------------------------------------------------------------

    def batch_poll(
        self, task_type: str, *, worker_id: str, count: int, timeout_ms: int
    ) -> list[dict[str, Any]]:
        result = self._call(
            "GET",
            f"/tasks/poll/batch/{task_type}",
            query=[("workerid", worker_id), ("count", count), ("timeout", timeout_ms)],
            timeout=self._timeout + timeout_ms / 1000,
            what=f"poll {task_type}",
        )
        return list(result or [])

    @_retry
    def get_task(self, task_id: str) -> TaskSnapshot | None:
        try:
            t = self._call("GET", f"/tasks/{task_id}", what=f"get task {task_id}")
        except OrchestratorError as e:
            if e.status == 404:
                return None
            raise
        return TaskSnapshot.from_json(t) if t else None

    @_retry
    def update_task(self, result: dict[str, Any]) -> None:
        """Report a task result (v1 endpoint: it never hands back another task)."""
        self._call("POST", "/tasks", body=result, what=f"update task {result.get('taskId')}")

    def update_task_once(self, result: dict[str, Any], *, timeout: float) -> None:
        """One update, no retry, within ``timeout`` seconds (a guarded write's budget)."""
        self._call(
            "POST",
            "/tasks",
            body=result,
            timeout=timeout,
            what=f"update task {result.get('taskId')}",
        )

    def extend_lease(self, task_id: str, workflow_id: str, worker_id: str) -> None:
        self.update_task(
            {
                "taskId": task_id,
                "workflowInstanceId": workflow_id,
                "workerId": worker_id,
                "status": "IN_PROGRESS",
                "extendLease": True,
            }
        )

    # -- definitions ---------------------------------------------------------------------

    @_retry
    def register_task_defs(self, defs: list[dict[str, Any]]) -> None:
        self._call("POST", "/metadata/taskdefs", body=defs, what="register task definitions")

    @_retry
    def task_def_exists(self, name: str) -> bool:
        try:
            found = self._call("GET", f"/metadata/taskdefs/{name}", what=f"get task def {name}")
        except OrchestratorError as e:
            if e.status == 404:
                return False
            raise
        return bool(found)

    @_retry
    def put_workflow_defs(self, defs: list[dict[str, Any]]) -> None:
        self._call("PUT", "/metadata/workflow", body=defs, what="register workflow definitions")

    # -- workflows -----------------------------------------------------------------------

    def start_workflow(
        self, name: str, workflow_input: dict[str, Any], *, version: int | None = None
    ) -> str:
        body: dict[str, Any] = {"name": name, "input": workflow_input}
        if version is not None:
            body["version"] = version
        result = self._call("POST", "/workflow", body=body, what=f"start workflow {name}")
        return str(result)

    @_retry
    def get_workflow(self, workflow_id: str, *, include_tasks: bool = True) -> dict[str, Any]:
        result = self._call(
            "GET",
            f"/workflow/{workflow_id}",
            query=[("includeTasks", str(include_tasks).lower())],
            what=f"get workflow {workflow_id}",
        )
        return dict(result or {})

    def terminate_workflow(self, workflow_id: str, reason: str) -> None:
        self._call(
            "DELETE",
            f"/workflow/{workflow_id}",
            query=[("reason", reason)],
            what=f"terminate workflow {workflow_id}",
        )

    def close(self) -> None:
        close: Callable[[], None] | None = getattr(self._client, "close", None)
        if close:
            close()
