"""Conductor auth and task domains against the real server.

The local Conductor (OSS) has no auth, so the tests put a real HTTP gateway of their own in
front of it that behaves as Orkes does: ``POST /api/token`` trades an application's key and
secret for a token, every other call needs it in ``X-Authorization``, and a token expires
after a few uses (answered ``401 {"error": "EXPIRED_TOKEN"}``), so renewal happens within one
short workflow.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from perago import config
from perago.adapters.conductor import ConductorClient
from perago.errors import OrchestratorError

from .harness import one_step, publications, start, wait_workflow, worker

KEY, SECRET = "perago-app", "s3cr3t-not-for-logs"


class AuthGateway:
    """Forwards to Conductor only requests that carry a live token; counts what it saw."""

    def __init__(self, upstream: str, *, uses_per_token: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.uses_per_token = uses_per_token
        self.uses: dict[str, int] = {}
        self.rejected: list[tuple[str, str]] = []  # (path, error code)
        self.forwarded = 0
        self.lock = threading.Lock()
        self.http = httpx.Client(timeout=60)
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                gateway.handle(self)

            do_POST = do_PUT = do_DELETE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _answer(self, h: BaseHTTPRequestHandler, status: int, body: bytes, kind: str) -> None:
        h.send_response(status)
        h.send_header("Content-Type", kind)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _refuse(self, h: BaseHTTPRequestHandler, code: str) -> None:
        with self.lock:
            self.rejected.append((h.path, code))
        body = json.dumps({"error": code, "message": code.lower()}).encode()
        self._answer(h, 401, body, "application/json")

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        if h.path.split("?")[0] == "/api/token" and h.command == "POST":
            creds = json.loads(body or b"{}")
            if creds.get("keyId") != KEY or creds.get("keySecret") != SECRET:
                self._refuse(h, "INVALID_CREDENTIALS")
                return
            with self.lock:
                token = f"tok-{len(self.uses) + 1}"
                self.uses[token] = 0
            self._answer(h, 200, json.dumps({"token": token}).encode(), "application/json")
            return
        token = h.headers.get("X-Authorization")
        with self.lock:
            known, used = token in self.uses, self.uses.get(token or "", 0)
            if known and used < self.uses_per_token:
                self.uses[token or ""] = used + 1
        if not known:
            self._refuse(h, "INVALID_TOKEN")
            return
        if used >= self.uses_per_token:
            self._refuse(h, "EXPIRED_TOKEN")
            return
        resp = self.http.request(
            h.command,
            self.upstream + h.path.removeprefix("/api"),
            content=body,
            headers={k: v for k, v in h.headers.items() if k.lower() in ("content-type", "accept")},
        )
        with self.lock:
            self.forwarded += 1
        self._answer(
            h, resp.status_code, resp.content, resp.headers.get("content-type", "text/plain")
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.http.close()


@pytest.fixture
def gateway(stack_env: dict[str, str]) -> Iterator[AuthGateway]:
    g = AuthGateway(stack_env["CONDUCTOR_SERVER_URL"], uses_per_token=5)
    yield g
    g.close()


def _client(env: dict[str, str], **extra: str) -> ConductorClient:
    return ConductorClient(config.load(env={**env, **extra}))


def test_a_worker_behind_an_auth_gateway_runs_a_workflow_and_renews_its_token(
    make_env: Callable[..., dict[str, str]],
    gateway: AuthGateway,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = make_env()
    behind = {
        **env,
        "CONDUCTOR_SERVER_URL": gateway.url,
        "CONDUCTOR_AUTH_KEY": KEY,
        "CONDUCTOR_AUTH_SECRET": SECRET,
    }
    conductor = _client(behind)
    wf_name = one_step(conductor, f"auth_{unique}", f"pt_write_{unique}", {"files": {"a.txt": "1"}})
    with worker(behind, tmp_path / "w.log") as w:
        wid = start(conductor, wf_name, repo)
        wf = wait_workflow(conductor, wid, timeout=120)
        assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
        w.stop()
    assert len(publications(store, repo)) == 1
    # Tokens ran out during the run and were renewed, with no call lost to it.
    expired = [path for path, code in gateway.rejected if code == "EXPIRED_TOKEN"]
    assert expired, "no token expired: raise the traffic or lower uses_per_token"
    assert len(gateway.uses) >= 2
    assert not [c for _, c in gateway.rejected if c != "EXPIRED_TOKEN"]
    assert SECRET not in (tmp_path / "w.log").read_text()


def test_bad_or_missing_credentials_fail_with_what_to_set(
    stack_env: dict[str, str], gateway: AuthGateway
) -> None:
    wrong = _client(
        {**stack_env, "CONDUCTOR_SERVER_URL": gateway.url},
        CONDUCTOR_AUTH_KEY=KEY,
        CONDUCTOR_AUTH_SECRET="wrong",
    )
    with pytest.raises(
        OrchestratorError, match="check CONDUCTOR_AUTH_KEY and CONDUCTOR_AUTH_SECRET"
    ):
        wrong.get_workflow("no-such-workflow")
    anonymous = _client({**stack_env, "CONDUCTOR_SERVER_URL": gateway.url})
    with pytest.raises(OrchestratorError, match="set CONDUCTOR_AUTH_KEY and CONDUCTOR_AUTH_SECRET"):
        anonymous.get_workflow("no-such-workflow")
    assert gateway.forwarded == 0


def _samples(endpoint: str, outcome: str) -> float:
    labels = {"endpoint": endpoint, "outcome": outcome}
    return REGISTRY.get_sample_value("perago_conductor_request_seconds_count", labels) or 0.0


def _register(conductor: ConductorClient, task_name: str) -> None:
    """A task definition with no retries and a 30 s response timeout."""
    conductor.register_task_defs(
        [
            {
                "name": task_name,
                "retryCount": 0,
                "timeoutSeconds": 60,
                "responseTimeoutSeconds": 30,
                "ownerEmail": "perago@example.com",
            }
        ]
    )


def test_task_domains_route_steps_and_calls_are_timed_per_endpoint(
    conductor: ConductorClient, repo: str, unique: str, stack_env: dict[str, str]
) -> None:
    task_name = f"dom_{unique}"
    _register(conductor, task_name)
    wf_name = one_step(conductor, f"dom_wf_{unique}", task_name, {})
    polls_before = _samples("poll", "ok")
    wid = conductor.start_workflow(
        wf_name,
        {"workspace": {"repository": repo, "branch": "main"}},
        task_to_domain={task_name: "blue"},
    )
    conductor.decide(wid)
    # The default domain's queue never sees it; the "blue" one does.
    assert conductor.poll(task_name, worker_id="w-default", count=1) == []
    got = conductor.poll(task_name, worker_id="w-blue", count=1, domain="blue")
    assert [t.workflow_id for t in got] == [wid]
    assert _samples("poll", "ok") > polls_before
    conductor.terminate_workflow(wid, "test done")


def test_a_delivery_given_back_is_delivered_again_at_once(
    conductor: ConductorClient, repo: str, unique: str
) -> None:
    """What the poll loop relies on when a long-poll answers after the drain began
    (`ConductorClient.give_back`): Conductor 3.32 puts the task back in its queue, and the
    next poll delivers the same task id with its poll count raised; nothing else moved."""
    task_name = f"giveback_{unique}"
    _register(conductor, task_name)
    wid = conductor.start_workflow(
        one_step(conductor, f"giveback_wf_{unique}", task_name, {}),
        {"workspace": {"repository": repo, "branch": "main"}},
    )
    conductor.decide(wid)
    (first,) = conductor.poll(task_name, worker_id="w-draining", count=1, wait_ms=1000)
    conductor.give_back(first, worker_id="w-draining")
    (again,) = conductor.poll(task_name, worker_id="w-other", count=1, wait_ms=1000)
    assert again.task_id == first.task_id and again.retry_count == first.retry_count
    assert again.poll_count == first.poll_count + 1
    assert conductor.get_task(first.task_id).status == "IN_PROGRESS"  # type: ignore[union-attr]
    conductor.terminate_workflow(wid, "test done")
