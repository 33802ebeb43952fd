"""The libcurl batch engine against a real HTTP server on 127.0.0.1 (the standard library's):
what lakeFS cannot be made to do on demand (answer 503 twice, hang, vanish)."""

from __future__ import annotations

import ctypes
import hashlib
import http.server
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from perago.adapters.curl import CurlPool, Transfer
from perago.errors import StoreError, TransientStoreError
from tests.tls import self_signed


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    #: path -> statuses to answer before the 200 (consumed as requests arrive)
    script: ClassVar[dict[str, list[int]]] = {}
    delay: ClassVar[float] = 0.0
    #: when set, every GET waits for it before answering (a server that hangs until told)
    hold: ClassVar[threading.Event | None] = None
    hits: ClassVar[list[str]] = []
    ports: ClassVar[list[int]] = []
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            self.hits.append(self.path)
            self.ports.append(self.client_address[1])
            queue = self.script.get(self.path, [])
            status = queue.pop(0) if queue else 200
        time.sleep(self.delay)
        if self.hold is not None:
            self.hold.wait(30)
        body = (f"error {status}" if status != 200 else f"bytes of {self.path}" * 50).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.hits.append(f"POST {self.path} {len(data)} {self.headers.get('Expect')}")
        body = data[::-1]  # the bytes, reversed
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.hits.append(f"PUT {self.path} {len(data)}")
            self.ports.append(self.client_address[1])
            queue = self.script.get(self.path, [])
            status = queue.pop(0) if queue else 200
        self.send_response(status)
        self.send_header("ETag", f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a refused handshake or a client gone mid-answer is what some tests do


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.script, _Handler.delay, _Handler.hits, _Handler.ports = {}, 0.0, [], []
    _Handler.hold = None
    srv = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    if _Handler.hold is not None:
        _Handler.hold.set()
    srv.shutdown()


def get_all(transfers: Sequence[Transfer], *, concurrency: int, retry_for: float = 60) -> None:
    """One batch on handles of its own."""
    pool = CurlPool()
    try:
        pool.run(transfers, concurrency=concurrency, retry_for=retry_for)
    finally:
        pool.close()


class _Get(Transfer):
    def __init__(self, url: str) -> None:
        self.url = url
        self.data = bytearray()
        self.begins = 0
        self.closed: bool | None = None

    def begin(self) -> Callable[[bytes], object]:
        self.begins += 1
        self.data = bytearray()
        return self.data.extend

    def ended(self, status: int, body: bytes, headers: Mapping[str, str]) -> bool:
        if status != 200:
            raise LookupError(f"{status}: {body.decode()}")
        return True

    def failed(self, why: str) -> Exception:
        return ConnectionError(why)

    def close(self, ok: bool) -> None:
        assert self.closed is None, "closed twice"
        self.closed = ok


def test_every_transfer_gets_its_own_bytes(server: str) -> None:
    gets = [_Get(f"{server}/o{i}") for i in range(60)]
    get_all(gets, concurrency=4)
    assert all(bytes(g.data) == f"bytes of /o{i}".encode() * 50 for i, g in enumerate(gets))
    assert all(g.closed is True for g in gets)


def test_a_transient_answer_is_tried_again_from_byte_zero(server: str) -> None:
    from perago.telemetry import metrics

    retried = metrics.TRANSFER_RETRIES._value.get()
    _Handler.script = {"/flaky": [503, 502]}
    gets = [_Get(f"{server}/flaky"), _Get(f"{server}/fine")]
    get_all(gets, concurrency=2)
    assert bytes(gets[0].data) == b"bytes of /flaky" * 50  # no error body left in front
    assert gets[0].begins == 3 and _Handler.hits.count("/flaky") == 3
    assert metrics.TRANSFER_RETRIES._value.get() == retried + 2, "each retry is counted"


def test_a_lasting_failure_ends_the_batch_and_closes_every_open_transfer(server: str) -> None:
    _Handler.script = {"/missing": [404]}
    _Handler.delay = 0.05
    gets = [_Get(f"{server}/o{i}") for i in range(3)] + [_Get(f"{server}/missing")]
    gets += [_Get(f"{server}/later{i}") for i in range(20)]
    with pytest.raises(LookupError, match="404: error 404"):
        get_all(gets, concurrency=4)
    assert gets[3].closed is False
    started = [g for g in gets if g.begins]
    assert all(g.closed is not None for g in started)  # none left open
    assert len(started) < len(gets)  # the rest never started


def test_no_server_is_transient_until_the_retry_time_runs_out() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    get = _Get(f"http://127.0.0.1:{port}/x")
    with pytest.raises(ConnectionError, match="onnect"):
        get_all([get], concurrency=1, retry_for=0.5)
    assert get.begins >= 2 and get.closed is False


def test_a_transfer_raising_transient_error_is_retried(server: str) -> None:
    class Once(_Get):
        def ended(self, status: int, body: bytes, headers: Mapping[str, str]) -> bool:
            if self.begins == 1:
                raise TransientStoreError("checksum mismatch, try again")
            return super().ended(status, body, headers)

    get = Once(f"{server}/o")
    get_all([get], concurrency=1)
    assert get.begins == 2 and get.closed is True


def test_the_drains_exception_stops_the_batch_at_once(server: str) -> None:
    # The worker's drain interrupts a thread with an asynchronous exception; the loop wakes
    # every quarter second, so it is delivered while the server still holds every answer.
    _Handler.hold = threading.Event()
    gets = [_Get(f"{server}/slow{i}") for i in range(10)]
    caught: list[BaseException] = []

    class Drain(Exception):
        pass

    def run() -> None:
        try:
            get_all(gets, concurrency=2)
        except BaseException as e:  # noqa: BLE001 - inspected below
            caught.append(e)

    t = threading.Thread(target=run)
    t.start()
    while not any(g.begins for g in gets):
        time.sleep(0.01)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(Drain))
    t.join(timeout=20)  # the server answers nothing until the test ends
    assert not t.is_alive()
    assert [type(e) for e in caught] == [Drain]
    started = [g for g in gets if g.begins]
    assert 1 <= len(started) <= 2 and all(g.closed is False for g in started)
    assert all(g.closed is None for g in gets if not g.begins)


