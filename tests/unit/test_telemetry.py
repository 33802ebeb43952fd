"""Traces and lineage of attempts against the stub orchestrator and the in-memory store:
the phases of a publication as spans, START/COMPLETE/FAIL/ABORT events with commits as
dataset versions, and the configuration rules. The real-server tests are
tests/integration/test_telemetry.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder
from pydantic import BaseModel

import perago
from perago import ConfigError, TaskError, WorkspaceSpec, task
from perago.core.orchestrator import Outcome
from perago.telemetry import tracing
from perago.testing import MemoryStore, StubOrchestrator, running_worker
from perago.worker import lineage_events

EXPORTER = InMemorySpanExporter()


class Params(BaseModel):
    mode: str = "write"


class Result(BaseModel):
    ok: bool = True


@task("tel_writer", workspace=WorkspaceSpec(prefix="data/"), retry_count=0)
def tel_writer(workspace: Path, params: Params) -> Result:
    if params.mode == "fail":
        raise TaskError("bad input on purpose", non_retryable=True)
    if params.mode == "until-cancelled":
        perago.wait_cancelled(30)
    if params.mode != "noop":
        (workspace / "out.txt").write_text("x")
    return Result()


@task("tel_reader", workspace=WorkspaceSpec(prefix="data/", read_only=True), retry_count=0)
def tel_reader(workspace: Path, params: Params) -> Result:
    return Result()


class Client:
    """An OpenLineage client that keeps what it is given."""

    class transport:
        kind = "memory"

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        self.events.append(event)


@pytest.fixture(scope="module", autouse=True)
def _provider() -> None:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    monkeypatch.setattr(tracing, "_tracer", None)
    assert tracing.configure({"OTEL_TRACES_EXPORTER": "console"})
    EXPORTER.clear()
    yield EXPORTER
    monkeypatch.setattr(tracing, "_tracer", None)


@pytest.fixture
def lineage(monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    client = Client()
    emitter = lineage_events._Emitter(client, "ns")
    monkeypatch.setattr(lineage_events, "_emitter", emitter)
    yield client
    emitter.close(5)


def run_one(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, task_type: str, mode: str
) -> tuple[str, Outcome]:
    wid = str(uuid.uuid4())
    stub.submit(
        task_type,
        {"workspace": {"repository": "repo", "branch": "main"}, "params": {"mode": mode}},
        workflow_id=wid,
        reference_name="step",
    )
    with running_worker(
        [tel_writer, tel_reader], store=store, orchestrator=stub, work_dir=tmp_path / "w"
    ):
        stub.wait_for(lambda s: s.settled(wid))
    task_id = stub.final(wid).task_id
    outcome = stub.outcome(task_id)
    assert outcome is not None
    return task_id, outcome


def wait_events(client: Client, n: int) -> list[Any]:
    deadline = time.monotonic() + 10
    while len(client.events) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return client.events


def test_a_publication_is_one_span_with_its_phases_in_order(
    spans: InMemorySpanExporter, stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    task_id, outcome = run_one(stub, store, tmp_path, "tel_writer", "write")
    assert outcome.status == "COMPLETED"
    finished = spans.get_finished_spans()
    (root,) = [s for s in finished if s.parent is None]
    children = sorted((s for s in finished if s.parent is not None), key=lambda s: s.start_time)
    assert [c.name for c in children] == [
        "guardrails", "materialize", "body", "post-guardrail", "diff", "stage", "fences",
        "merge", "report",
    ]  # fmt: skip
    assert all(c.parent.span_id == root.context.span_id for c in children)
    attrs = root.attributes
    assert attrs["perago.task_id"] == task_id and attrs["perago.scope"] == "data/"
    assert attrs["perago.output_ref"] == outcome.output["workspace"]["ref"]
    assert attrs["perago.status"] == "COMPLETED"
    # the publish histogram links to the trace (what /metrics shows an OpenMetrics scraper)
    encode, _ = choose_encoder("application/openmetrics-text; version=1.0.0")
    trace_id = format(root.context.trace_id, "032x")
    assert f'# {{trace_id="{trace_id}"}}' in encode(REGISTRY).decode()


def test_tracing_is_off_without_the_variables_and_refuses_an_unknown_exporter() -> None:
    assert not tracing.configure({})
    assert not tracing.configure({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.configure(
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}
    )
    with pytest.raises(ConfigError, match="Perago knows otlp, console and none"):
        tracing._make_provider({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ConfigError, match="OTLP/HTTP"):
        tracing._make_provider(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        )


def test_lineage_is_off_unless_the_client_is_configured() -> None:
    assert not lineage_events.configure({})
    assert not lineage_events.configure(
        {"OPENLINEAGE_URL": "http://x", "OPENLINEAGE_DISABLED": "true"}
    )


def test_a_publication_sends_start_then_complete_with_the_published_commit(
    lineage: Client, stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    task_id, outcome = run_one(stub, store, tmp_path, "tel_writer", "write")
    start, complete = wait_events(lineage, 2)
    assert (start.eventType.value, complete.eventType.value) == ("START", "COMPLETE")
    assert start.run.runId == complete.run.runId == str(uuid.UUID(task_id))
    (output,) = complete.outputs
    assert (output.namespace, output.name) == ("lakefs://repo", "main/data")
    assert output.facets["version"].datasetVersion == outcome.output["workspace"]["ref"]
    (read,) = complete.inputs
    assert read.facets["version"].datasetVersion == base
    tags = {t.key: t.value for t in complete.run.facets["tags"].tags}
    assert tags["perago.publication"] == "published"


def test_a_noop_publication_says_so(
    lineage: Client, stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    base = store.branch_head("repo", "main")
    _, _outcome = run_one(stub, store, tmp_path, "tel_writer", "noop")
    _, complete = wait_events(lineage, 2)
    tags = {t.key: t.value for t in complete.run.facets["tags"].tags}
    assert tags["perago.publication"] == "noop"
    assert complete.outputs[0].facets["version"].datasetVersion == base


def test_a_failure_sends_fail_with_the_error_and_its_traceback(
    lineage: Client, stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    _, outcome = run_one(stub, store, tmp_path, "tel_writer", "fail")
    assert outcome.status == "FAILED_WITH_TERMINAL_ERROR"
    _, fail = wait_events(lineage, 2)
    assert fail.eventType.value == "FAIL"
    error = fail.run.facets["errorMessage"]
    assert "bad input on purpose" in error.message and "raise TaskError" in error.stackTrace


def test_a_drained_attempt_sends_abort(
    lineage: Client, stub: StubOrchestrator, store: MemoryStore, tmp_path: Path
) -> None:
    wid = str(uuid.uuid4())
    stub.submit(
        "tel_writer",
        {
            "workspace": {"repository": "repo", "branch": "main"},
            "params": {"mode": "until-cancelled"},
        },
        workflow_id=wid,
        reference_name="step",
    )
    with running_worker(
        [tel_writer], store=store, orchestrator=stub, work_dir=tmp_path / "w"
    ) as worker:
        stub.wait_for(lambda s: worker.in_flight() == 1)
        wait_events(lineage, 1)
        threading.Timer(0.1, worker.stop).start()
        stub.wait_for(lambda s: s.outcome(s.final(wid).task_id) is not None)
    _, abort = wait_events(lineage, 2)
    assert abort.eventType.value == "ABORT"
    assert "cancelled" in abort.run.facets["errorMessage"].message


def test_a_lineage_client_that_fails_is_counted_and_fails_no_attempt(
    stub: StubOrchestrator, store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken(Client):
        def emit(self, event: Any) -> None:
            raise ConnectionError("receiver down")

    from perago.telemetry import metrics

    emitter = lineage_events._Emitter(Broken(), "ns")
    monkeypatch.setattr(lineage_events, "_emitter", emitter)
    before = metrics.LINEAGE_EVENTS.labels("failed")._value.get()
    _, outcome = run_one(stub, store, tmp_path, "tel_reader", "read")
    emitter.close(5)
    assert outcome.status == "COMPLETED"
    assert metrics.LINEAGE_EVENTS.labels("failed")._value.get() - before == 2
