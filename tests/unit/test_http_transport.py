"""perago.adapters.http against a real HTTP/1.1 server on 127.0.0.1 (the standard library's)."""

from __future__ import annotations

import io
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from perago.adapters.http import Transport, TransportError
from tests.tls import self_signed


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    #: close each connection after its response without saying so (an idle keep-alive
    #: timeout on the server's side, as the client sees it)
    drop_after_response = False
    #: read the next request, then close the connection without an answer (the server's
    #: idle timeout striking between the client's check and its request)
    vanish_once = False
    delay = 0.0

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up: a test's
            super().handle_error(request, client_address)  # point, not the server's error

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.requests = 0
        self.bodies: list[bytes] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def log_message(self, *args: object) -> None:
        pass

    def _vanish(self) -> bool:
        self.server.requests += 1
        if not self.server.vanish_once:
            return False
        self.server.vanish_once = False
        self.close_connection = True
        return True

    def _answer(self, body: bytes) -> None:
        time.sleep(self.server.delay)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if self.server.drop_after_response:
            self.close_connection = True

    def do_GET(self) -> None:
        if self._vanish():
            return
        size = int(self.path.rsplit("/", 1)[1])
        self._answer(b"x" * size)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.append(body)
        if self._vanish():
            return
        self._answer(b'{"ok": true}')


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


def _url(server: _Server, tail: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{tail}"


def _transport(read_timeout: float = 5.0) -> Transport:
    return Transport(connect_timeout=2, read_timeout=read_timeout, maxsize=4)


def test_requests_read_to_the_end_share_one_connection(server: _Server) -> None:
    http = _transport()
    assert http.request("GET", _url(server, "/a/10")).data == b"x" * 10
    stream = http.request("GET", _url(server, "/a/3"), preload_content=False)
    assert stream.read(2) + stream.read(5) == b"xxx"
    stream.release_conn()
    assert http.request("POST", _url(server, "/p"), body=b"abc").data == b'{"ok": true}'
    assert server.connections == 1
    http.close()


def test_a_response_not_read_to_the_end_does_not_give_its_connection_back(
    server: _Server,
) -> None:
    http = _transport()
    stream = http.request("GET", _url(server, "/a/100000"), preload_content=False)
    assert stream.read(10) == b"x" * 10
    stream.release_conn()
    # the unread bytes would be taken for the next response's status line
    assert http.request("GET", _url(server, "/a/5")).data == b"xxxxx"
    assert server.connections == 2


def test_a_connection_the_server_closed_while_idle_is_not_reused(
    server: _Server,
) -> None:
    http = _transport()
    server.drop_after_response = True
    assert http.request("GET", _url(server, "/a/1")).data == b"x"
    time.sleep(0.1)  # the server has closed it by now; the client still holds it as idle
    body = io.BytesIO(b"0123456789")
    body.seek(2)
    answer = http.request("POST", _url(server, "/p"), body=body, headers={"Content-Length": "8"})
    assert answer.status == 200
    assert server.bodies == [b"23456789"]  # from where the caller's stream stood, once
    assert server.connections == 2


def _kept_alive_then_vanishing(server: _Server) -> Transport:
    """A transport holding an idle connection the server will drop at its next request."""
    http = _transport()
    assert http.request("GET", _url(server, "/a/1")).data == b"x"
    server.vanish_once = True
    return http


def test_a_get_whose_reused_connection_vanishes_unanswered_is_sent_again(
    server: _Server,
) -> None:
    http = _kept_alive_then_vanishing(server)
    assert http.request("GET", _url(server, "/a/3")).data == b"xxx"
    assert server.requests == 3 and server.connections == 2


def test_a_post_whose_reused_connection_vanishes_unanswered_is_not_sent_again(
    server: _Server,
) -> None:
    # It may have landed: a conditional create sent again would find its own object.
    http = _kept_alive_then_vanishing(server)
    with pytest.raises(TransportError):
        http.request("POST", _url(server, "/p"), body=b"once")
    assert server.bodies == [b"once"]
    assert http.request("POST", _url(server, "/p"), body=b"again").status == 200


def test_no_server_is_a_transport_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransportError):
        _transport().request("GET", f"http://127.0.0.1:{port}/a/1")


def test_a_server_slower_than_the_read_timeout_is_a_transport_error(server: _Server) -> None:
    server.delay = 1.0
    http = _transport(read_timeout=5.0)
    with pytest.raises(TransportError):  # the answer comes in 1 s: within 5, not within 0.2
        http.request("GET", _url(server, "/a/1"), timeout=0.2)
    assert http.request("GET", _url(server, "/a/2")).data == b"xx"  # its own timeout again


def test_https_verifies_the_server_against_the_trusted_certificates(
    server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    url = _url(server, "/a/4").replace("http://", "https://")
    with pytest.raises(TransportError):  # not trusted: refused, nothing sent
        _transport().request("GET", url)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # how a private CA is trusted
    http = _transport()
    assert http.request("GET", url).data == b"xxxx"
    assert http.request("GET", url).data == b"xxxx"
    assert (
        server.connections == 1
    )  # one kept-alive connection (the refused one never got a handler)