def test_a_pool_keeps_its_connections_alive_between_batches(server: str) -> None:
    pool = CurlPool()
    try:
        for n in range(3):
            get = _Get(f"{server}/batch{n}")
            pool.run([get], concurrency=4)
            assert get.closed is True
    finally:
        pool.close()
    assert len(_Handler.ports) == 3 and len(set(_Handler.ports)) == 1  # one connection


def test_a_post_sends_its_body_and_the_handle_then_gets_again(server: str) -> None:
    class Post(_Get):
        def ended(self, status: int, body: bytes, headers: Mapping[str, str]) -> bool:
            assert status == 201
            return True

    payload = bytes(range(256)) * 8000  # 2 MB: no "Expect: 100-continue" wait when told so
    post = Post(f"{server}/up")
    post.body, post.headers = payload, ("Expect:",)
    get = _Get(f"{server}/down")
    pool = CurlPool()
    try:
        pool.run([post], concurrency=1)
        pool.run([get], concurrency=1)  # the same handle, a GET again
    finally:
        pool.close()
    assert bytes(post.data) == payload[::-1]
    assert _Handler.hits == [f"POST /up {len(payload)} None", "/down"]
    assert bytes(get.data) == b"bytes of /down" * 50


def test_https_is_verified_against_the_trusted_certificates(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{srv.server_address[1]}/secret"
        untrusted = _Get(url)
        with pytest.raises(ConnectionError, match="SSL_CERT_FILE"):  # no retry mends it
            get_all([untrusted], concurrency=1)
        assert untrusted.begins == 1 and _Handler.hits == []
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # how a private CA is trusted
        trusted = _Get(url)
        get_all([trusted], concurrency=1)
        assert bytes(trusted.data) == b"bytes of /secret" * 50
    finally:
        srv.shutdown()


def test_every_lakefs_client_trusts_the_same_certificates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42 (one HTTP configuration): lakefs-sdk's pool, libcurl and the stream pool
    all trust what SSL_CERT_FILE names, from one HttpConfig (a regression guard: the SDK
    passed this before too, through its own default context). The server is a real HTTPS
    server on 127.0.0.1 (its answers are not lakeFS's; only the TLS handshake is tested)."""
    from perago.adapters.http import HttpConfig
    from perago.adapters.lakefs import LakeFSStore
    from perago.config import load
    from perago.errors import StoreError

    cert, key = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"https://127.0.0.1:{srv.server_address[1]}"
    env = {
        "LAKECTL_SERVER_ENDPOINT_URL": base,
        "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": "key",
        "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": "secret",
        "PERAGO_HTTP_TIMEOUT": "5",
    }
    try:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        untrusted = LakeFSStore(load(env=env))
        with pytest.raises(StoreError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusted._call("get repository", untrusted.repos.get_repository, "r")
        untrusted.close()

        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        store = LakeFSStore(load(env=env))
        with pytest.raises(Exception) as answered:  # the answer is not lakeFS's JSON
            store._call("get repository", store.repos.get_repository, "r")
        assert "CERTIFICATE" not in str(answered.value), "the SDK trusted the CA"
        assert "/api/v1/repositories/r" in _Handler.hits
        store.close()
        streams = HttpConfig().stream_pool(maxsize=1)
        assert streams.request("GET", f"{base}/streamed").status == 200
        get = _Get(f"{base}/curl")
        CurlPool(HttpConfig()).run([get], concurrency=1)
        assert bytes(get.data) == b"bytes of /curl" * 50
    finally:
        srv.shutdown()


class _Steps(_Get):
    """PUT a file, then POST what its ETag said, then GET: three requests, one transfer."""

    def __init__(self, base: str, source: Path) -> None:
        super().__init__(f"{base}/put")
        self.base, self.method, self.wants_headers = base, "PUT", True
        self.file = source.open("rb")
        self.body, self.body_size = self.file, source.stat().st_size
        self.etags: list[str] = []
        self.agains = 0

    def ended(self, status: int, body: bytes, headers: Mapping[str, str]) -> bool:
        if self.method == "PUT":
            self.etags.append(headers["etag"].strip('"'))
            self.method, self.url, self.body = "POST", f"{self.base}/post", b"linked"
            return False
        if self.method == "POST":
            assert status == 201 and bytes(self.data) == b"deknil"
            self.method, self.url, self.body = "GET", f"{self.base}/done", None
            return False
        return super().ended(status, body, headers)

    def again(self) -> None:
        self.agains += 1

    def close(self, ok: bool) -> None:
        self.file.close()
        super().close(ok)


def test_one_transfer_streams_a_file_put_then_posts_then_gets(server: str, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    payload = bytes(range(256)) * 12_000  # 3 MB: several 512 KiB blocks from the file
    source.write_bytes(payload)
    _Handler.script = {"/put": [503]}  # the first PUT: transient, sent again from byte 0
    steps = _Steps(server, source)
    get_all([steps], concurrency=1)
    assert _Handler.hits == [
        f"PUT /put {len(payload)}",
        f"PUT /put {len(payload)}",
        "POST /post 6 None",
        "/done",
    ]
    assert steps.etags == [hashlib.md5(payload, usedforsecurity=False).hexdigest()]
    assert steps.agains == 1 and steps.closed is True
    assert bytes(steps.data) == b"bytes of /done" * 50


def test_a_request_that_must_not_land_twice_is_sent_once_on_a_fresh_connection(
    server: str,
) -> None:
    pool = CurlPool()
    try:
        reply = pool.request("PUT", f"{server}/warm", "warm up", headers={}, body=b"x")
        assert reply.status == 200 and reply.headers["etag"]
        _Handler.script = {"/once": [503]}
        with pytest.raises(StoreError, match="whether it landed is unknown"):
            pool.request("PUT", f"{server}/once", "a create", headers={}, body=b"y",
                         idempotent=False)  # fmt: skip
        again = pool.request("PUT", f"{server}/again", "a retry", headers={}, body=b"z")
        assert again.status == 200
    finally:
        pool.close()
    assert _Handler.hits == ["PUT /warm 1", "PUT /once 1", "PUT /again 1"]
    warm, once, _ = _Handler.ports
    assert once != warm  # not the kept-alive connection: libcurl would resend on it


def test_single_requests_from_many_threads_keep_their_connections(server: str) -> None:
    # Listings and the coordination store's reads: one request each, from many attempts of
    # a worker at once. Each concurrent caller takes a kept handle or makes one; none of the
    # eight is closed after its request, so five rounds need no new connection.
    pool = CurlPool()
    rounds, callers = 5, 8
    barrier = threading.Barrier(callers)

    def caller(i: int) -> None:
        for r in range(rounds):
            barrier.wait()
            reply = pool.request("GET", f"{server}/c{i}r{r}", "a read", headers={})
            assert reply.status == 200 and reply.data == f"bytes of /c{i}r{r}".encode() * 50

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        pool.close()
    assert len(_Handler.hits) == rounds * callers
    assert len(set(_Handler.ports)) <= callers  # one connection per concurrent caller
