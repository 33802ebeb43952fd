"""OpenLineage run events of attempts, with lakeFS commits as dataset versions.

On only when ``openlineage-python`` is installed (``perago-runtime[lineage]``) and the
client's standard configuration names a destination (``OPENLINEAGE_URL``,
``OPENLINEAGE_CONFIG`` or ``OPENLINEAGE__TRANSPORT__...``), and ``OPENLINEAGE_DISABLED``
is not true. Each attempt sends START once its inputs are resolved, then COMPLETE, FAIL or
ABORT (drained or cancelled). Events go out from one background thread through a bounded
queue: a receiver that is slow or down delays no attempt; what cannot be sent is counted
(``perago_lineage_events_total``) and logged.

Naming (OpenLineage's naming rules, with lakeFS's own URIs): a dataset is a folder on a
branch, namespace ``lakefs://<repository>``, name ``<branch>/<prefix>`` (together the
lakeFS URI ``lakefs://<repository>/<branch>/<prefix>``); its version is the commit id
read or published. The job is ``<workflow name>.<step reference>`` in the namespace
``OPENLINEAGE_NAMESPACE`` (default ``perago``); the run id is the Conductor task id of
the attempt, its parent run the workflow.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import threading
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from perago.errors import ConfigError
from perago.telemetry import metrics

if TYPE_CHECKING:
    from perago.core.orchestrator import Outcome
    from perago.worker.attempt import RunningAttempt

__all__ = ["configure", "enabled", "finished", "shutdown", "started"]

log = structlog.get_logger("perago.lineage")

#: Events waiting to be sent at most; more are dropped (and counted).
QUEUE_SIZE = 1000
PRODUCER = "https://pypi.org/project/perago-runtime/"

_emitter: _Emitter | None = None
_lock = threading.Lock()


def _wanted(env: dict[str, str]) -> bool:
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    return bool(
        env.get("OPENLINEAGE_URL")
        or env.get("OPENLINEAGE_CONFIG")
        or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in env)
    )


def configure(env: dict[str, str] | None = None) -> bool:
    """Set up lineage from the client's configuration, once per process; True if it is on."""
    global _emitter
    env = dict(os.environ) if env is None else env
    if not _wanted(env):
        return False
    if importlib.util.find_spec("openlineage.client") is None:
        raise ConfigError(
            "OPENLINEAGE_URL / OPENLINEAGE_CONFIG ask for lineage events, but "
            "openlineage-python is not installed: install perago-runtime[lineage], or unset "
            "them (OPENLINEAGE_DISABLED=true turns lineage off)"
        )
    with _lock:
        if _emitter is None:
            from openlineage.client import OpenLineageClient

            _emitter = _Emitter(OpenLineageClient(), env.get("OPENLINEAGE_NAMESPACE") or "perago")
    log.info("lineage_on", namespace=_emitter.namespace, transport=_emitter.transport)
    return True


def enabled() -> bool:
    return _emitter is not None


def shutdown(timeout: float = 5.0) -> None:
    """Send what is queued, waiting at most ``timeout`` seconds."""
    global _emitter
    emitter, _emitter = _emitter, None
    if emitter is not None:
        emitter.close(timeout)


class _Emitter:
    def __init__(self, client: Any, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.transport = getattr(client.transport, "kind", "?")
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_SIZE)
        self._thread = threading.Thread(target=self._send, daemon=True, name="perago-lineage")
        self._thread.start()

    def emit(self, event: Any) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            metrics.LINEAGE_EVENTS.labels("dropped").inc()
            log.warning("lineage_event_dropped", reason="queue full", queued=QUEUE_SIZE)

    def _send(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self.client.emit(event)
                metrics.LINEAGE_EVENTS.labels("sent").inc()
            except Exception as e:  # noqa: BLE001 - lineage never fails an attempt
                metrics.LINEAGE_EVENTS.labels("failed").inc()
                log.warning(
                    "lineage_event_failed",
                    event_type=str(event.eventType.value),
                    run_id=event.run.runId,
                    error=f"{type(e).__name__}: {e}"[:300],
                )

    def close(self, timeout: float) -> None:
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)


