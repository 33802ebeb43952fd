"""Readiness reflects the pod, not lakeFS or Conductor (docs/operations.md, "Probes")."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

from perago.worker.health import HealthServer


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Up(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_ready_while_a_dependency_is_down_and_not_while_draining() -> None:
    up = ThreadingHTTPServer(("127.0.0.1", 0), _Up)
    Thread(target=up.serve_forever, daemon=True).start()
    draining = [False]
    server = HealthServer(
        0,
        alive=lambda: True,
        draining=lambda: draining[0],
        dependencies={
            "conductor": f"http://127.0.0.1:{up.server_address[1]}/health",
            "lakefs": f"http://127.0.0.1:{_closed_port()}/api/v1/healthcheck",
        },
        host="127.0.0.1",
    )
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert _get(base + "/readyz") == (200, "ready; unreachable: lakefs\n")
        draining[0] = True
        assert _get(base + "/readyz") == (503, "draining\n")
    finally:
        server.stop()
        up.shutdown()
        up.server_close()
