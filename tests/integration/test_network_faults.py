"""Faults between the worker and each server, through a real fault-injecting proxy.

Toxiproxy (built from the Go module proxy on first use, cached in .stack/bin) sits between a
worker and lakeFS and Conductor; the tests hold a worker at a failpoint, break the link the
way a network does (answers that never come back, a link cut while the task times out,
slow links) and check what the servers recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from chaos.proxy import Toxiproxy
from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.config import load
from perago.core.store import ObjectInfo
from perago.telemetry import metrics
from perago.workspace import materialize

from .harness import (
    attempts,
    decide_now,
    free_port,
    one_step,
    publications,
    put_workflow,
    simple_task,
    start,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration

#: Data in this direction is held back until the toxic goes: a request that reached the
#: server, whose answer never comes back (the client times out).
LOST_ANSWERS = {
    "name": "lost",
    "type": "timeout",
    "stream": "downstream",
    "attributes": {"timeout": 0},
}
#: Nothing gets through either way: the link is cut.
CUT = {"name": "cut", "type": "timeout", "stream": "upstream", "attributes": {"timeout": 0}}


@pytest.fixture(scope="module")
def proxy(
    stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Toxiproxy, dict[str, str]]]:
    tp = Toxiproxy(free_port(), tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log")
    ports = {"lakefs": free_port(), "conductor": free_port()}
    lakefs = urlparse(stack_env["LAKECTL_SERVER_ENDPOINT_URL"]).port
    conductor = urlparse(stack_env["CONDUCTOR_SERVER_URL"]).port
    assert lakefs and conductor
    tp.add("lakefs", ports["lakefs"], lakefs)
    tp.add("conductor", ports["conductor"], conductor)
    through = {
        "LAKECTL_SERVER_ENDPOINT_URL": f"http://127.0.0.1:{ports['lakefs']}",
        "CONDUCTOR_SERVER_URL": f"http://127.0.0.1:{ports['conductor']}/api",
        "PERAGO_HTTP_TIMEOUT": "3",
        "PERAGO_JANITOR_ON_START": "false",
    }
    try:
        yield tp, through
    finally:
        tp.close()


@pytest.fixture
def faulty(
    proxy: tuple[Toxiproxy, dict[str, str]], make_env: Callable[..., dict[str, str]]
) -> Iterator[tuple[Toxiproxy, dict[str, str]]]:
    """The worker's environment through the proxies (registration goes direct)."""
    tp, through = proxy
    env = {**make_env(PERAGO_TEST_RESPONSE_TIMEOUT="6"), **through}
    tp.clear()
    try:
        yield tp, env
    finally:
        tp.clear()


def _events(w: object, name: str) -> list[dict[str, object]]:
    return [e for e in w.events() if e.get("event") == name]  # type: ignore[attr-defined]


