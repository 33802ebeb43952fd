"""The only module that talks to Conductor, or knows a word of its JSON.

:class:`ConductorClient` implements :class:`perago.core.orchestrator.Orchestrator`. It uses
conductor-python's HTTP client (connection handling, auth) but exchanges plain JSON, so the
rest of Perago never sees the SDK's generated models; task definitions, task and workflow
states and workflow task types are spelled here too. Errors become
:class:`perago.errors.OrchestratorError`.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import httpx
import structlog
from conductor.client.configuration.configuration import Configuration
from conductor.client.configuration.settings.authentication_settings import (
    AuthenticationSettings,
)
from conductor.client.http.api_client import ApiClient
from conductor.client.http.rest import ApiException, AuthorizationException
from pydantic import SecretStr

from perago._api.task import TaskDefinition
from perago._api.task_io import input_schema, output_schema
from perago.core.orchestrator import Outcome, TaskSnapshot, WorkflowStep
from perago.core.retry_policy import retrying
from perago.core.step_lineage import ParentStep
from perago.errors import ConfigError, OrchestratorError
from perago.telemetry import metrics

__all__ = [
    "NON_WORKER_TYPES",
    "ConductorClient",
    "ConductorConnection",
    "TaskSnapshot",
    "WorkflowRun",
    "task_def",
    "task_snapshot",
    "worker_tasks",
    "workflow_def_defaults",
    "workflow_steps",
]

T = TypeVar("T")
log = structlog.get_logger("perago.conductor")
_JSON = {"Content-Type": "application/json", "Accept": "application/json"}


def _is_transient(e: BaseException) -> bool:
    # The SDK reports a refused connection as HTTP status 0.
    return isinstance(e, OrchestratorError) and (not e.status or e.status >= 500 or e.status == 429)


#: A Conductor restart takes tens of seconds; idempotent calls ride it out, then re-read state.
_retry = retrying(_is_transient, retry_for=120)


#: Task states after which a task never changes again.
_TERMINAL_TASK = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "FAILED_WITH_TERMINAL_ERROR",
        "TIMED_OUT",
        "CANCELED",
        "SKIPPED",
        "COMPLETED_WITH_ERRORS",
    }
)

#: Workflow states after which `perago run --wait` stops waiting.
_WORKFLOW_TERMINAL = frozenset({"COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED", "PAUSED"})

#: Workflow task types the server runs itself: no worker polls for them.
NON_WORKER_TYPES = frozenset(
    {
        "SWITCH",
        "DECISION",
        "FORK_JOIN",
        "FORK_JOIN_DYNAMIC",
        "JOIN",
        "DO_WHILE",
        "SUB_WORKFLOW",
        "SET_VARIABLE",
        "TERMINATE",
        "WAIT",
        "HTTP",
        "INLINE",
        "JSON_JQ_TRANSFORM",
        "EVENT",
        "HUMAN",
        "DYNAMIC",
        "START_WORKFLOW",
        "KAFKA_PUBLISH",
        "NOOP",
    }
)

#: How much of a failure's traceback goes into the task's execution log.
_MAX_LOG = 16_000
#: Conductor keeps at most this much of a failure reason.
_MAX_REASON = 2000


@dataclass(frozen=True)
class WorkflowRun:
    """A workflow execution as `perago run --wait` shows it."""

    workflow_id: str
    status: str
    output: dict[str, Any]
    steps: tuple[str, ...]  # "<task ref>:<status>", in order
    failure: str  # the last failed step and its reason, or the workflow's reason
    #: The task id of that failed step ("" if none): its execution log has the traceback.
    failed_task_id: str = ""
    #: Steps of incremental tasks that answered from an earlier publication (their task
    #: refs, those inside sub-workflows as ``<sub-workflow ref>/<ref>``), and those that ran.
    reused: tuple[str, ...] = ()
    ran: tuple[str, ...] = ()

    @property
    def ended(self) -> bool:
        return self.status in _WORKFLOW_TERMINAL

    @property
    def completed(self) -> bool:
        return self.status == "COMPLETED"

    @classmethod
    def from_json(
        cls, wf: dict[str, Any], child: Callable[[str], dict[str, Any]] | None = None
    ) -> WorkflowRun:
        """``child(workflow_id)`` reads a sub-workflow: the failure is then the failed task
        inside the failed sub-workflows, not the SUB_WORKFLOW or JOIN task above it."""
        tasks = list(wf.get("tasks") or [])
        failure, failed = _failure(wf, child)
        reused, ran = _worked(wf, child)
        return cls(
            workflow_id=str(wf.get("workflowId", "")),
            status=str(wf.get("status", "")),
            output=dict(wf.get("output") or {}),
            steps=tuple(f"{t.get('referenceTaskName')}:{t.get('status')}" for t in tasks),
            failure=failure,
            failed_task_id=str(failed.get("taskId", "")) if failed else "",
            reused=tuple(reused),
            ran=tuple(ran),
        )


def _worked(
    wf: dict[str, Any], child: Callable[[str], dict[str, Any]] | None, depth: int = 0
) -> tuple[list[str], list[str]]:
    """The completed Perago steps that reused an earlier publication, and those that ran
    (a step is Perago's when its output has a ``workspace``), completed sub-workflows
    followed when ``child`` reads them."""
    reused: list[str] = []
    ran: list[str] = []
    for t in wf.get("tasks") or []:
        if t.get("status") != "COMPLETED":
            continue
        ref, output = str(t.get("referenceTaskName", "")), t.get("outputData") or {}
        sub = str(t.get("subWorkflowId") or output.get("subWorkflowId") or "")
        if t.get("taskType") == "SUB_WORKFLOW" and sub and child is not None:
            if depth >= _MAX_NESTING:
                continue
            try:
                inner = child(sub)
            except OrchestratorError:
                continue
            r, n = _worked(inner, child, depth + 1)
            reused += [f"{ref}/{x}" for x in r]
            ran += [f"{ref}/{x}" for x in n]
        elif "reused" in output:
            reused.append(ref)
        elif isinstance(output.get("workspace"), dict) and "result" in output:
            ran.append(ref)
    return reused, ran


#: Statuses of a task that failed by itself, before those that ended because another did.
_FAILED_FIRST = ("FAILED_WITH_TERMINAL_ERROR", "FAILED", "TIMED_OUT")
_NOT_FAILED = ("COMPLETED", "IN_PROGRESS", "SCHEDULED", "SKIPPED")
#: How deep `perago run --wait` follows failed sub-workflows.
_MAX_NESTING = 8


def _failed_task(tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The task to blame: the last one that failed by itself (a forked task, not the JOIN
    that was cancelled after it), else the last one that did not complete."""
    ended = [t for t in tasks if t.get("status") not in _NOT_FAILED]
    for task in reversed(ended):
        if task.get("status") in _FAILED_FIRST and task.get("taskType") not in ("JOIN", "FORK"):
            return dict(task)
    return dict(ended[-1]) if ended else None


def _failure(
    wf: dict[str, Any], child: Callable[[str], dict[str, Any]] | None, depth: int = 0
) -> tuple[str, dict[str, Any] | None]:
    """What `perago run --wait` says failed, and the task it blames (None: the workflow's
    own reason). Follows a failed SUB_WORKFLOW into its workflow; the task's real status
    (Conductor's nested reason says FAILED for a FAILED_WITH_TERMINAL_ERROR child)."""
    own = str(wf.get("reasonForIncompletion") or "")
    t = _failed_task(list(wf.get("tasks") or []))
    if t is None:
        return own or "no reason given", None
    sub = str(t.get("subWorkflowId") or (t.get("outputData") or {}).get("subWorkflowId") or "")
    if t.get("taskType") == "SUB_WORKFLOW" and sub and child is not None and depth < _MAX_NESTING:
        try:
            inner = child(sub)
        except OrchestratorError:
            inner = {}
        if inner:
            text, blamed = _failure(inner, child, depth + 1)
            name = inner.get("workflowName") or t.get("referenceTaskName")
            return f"{text} (in sub-workflow {name} {sub}, task {t.get('referenceTaskName')})", (
                blamed
            )
    reason = str(t.get("reasonForIncompletion") or "") or own or "no reason given"
    text = (
        f"task {t.get('referenceTaskName')} ({t.get('taskType')}) {t.get('status')} after "
        f"{int(t.get('retryCount') or 0) + 1} attempt(s): {reason}"
    )
    return text, t


def task_snapshot(t: dict[str, Any]) -> TaskSnapshot:
    """A Conductor task JSON as the orchestrator-neutral :class:`TaskSnapshot`."""
    status = str(t.get("status", ""))
    return TaskSnapshot(
        task_id=str(t.get("taskId", "")),
        task_type=str(t.get("taskDefName") or t.get("taskType") or ""),
        reference_name=str(t.get("referenceTaskName", "")),
        workflow_id=str(t.get("workflowInstanceId", "")),
        status=status,
        retry_count=int(t.get("retryCount") or 0),
        poll_count=int(t.get("pollCount") or 0),
        worker_id=str(t.get("workerId") or ""),
        response_timeout_seconds=int(t.get("responseTimeoutSeconds") or 0),
        input=dict(t.get("inputData") or {}),
        update_time_ms=int(t.get("updateTime") or t.get("endTime") or 0),
        terminal=status in _TERMINAL_TASK,
        workflow_type=str(t.get("workflowType") or ""),
    )


def task_def(defn: TaskDefinition[Any, Any], *, schemas: bool = False) -> dict[str, Any]:
    """The Conductor task definition of a Perago task.

    Conductor copies a task's definition into every task it schedules and re-reads a
    workflow's tasks on every update, so the definition is kept small: the input and output
    JSON schemas (about 2 KiB for a plain task) go in only with ``schemas`` (``perago
    register --schemas``). They made a 1,000-way fork's workflow 11 MB instead of 4.5 MB and
    cost Conductor a third more CPU (docs/benchmarks.md, (l)).
    """
    o = defn.options
    d: dict[str, Any] = {
        "name": defn.name,
        "description": o.description or _summary(inspect.getdoc(defn.fn) or defn.name),
        "retryCount": o.retry_count,
        "retryLogic": "FIXED",
        "retryDelaySeconds": int(o.retry_delay.total_seconds()),
        "timeoutSeconds": int(o.timeout.total_seconds()),
        "responseTimeoutSeconds": int(o.response_timeout.total_seconds()),
        "timeoutPolicy": "TIME_OUT_WF",
        "inputKeys": ["workspace", "params"],
        "outputKeys": ["workspace", "result"],
    }
    if schemas:
        # Stored with the definition and shown by Conductor (GET /metadata/taskdefs/NAME);
        # Conductor OSS does not enforce them (the worker validates every input itself).
        d["inputSchema"] = _schema(f"{defn.name}_input", input_schema(defn))
        d["outputSchema"] = _schema(f"{defn.name}_output", output_schema(defn))
        d["enforceSchema"] = False
    return d


def _summary(doc: str) -> str:
    """A docstring's first paragraph, at most 200 characters: the definition's description."""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    return first if len(first) <= 200 else first[:199] + "…"


def _schema(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Conductor's SchemaDef: a named, versioned JSON schema."""
    return {"name": name, "version": 1, "type": "JSON", "data": data}


def _nested(
    task: dict[str, Any], workflow: str, forked: bool = False
) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(workflow name, task, inside a fork) of every task under ``task``, including itself:
    fork branches, loop bodies, switch cases and inline sub-workflow definitions (a
    sub-workflow's tasks are not inside its parent's fork: the child has its own decider)."""
    yield workflow, task, forked
    for branch in task.get("forkTasks") or []:
        for t in branch:
            yield from _nested(t, workflow, True)
    for key in ("loopOver", "defaultCase"):
        for t in task.get(key) or []:
            yield from _nested(t, workflow, forked)
    for case in (task.get("decisionCases") or {}).values():
        for t in case:
            yield from _nested(t, workflow, forked)
    inline = (task.get("subWorkflowParam") or {}).get("workflowDefinition")
    if isinstance(inline, dict):
        name = f"{workflow} > {inline.get('name', task.get('taskReferenceName', '?'))}"
        for t in inline.get("tasks") or []:
            yield from _nested(t, name)


def workflow_steps(workflow: dict[str, Any]) -> Iterator[WorkflowStep]:
    """Every step of a Conductor workflow definition, nested ones included; a dynamic fork
    that names its task (``forkTaskName``) adds that task as a forked step."""
    name = str(workflow.get("name", "?"))
    for top in workflow.get("tasks") or []:
        for wf_name, t, forked in _nested(top, name):
            kind = str(t.get("type", "SIMPLE")).upper() or "SIMPLE"
            problems = []
            if kind == "FORK_JOIN_DYNAMIC" and not t.get("forkTaskName"):
                problems = [
                    f"FORK_JOIN_DYNAMIC needs {key!r}"
                    for key in ("dynamicForkTasksParam", "dynamicForkTasksInputParamName")
                    if not t.get(key)
                ]
            yield WorkflowStep(
                workflow=wf_name,
                reference_name=str(t.get("taskReferenceName", "")),
                task_type=str(t.get("name", "")) if kind == "SIMPLE" else "",
                inputs=t.get("inputParameters"),
                problems=tuple(problems),
                forked=forked,
            )
            if kind == "FORK_JOIN_DYNAMIC" and t.get("forkTaskName"):
                yield WorkflowStep(
                    workflow=wf_name,
                    reference_name=f"{t.get('taskReferenceName', '')}[*]",
                    task_type=str(t["forkTaskName"]),
                    inputs=None,
                    forked=True,
                    dynamic=True,
                )


def worker_tasks(tasks: Iterable[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """(task type, reference name) of every worker task of a workflow's task list, nested
    ones (fork branches, loops, switch cases) included."""
    for t in tasks:
        kind = str(t.get("type", "SIMPLE")).upper()
        if kind not in NON_WORKER_TYPES:
            yield str(t.get("name", "")), str(t.get("taskReferenceName", ""))
        for branch in t.get("forkTasks") or []:
            yield from worker_tasks(branch)
        for nested_key in ("loopOver", "defaultCase"):
            yield from worker_tasks(t.get(nested_key) or [])
        for case in (t.get("decisionCases") or {}).values():
            yield from worker_tasks(case)


def workflow_def_defaults(wf: dict[str, Any]) -> dict[str, Any]:
    """A workflow definition with the fields Conductor requires filled in when missing."""
    return {"version": 1, "schemaVersion": 2, "ownerEmail": "perago@example.com", **wf}


def _update_body(task: TaskSnapshot, worker_id: str, outcome: Outcome) -> dict[str, Any]:
    body: dict[str, Any] = {
        "taskId": task.task_id,
        "workflowInstanceId": task.workflow_id,
        "workerId": worker_id,
        "status": outcome.status,
        "outputData": outcome.output,
    }
    if outcome.reason:
        body["reasonForIncompletion"] = outcome.reason[:_MAX_REASON]
    if outcome.details:
        # Conductor keeps these as the task's execution log (its UI's "Logs" tab, and
        # GET /api/tasks/{taskId}/log), in the same update as the status.
        body["logs"] = [
            {
                "log": outcome.details[:_MAX_LOG],
                "taskId": task.task_id,
                "createdTime": int(time.time() * 1000),
            }
        ]
    return body


class ConductorConnection(Protocol):
    """The values the client connects with; :class:`perago.config.Settings` has them."""

    @property
    def conductor_server_url(self) -> str: ...
    @property
    def conductor_auth_key(self) -> str: ...
    @property
    def conductor_auth_secret(self) -> SecretStr: ...
    @property
    def http_timeout(self) -> timedelta: ...


class ConductorClient:
    """Typed JSON calls to the Conductor REST API (`/api`)."""

    def __init__(self, settings: ConductorConnection) -> None:
        self._url = settings.conductor_server_url
        self._timeout = settings.http_timeout.total_seconds()
        auth = None
        if settings.conductor_auth_key:
            secret = settings.conductor_auth_secret.get_secret_value()
            if not secret:
                raise ConfigError(
                    "CONDUCTOR_AUTH_KEY is set but CONDUCTOR_AUTH_SECRET is not: set both "
                    "(the application's key id and secret) or neither"
                )
            auth = AuthenticationSettings(key_id=settings.conductor_auth_key, key_secret=secret)
        self._authenticated = auth is not None
        # The SDK's client mints the token (`POST /token`) and renews it after its TTL;
        # an expired or invalid token answered by the server is renewed in `_call`.
        self._client = ApiClient(
            Configuration(server_api_url=self._url, authentication_settings=auth)
        )
        if auth is not None and self._client.configuration.authentication_settings is None:
            # The SDK's rule: a server without `/token` (Conductor OSS) runs open.
            log.warning("conductor_auth_not_offered", server=self._url)
            self._authenticated = False
        self._parents: dict[str, ParentStep | None] = {}

    def _headers(self) -> dict[str, str]:
        headers = dict(_JSON)
        if self._authenticated:
            auth = self._client.get_authentication_headers()  # renews after the token's TTL
            if auth:
                headers.update(auth["header"])
        return headers

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        timeout: float | None = None,
        endpoint: str,
        what: str,
    ) -> Any:
        """One request; ``endpoint`` (a fixed name, never an id) labels its latency metric."""
        started = time.monotonic()
        outcome = "error"
        try:
            result = self._request(method, path, query, body, timeout, what)
            outcome = "ok"
            return result
        except OrchestratorError as e:
            outcome = "not_found" if e.status == 404 else "error"
            raise
        finally:
            metrics.CONDUCTOR_SECONDS.labels(endpoint=endpoint, outcome=outcome).observe(
                time.monotonic() - started
            )

    def _request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]] | None,
        body: Any,
        timeout: float | None,
        what: str,
    ) -> Any:
        for renewed in (False, True):
            try:
                resp = self._client.rest_client.request(
                    method,
                    self._url + path,
                    query_params=query,
                    headers=self._headers(),
                    body=body,
                    _request_timeout=timeout or self._timeout,
                )
                break
            except AuthorizationException as e:
                stale = e.token_expired or e.invalid_token
                if self._authenticated and stale and not renewed:
                    log.info("conductor_token_renewing", reason=e.error_code)
                    if self._client.force_refresh_auth_token():
                        continue
                raise OrchestratorError(
                    f"Conductor refused {what} (HTTP {e.status} {e.error_code or e.reason}): "
                    + (
                        "check CONDUCTOR_AUTH_KEY and CONDUCTOR_AUTH_SECRET and the "
                        "application's permissions"
                        if self._authenticated
                        else "the server wants a token: set CONDUCTOR_AUTH_KEY and "
                        "CONDUCTOR_AUTH_SECRET"
                    ),
                    status=e.status,
                ) from e
            except ApiException as e:
                body_text = str(e.body)[:300] if e.body else ""
                raise OrchestratorError(
                    f"Conductor {what} failed with HTTP {e.status}: {body_text or e.reason}",
                    status=e.status,
                ) from e
            except (httpx.HTTPError, OSError) as e:
                raise OrchestratorError(
                    f"Conductor {what} failed: cannot reach {self._url} ({e}); "
                    "is Conductor running?"
                ) from e
        data = resp.data
        if resp.status == 204 or not data:
            return None
        text = data.decode() if isinstance(data, bytes) else str(data)
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    # -- worker side (perago.core.orchestrator.Orchestrator) ------------------------------------

    def poll(
        self,
        task_type: str,
        *,
        worker_id: str,
        count: int,
        domain: str | None = None,
        wait_ms: int = 100,
    ) -> list[TaskSnapshot]:
        timeout_ms = max(0, wait_ms)
        query: list[tuple[str, Any]] = [
            ("workerid", worker_id),
            ("count", count),
            ("timeout", timeout_ms),
        ]
        if domain:
            query.append(("domain", domain))
        result = self._call(
            "GET",
            f"/tasks/poll/batch/{task_type}",
            query=query,
            endpoint="poll",
            timeout=self._timeout + timeout_ms / 1000,
            what=f"poll {task_type}",
        )
        return [task_snapshot(t) for t in result or []]

    @_retry
    def get_task(self, task_id: str) -> TaskSnapshot | None:
        try:
            t = self._call(
                "GET", f"/tasks/{task_id}", endpoint="get_task", what=f"get task {task_id}"
            )
        except OrchestratorError as e:
            if e.status == 404:
                return None
            raise
        return task_snapshot(t) if t else None

    def report(
        self,
        task: TaskSnapshot,
        outcome: Outcome,
        *,
        worker_id: str,
        timeout: float | None = None,
    ) -> None:
        """Send the outcome; with ``timeout`` (a guarded write's budget): once, within it."""
        body = _update_body(task, worker_id, outcome)
        if timeout is None:
            self._update(body)
            return
        self._call(
            "POST",
            "/tasks",
            body=body,
            timeout=timeout,
            endpoint="update_task",
            what=f"update task {task.task_id}",
        )

    def task_logs(self, task_id: str) -> list[str]:
        """The task's execution log lines (a failed attempt's traceback is one of them)."""
        logs = self._call(
            "GET", f"/tasks/{task_id}/log", endpoint="task_logs", what=f"read the log of {task_id}"
        )
        return [str(entry.get("log", "")) for entry in logs or []]

    def give_back(self, task: TaskSnapshot, *, worker_id: str) -> None:
        """A plain IN_PROGRESS update: Conductor makes the task SCHEDULED again and puts its
        message back in the queue after ``callbackAfterSeconds`` (0: at once); the next poll
        delivers it with its poll count raised."""
        self._update(
            {
                "taskId": task.task_id,
                "workflowInstanceId": task.workflow_id,
                "workerId": worker_id,
                "status": "IN_PROGRESS",
                "callbackAfterSeconds": 0,
            }
        )

    def extend(self, task: TaskSnapshot, *, worker_id: str, progress: str | None = None) -> None:
        """Conductor's ``extendLease`` update: resets the task's response timeout. A progress
        note goes first, as a line of the task's execution log: an ``extendLease`` update
        keeps no output or log, and a plain IN_PROGRESS one would put the task back in the
        queue (both seen on the 3.32.3 server)."""
        if progress is not None:
            self._call(
                "POST",
                f"/tasks/{task.task_id}/log",
                body=f"progress: {progress}"[:_MAX_LOG],
                endpoint="task_log",
                what=f"log the progress of task {task.task_id}",
            )
        self._update(
            {
                "taskId": task.task_id,
                "workflowInstanceId": task.workflow_id,
                "workerId": worker_id,
                "status": "IN_PROGRESS",
                "extendLease": True,
            }
        )

    @_retry
    def _update(self, body: dict[str, Any]) -> None:
        """Update a task (v1 endpoint: it never hands back another task)."""
        self._call(
            "POST",
            "/tasks",
            body=body,
            endpoint="update_task",
            what=f"update task {body.get('taskId')}",
        )

    # -- definitions ---------------------------------------------------------------------

    @_retry
    def register_task_defs(self, defs: list[dict[str, Any]]) -> None:
        self._call(
            "POST",
            "/metadata/taskdefs",
            body=defs,
            endpoint="register_task_defs",
            what="register task definitions",
        )

    def register_tasks(
        self, tasks: Sequence[TaskDefinition[Any, Any]], *, schemas: bool = False
    ) -> None:
        """Upsert the task definitions of Perago tasks (with their JSON schemas: ``schemas``)."""
        self.register_task_defs([task_def(t, schemas=schemas) for t in tasks])

    @_retry
    def task_def_exists(self, name: str) -> bool:
        try:
            found = self._call(
                "GET",
                f"/metadata/taskdefs/{name}",
                endpoint="get_task_def",
                what=f"get task def {name}",
            )
        except OrchestratorError as e:
            if e.status == 404:
                return False
            raise
        return bool(found)

    @_retry
    def put_workflow_defs(self, defs: list[dict[str, Any]]) -> None:
        self._call(
            "PUT",
            "/metadata/workflow",
            body=defs,
            endpoint="put_workflow_defs",
            what="register workflow definitions",
        )

    # -- workflows -----------------------------------------------------------------------

    def start_workflow(
        self,
        name: str,
        workflow_input: dict[str, Any],
        *,
        version: int | None = None,
        task_to_domain: dict[str, str] | None = None,
    ) -> str:
        """Start a workflow; ``task_to_domain`` routes its tasks to workers of a domain."""
        body: dict[str, Any] = {"name": name, "input": workflow_input}
        if version is not None:
            body["version"] = version
        if task_to_domain:
            body["taskToDomain"] = dict(task_to_domain)
        result = self._call(
            "POST", "/workflow", body=body, endpoint="start_workflow", what=f"start workflow {name}"
        )
        return str(result)

    @_retry
    def parent_step(self, workflow_id: str) -> ParentStep | None:
        """The SUB_WORKFLOW task that started ``workflow_id`` (``None``: top level); cached,
        since a workflow's parent never changes."""
        if workflow_id in self._parents:
            return self._parents[workflow_id]
        wf = self.get_workflow(workflow_id, include_tasks=False)
        parent_wf, parent_task = wf.get("parentWorkflowId"), wf.get("parentWorkflowTaskId")
        found = None
        if parent_wf and parent_task:
            t = self._call(
                "GET", f"/tasks/{parent_task}", endpoint="get_task", what=f"get task {parent_task}"
            )
            found = ParentStep(
                str(parent_wf), str(t["referenceTaskName"]), int(t.get("retryCount") or 0)
            )
        if len(self._parents) > 4096:
            self._parents.clear()
        self._parents[workflow_id] = found
        return found

    def get_workflow(self, workflow_id: str, *, include_tasks: bool = True) -> dict[str, Any]:
        result = self._call(
            "GET",
            f"/workflow/{workflow_id}",
            query=[("includeTasks", str(include_tasks).lower())],
            endpoint="get_workflow",
            what=f"get workflow {workflow_id}",
        )
        return dict(result or {})

    def completed_outputs(self, workflow_id: str) -> list[tuple[str, dict[str, Any]]]:
        wf = self.get_workflow(workflow_id)
        return [
            (str(t.get("referenceTaskName", "")), dict(t.get("outputData") or {}))
            for t in wf.get("tasks") or []
            if t.get("status") == "COMPLETED" and t.get("taskType") != "SUB_WORKFLOW"
        ]

    def workflow_status(self, workflow_id: str) -> str | None:
        try:
            return str(self.get_workflow(workflow_id, include_tasks=False).get("status") or "")
        except OrchestratorError as e:
            if e.status == 404:
                return None
            raise

    def workflow_run(self, workflow_id: str) -> WorkflowRun:
        """The workflow as `perago run --wait` shows it; once it has ended, its failed
        sub-workflows are followed to the task that failed."""
        wf = self.get_workflow(workflow_id)
        ended = str(wf.get("status", "")) in _WORKFLOW_TERMINAL
        return WorkflowRun.from_json(wf, child=self.get_workflow if ended else None)

    def decide(self, workflow_id: str) -> None:
        """Ask Conductor to evaluate the workflow now (its sweeper would, later)."""
        self._call(
            "PUT", f"/workflow/decide/{workflow_id}", endpoint="decide", what="decide workflow"
        )

    def terminate_workflow(self, workflow_id: str, reason: str) -> None:
        self._call(
            "DELETE",
            f"/workflow/{workflow_id}",
            query=[("reason", reason)],
            endpoint="terminate_workflow",
            what=f"terminate workflow {workflow_id}",
        )

    def close(self) -> None:
        close: Callable[[], None] | None = getattr(self._client, "close", None)
        if close:
            close()
