"""Traces and lineage on the real servers: a worker pointed at a small OTLP/HTTP and
OpenLineage HTTP receiver (tests/integration/telemetry_receiver.py) through the standard
OTEL_* and OPENLINEAGE_* variables."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from . import openlineage_schema
from .harness import (
    attempts,
    fork,
    free_port,
    one_step,
    perago_cli,
    put_workflow,
    simple_task,
    start,
    wait_workflow,
    worker,
)
from .telemetry_receiver import Receiver, Span

pytestmark = pytest.mark.integration
PINNED = "${workflow.input.workspace}"
WRITER = [
    "guardrails",
    "materialize",
    "body",
    "post-guardrail",
    "diff",
    "stage",
    "fences",
    "merge",
    "report",
]
READER = ["guardrails", "materialize", "body", "post-guardrail", "report"]


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(PERAGO_TEST_RETRIES="0")


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    r = Receiver()
    url = r.start()
    yield r, url
    r.stop()


def telemetry(env: dict[str, str], url: str) -> dict[str, str]:
    return {
        **env,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_SERVICE_NAME": "perago-test",
        "OPENLINEAGE_URL": url,
        "OPENLINEAGE_NAMESPACE": "perago-test",
    }


def phases(spans: list[Span], task_id: str) -> tuple[Span, list[str]]:
    """The attempt's root span and its children's names in the order they started."""
    (root,) = [s for s in spans if s.attributes.get("perago.task_id") == task_id]
    assert root.parent_id == "" and root.name.startswith("perago.attempt ")
    children = sorted(
        (s for s in spans if s.parent_id == root.span_id and s.trace_id == root.trace_id),
        key=lambda s: s.start,
    )
    for a, b in itertools.pairwise(children):
        assert a.end <= b.start, f"{a.name} and {b.name} overlap"
    assert all(root.start <= c.start and c.end <= root.end for c in children)
    return root, [c.name for c in children]


def run_events(events: list[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    run_id = str(uuid.UUID(task_id))
    return [e for e in events if e["run"]["runId"] == run_id]


def test_a_fan_out_and_its_join_send_a_trace_tree_and_lineage_per_attempt(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
) -> None:
    r, url = receiver
    parts = [simple_task(f"pt_part_{unique}", f"p{i}", PINNED, {"part": f"p{i}"}) for i in range(3)]
    after = {
        "repository": "${workflow.input.workspace.repository}",
        "branch": "${workflow.input.workspace.branch}",
        "after": [f"${{p{i}.output.workspace.ref}}" for i in range(3)],
    }
    join = simple_task(f"pt_join_{unique}", "join", PINNED, {})
    join["inputParameters"]["workspace"] = after
    name = f"pt_wf_otel_{unique}"
    put_workflow(conductor, name, [*fork("split", [[p] for p in parts]), join])
    base = store.branch_head(repo, "main")
    with worker(telemetry(env, url), tmp_path / "w.log", concurrency=3) as w:
        wf = wait_workflow(conductor, start(conductor, name, repo, ref=base), timeout=120)
        assert w.stop(timeout=60) == 0  # the drain flushes spans and events
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    published = {
        rec["step"]: rec["commit"]
        for rec in json.loads(perago_cli(["log", f"{repo}/main", "--json"], env).stdout)
    }
    for i in range(3):
        (task,) = attempts(wf, f"p{i}")
        root, names = phases(r.spans, task["taskId"])
        assert names == WRITER
        assert root.attributes["perago.workflow_id"] == wf["workflowId"]
        assert root.attributes["perago.step"] == f"p{i}"
        assert root.attributes["perago.scope"] == f"parts/p=p{i}/"
        assert root.attributes["perago.output_ref"] == published[f"p{i}"]
        start_event, complete = run_events(r.events, task["taskId"])
        assert (start_event["eventType"], complete["eventType"]) == ("START", "COMPLETE")
        for event in (start_event, complete):
            openlineage_schema.check(event)
            assert event["job"] == {
                "namespace": "perago-test",
                "name": f"{name}.p{i}",
                "facets": event["job"]["facets"],
            }
            parent = event["run"]["facets"]["parent"]
            assert parent["run"]["runId"] == str(uuid.UUID(wf["workflowId"]))
            assert (parent["job"]["namespace"], parent["job"]["name"]) == ("perago-test", name)
        (output,) = complete["outputs"]
        assert (output["namespace"], output["name"]) == (f"lakefs://{repo}", f"main/parts/p=p{i}")
        assert output["facets"]["version"]["datasetVersion"] == published[f"p{i}"]
        assert "version" not in start_event["outputs"][0]["facets"]
        (read,) = complete["inputs"]
        assert read["facets"]["version"]["datasetVersion"] == base
    (task,) = attempts(wf, "join")
    root, names = phases(r.spans, task["taskId"])
    assert names == READER
    events = run_events(r.events, task["taskId"])
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    assert len(r.events) == 8  # START and COMPLETE of each of the 4 attempts
    for event in r.events:
        openlineage_schema.check(event)
    tags = {t["key"]: t["value"] for t in events[1]["run"]["facets"]["tags"]["tags"]}
    assert tags["perago.publication"] == "read-only" and events[1]["outputs"] == []
    (read,) = events[1]["inputs"]
    assert read["facets"]["version"]["datasetVersion"] == store.branch_head(repo, "main")


def test_a_failing_attempt_sends_fail_with_its_error_and_an_error_span(
    env: dict[str, str],
    conductor: ConductorClient,
    repo: str,
    unique: str,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
) -> None:
    r, url = receiver
    name = one_step(
        conductor, f"pt_wf_otel_fail_{unique}", f"pt_write_{unique}", {"fail": "terminal"}
    )
    with worker(telemetry(env, url), tmp_path / "w.log") as w:
        wf = wait_workflow(conductor, start(conductor, name, repo), timeout=120)
        assert w.stop(timeout=60) == 0
    assert wf["status"] == "FAILED"
    (task,) = attempts(wf, "step")
    start_event, fail = run_events(r.events, task["taskId"])
    assert (start_event["eventType"], fail["eventType"]) == ("START", "FAIL")
    for event in r.events:
        openlineage_schema.check(event)
    error = fail["run"]["facets"]["errorMessage"]
    assert "the body refused on purpose" in error["message"]
    assert error["programmingLanguage"] == "python" and "raise TaskError" in error["stackTrace"]
    assert "version" not in fail["outputs"][0]["facets"]
    root, names = phases(r.spans, task["taskId"])
    assert names == ["guardrails", "materialize", "body", "report"]
    assert root.status == 2 and root.attributes["perago.status"] == "FAILED_WITH_TERMINAL_ERROR"


def test_a_slow_or_dead_receiver_holds_up_no_attempt(
    env: dict[str, str],
    conductor: ConductorClient,
    repo: str,
    unique: str,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
) -> None:
    """Spans and events go out in the background. Lineage goes to a receiver that holds
    every request for a minute, traces to a port where nothing listens: the workflow
    completes while the first lineage request is still unanswered, and the worker still
    stops at once, giving up on what it could not send."""
    r, url = receiver
    r.delay = 60
    settings = {
        **telemetry(env, url),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
    }
    params = {"files": {"a": "1"}}
    name = one_step(conductor, f"pt_wf_otel_slow_{unique}", f"pt_write_{unique}", params)
    with worker(settings, tmp_path / "w.log") as w:
        wf = wait_workflow(conductor, start(conductor, name, repo), timeout=120)
        assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
        assert r.held() and r.answered() == 0  # completed while it was held up
        assert w.stop(timeout=60) == 0
    assert r.spans == [] and r.answered() == 0