def test_a_lost_completed_answer_is_sent_again_and_lands_once(
    faulty: tuple[Toxiproxy, dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """The resend happens inside the report window, which ends before the grant would (less
    its safety margin): with the suite's 4 s lease ttl a window is too short for a 3 s
    timeout and a second try, so this worker's ttl is 12 s (a window of up to 8 s)."""
    tp, env = faulty
    env = {**env, "PERAGO_LEASE_TTL": "12"}
    name = one_step(conductor, f"pt_wf_lostc_{unique}", f"pt_write_{unique}", {"files": {"a": "1"}})
    wid = start(conductor, name, repo)
    with worker({**env, "PERAGO_FAILPOINTS": "after_publish=pause:1"}, tmp_path / "w.log") as w:
        w.wait_for("failpoint_hit", failpoint="after_publish")
        tp.add_toxic("conductor", LOST_ANSWERS)  # the COMPLETED reaches Conductor, no answer
        w.wait_for("report_send_failed", timeout=60)
        tp.remove_toxic("conductor", "lost")
        wf = wait_workflow(conductor, wid, timeout=120)
        w.wait_for("attempt_reported", status="COMPLETED")
    assert wf["status"] == "COMPLETED"
    assert [t["status"] for t in attempts(wf, "step")] == ["COMPLETED"]
    assert [c.id for c in publications(store, repo)] == [wf["output"]["workspace"]["ref"]]


def test_a_lost_merge_answer_is_found_in_history_and_published_once(
    faulty: tuple[Toxiproxy, dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    tp, env = faulty
    name = one_step(conductor, f"pt_wf_lostm_{unique}", f"pt_write_{unique}", {"files": {"m": "1"}})
    wid = start(conductor, name, repo)
    failpoint = {"PERAGO_FAILPOINTS": "after_publish_fence=pause:1"}
    # Leases in the worker's memory: the lakeFS link then carries the merge and nothing of
    # the lease (its guarded check would otherwise be the request the toxic catches).
    local = {"PERAGO_COORD_BACKEND": "memory"}
    with worker({**env, **failpoint, **local}, tmp_path / "w.log") as w:
        w.wait_for("failpoint_hit", failpoint="after_publish_fence")
        tp.add_toxic("lakefs", LOST_ANSWERS)  # the merge lands; its answer never comes back
        time.sleep(6)  # the merge's client gives up; the did-it-land lookup waits on the link
        tp.remove_toxic("lakefs", "lost")
        landed = w.wait_for("merge_answer_lost_but_landed", timeout=90)
        wf = wait_workflow(conductor, wid, timeout=120)
    assert wf["status"] == "COMPLETED"
    assert [t["status"] for t in attempts(wf, "step")] == ["COMPLETED"]
    [published] = publications(store, repo)
    assert published.id == landed["ref"] == wf["output"]["workspace"]["ref"]


def test_attempt_fence_2_refuses_when_the_task_timed_out_while_staging(
    faulty: tuple[Toxiproxy, dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """The link to Conductor is cut while the attempt stages: its extensions fail, Conductor
    times the task out; when the link is back, attempt fence #2 refuses and the retry
    publishes instead."""
    tp, env = faulty
    name = one_step(conductor, f"pt_wf_f2_{unique}", f"pt_write_{unique}", {"stamp_retry": True})
    wid = start(conductor, name, repo)
    release = tmp_path / "release"  # the pause ends once the task timed out
    paused = {
        "PERAGO_FAILPOINTS": "after_stage=pause:10",
        "PERAGO_FAILPOINTS_RELEASE": str(release),
    }
    with worker({**env, **paused}, tmp_path / "w.log") as w:
        w.wait_for("failpoint_hit", failpoint="after_stage")
        tp.add_toxic("conductor", CUT)  # the extensions stop getting through
        while attempts(conductor.get_workflow(wid), "step")[0]["status"] == "IN_PROGRESS":
            decide_now(conductor, wid)  # the sweeper notices the response timeout
            time.sleep(1)
        tp.remove_toxic("conductor", "cut")
        release.write_text("go")
        wf = wait_workflow(conductor, wid, timeout=120, nudge=True)
        refused = [
            e for e in _events(w, "attempt_failed") if "attempt fence" in str(e.get("error"))
        ]
    assert refused and refused[0]["retry_count"] == 0
    assert wf["status"] == "COMPLETED"
    assert [t["status"] for t in attempts(wf, "step")] == ["TIMED_OUT", "COMPLETED"]
    [published] = publications(store, repo)
    assert published.metadata["perago.retry_count"] == "1"


def test_materialize_rides_out_a_link_that_resets_then_recovers(
    proxy: tuple[Toxiproxy, dict[str, str]],
    stack_env: dict[str, str],
    store: LakeFSStore,
    repo: str,
    tmp_path: Path,
) -> None:
    # Once the listing is read, every connection to lakeFS is reset for a second: each
    # download (libcurl's batch, perago.adapters.curl) starts again from byte 0 until it heals.
    tp, through = proxy
    tp.clear()
    files = {f"d/f{i}.bin": bytes([i]) * (1000 + i) for i in range(40)}
    for path, data in files.items():
        store.upload_bytes(repo, "main", path, data)
    store.commit(repo, "main", message="input", metadata={})
    retried = metrics.TRANSFER_RETRIES._value.get()
    healed = threading.Timer(1.0, tp.remove_toxic, args=("lakefs", "reset"))

    class ResetAfterListing(LakeFSStore):
        def list_objects(self, *args: Any, **kwargs: Any) -> Iterator[ObjectInfo]:
            yield from super().list_objects(*args, **kwargs)
            reset = {"timeout": 0}
            tp.add_toxic(
                "lakefs",
                {
                    "name": "reset",
                    "type": "reset_peer",
                    "stream": "downstream",
                    "attributes": reset,
                },
            )
            healed.start()

    # Bytes through lakeFS (the proxied link) on either profile, not pre-signed from S3.
    faulty = ResetAfterListing(load({**stack_env, **through, "PERAGO_PRESIGN": "off"}))
    try:
        materialize(faulty, repo, "main", "d/", tmp_path / "out", parallelism=8)
    finally:
        healed.join()
        tp.clear()
        faulty.close()
    out = tmp_path / "out"
    assert {f"d/{p.name}": p.read_bytes() for p in out.iterdir()} == files
    assert metrics.TRANSFER_RETRIES._value.get() > retried  # some were tried again


def test_slow_links_to_both_servers_still_publish_each_step_once(
    faulty: tuple[Toxiproxy, dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    tp, env = faulty
    for server in ("lakefs", "conductor"):
        for stream in ("upstream", "downstream"):
            tp.add_toxic(
                server,
                {
                    "name": f"slow_{stream}",
                    "type": "latency",
                    "stream": stream,
                    "attributes": {"latency": 60, "jitter": 40},
                },
            )
    tp.add_toxic(
        "lakefs",
        {"name": "narrow", "type": "bandwidth", "stream": "downstream", "attributes": {"rate": 64}},
    )
    name = f"pt_wf_slow_{unique}"
    task = f"pt_write_{unique}"
    put_workflow(
        conductor,
        name,
        [
            simple_task(task, "one", "${workflow.input.workspace}", {"files": {"x": "1" * 50_000}}),
            simple_task(task, "two", "${one.output.workspace}", {"files": {"y": "2"}}),
        ],
    )
    wid = start(conductor, name, repo)
    with worker(env, tmp_path / "w.log"):
        wf = wait_workflow(conductor, wid, timeout=180)
    assert wf["status"] == "COMPLETED"
    assert [t["status"] for t in wf["tasks"]] == ["COMPLETED", "COMPLETED"]
    assert len(publications(store, repo)) == 2
