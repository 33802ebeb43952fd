"""The worker's HTTP endpoints: /healthz (liveness), /readyz (readiness), /metrics."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

__all__ = ["HealthServer"]

log = structlog.get_logger("perago.worker.health")


def _answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(200 <= resp.status < 300)
    except OSError:
        return False


class HealthServer:
    """Serves probes on ``port``; ``alive``/``draining`` come from the worker."""

    def __init__(
        self,
        port: int,
        *,
        alive: Callable[[], bool],
        draining: Callable[[], bool],
        dependencies: dict[str, str],
        problem: Callable[[], str | None] = lambda: None,
        host: str = "0.0.0.0",
    ) -> None:
        self._alive, self._draining, self._deps = alive, draining, dependencies
        self._problem = problem
        self._cache: tuple[float, dict[str, bool]] = (0.0, {})
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    ok = outer._alive()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"poll loop stalled\n")
                elif self.path == "/readyz":
                    ok, why = outer.ready()
                    self._send(200 if ok else 503, (why + "\n").encode())
                elif self.path == "/metrics":
                    # OpenMetrics when the scraper asks for it: it carries the exemplars
                    # (trace ids of slow publications, docs/operations.md)
                    encode, ctype = choose_encoder(self.headers.get("Accept", ""))
                    self._send(200, encode(REGISTRY), ctype)
                else:
                    self._send(404, b"not found: try /healthz, /readyz or /metrics\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass  # probes every few seconds would drown the log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="perago-http"
        )

    def ready(self) -> tuple[bool, str]:
        """Readiness reflects this pod, not its servers (Kubernetes' guidance): a pod that
        cannot reach lakeFS or Conductor stays ready and says so in the body. Failing it
        would gate every rollout (maxUnavailable: 0) on both servers being up, and no pod
        could do better than the old one did; workers pull work, so a ready pod routes none."""
        if self._draining():
            return False, "draining"
        problem = self._problem()
        if problem:  # this pod cannot run its tasks (e.g. no Spark session can be built)
            return False, f"not ready: {problem}"
        with self._lock:
            checked_at, results = self._cache
            if time.monotonic() - checked_at > 2.0:
                results = {name: _answers(url) for name, url in self._deps.items()}
                self._cache = (time.monotonic(), results)
        down = [name for name, ok in results.items() if not ok]
        return (True, f"ready; unreachable: {', '.join(down)}") if down else (True, "ready")

    def start(self) -> None:
        self._thread.start()
        log.info("http_endpoints_started", port=self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