def _uuid(value: str) -> str:
    """Conductor's ids are UUIDs; anything else gets a stable UUID of its own."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"perago:{value}"))


def _dataset(kind: Any, repository: str, ref: str, prefix: str, version: str | None) -> Any:
    from openlineage.client.facet_v2 import dataset_version_dataset

    facets = {}
    if version:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=version
        )
    return kind(
        namespace=f"lakefs://{repository}", name=f"{ref}/{prefix.rstrip('/')}", facets=facets
    )


def _event(attempt: RunningAttempt, state: str, outcome: Outcome | None) -> Any:
    from openlineage.client.event_v2 import (
        InputDataset,
        Job,
        OutputDataset,
        Run,
        RunEvent,
        RunState,
    )
    from openlineage.client.facet_v2 import (
        error_message_run,
        job_type_job,
        parent_run,
        processing_engine_run,
        tags_run,
    )

    from perago.core import VERSION as __version__

    assert _emitter is not None
    namespace, me, snapshot = _emitter.namespace, attempt.identity, attempt.task
    workflow = snapshot.workflow_type or me.workflow_id
    run_facets: dict[str, Any] = {
        "parent": parent_run.ParentRunFacet(
            run=parent_run.Run(runId=_uuid(me.workflow_id)),
            job=parent_run.Job(namespace=namespace, name=workflow),
        ),
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version=__version__, name="perago"
        ),
    }
    tags = {
        "perago.workflow_id": me.workflow_id,
        "perago.task_id": me.task_id,
        "perago.retry_count": str(me.retry_count),
        "perago.scope": attempt.scope,
    }
    inputs, outputs = [], []
    target = attempt.target
    if target is not None:
        inputs.append(
            _dataset(
                InputDataset, target.repository, target.branch, attempt.scope, target.input_ref
            )
        )
        for read in target.reads:
            inputs.append(
                _dataset(
                    InputDataset,
                    read.repository,
                    read.ref or target.branch,
                    read.prefix,
                    read.commit,
                )
            )
        if not attempt.defn.workspace.read_only and attempt.scope:
            published = None
            if outcome is not None and outcome.status == "COMPLETED":
                published = outcome.output.get("workspace", {}).get("ref")
                tags["perago.publication"] = (
                    "noop" if published == target.input_ref else "published"
                )
            outputs.append(
                _dataset(OutputDataset, target.repository, target.branch, attempt.scope, published)
            )
        elif outcome is not None and outcome.status == "COMPLETED":
            tags["perago.publication"] = "read-only"
    if outcome is not None and outcome.status != "COMPLETED":
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=outcome.reason or outcome.status,
            programmingLanguage="python",
            stackTrace=outcome.details or None,
        )
    run_facets["tags"] = tags_run.TagsRunFacet(
        tags=[
            tags_run.TagsRunFacetFields(key=k, value=v, source="PERAGO")
            for k, v in tags.items()
            if v
        ]
    )
    job = Job(
        namespace=namespace,
        name=f"{workflow}.{me.reference_name}",
        facets={
            "jobType": job_type_job.JobTypeJobFacet(
                processingType="BATCH", integration="PERAGO", jobType="TASK"
            )
        },
    )
    return RunEvent(
        eventType=RunState[state],
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=_uuid(me.task_id), facets=run_facets),
        job=job,
        inputs=inputs,
        outputs=outputs,
        producer=PRODUCER,
    )


def started(attempt: RunningAttempt) -> None:
    """The attempt's inputs are resolved: START (nothing when lineage is off)."""
    emitter = _emitter
    if emitter is not None:
        emitter.emit(_event(attempt, "START", None))


def finished(attempt: RunningAttempt, outcome: Outcome, *, aborted: bool = False) -> None:
    """COMPLETE, FAIL, or ABORT for an attempt drained or cancelled."""
    emitter = _emitter
    if emitter is None:
        return
    state = "COMPLETE" if outcome.status == "COMPLETED" else "ABORT" if aborted else "FAIL"
    emitter.emit(_event(attempt, state, outcome))
