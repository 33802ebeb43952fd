"""perago.adapters.objects' large downloads against a real HTTP server on 127.0.0.1 (the
standard library's), for what neither lakeFS nor versitygw can be made to do on demand: cut
a body off midway, answer 503 once, and then serve the same bytes."""

from __future__ import annotations

import http.server
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from perago.adapters.curl import CurlPool
from perago.adapters.http import HttpConfig
from perago.adapters.objects import SMALL_BODY, ObjectBytes
from perago.core.store import ObjectInfo
from perago.errors import NotFoundError

BODY = os.urandom(3 * SMALL_BODY + 12345)  # large: streamed on a thread


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    #: path prefix -> what to do on the next requests: a status, or "cut" (half a body)
    script: ClassVar[dict[str, list[int | str]]] = {}
    hits: ClassVar[list[str]] = []
    lock = threading.Lock()

    def do_GET(self) -> None:
        where = "s3" if self.path.startswith("/s3/") else "lakefs"
        with self.lock:
            self.hits.append(f"{where} {self.headers.get('Authorization', '-')}")
            queue = self.script.get(where, [])
            step = queue.pop(0) if queue else 200
        if step == "cut":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY[: len(BODY) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        body = BODY if step == 200 else f"error {step}".encode()
        self.send_response(int(step))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.script, _Handler.hits = {}, []
    srv = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


class _Job:
    def __init__(self, obj: ObjectInfo) -> None:
        self.obj, self.sink, self.closed = obj, io.BytesIO(), None

    def open(self) -> io.BytesIO:
        return self.sink

    def close(self, ok: bool) -> None:
        assert self.closed is None, "closed twice"
        self.closed = ok


def _objects(server: str) -> ObjectBytes:
    http = HttpConfig(f"{server}/api/v1", {"Authorization": "Basic key"}, read_timeout=10)
    return ObjectBytes(CurlPool(http), http, presigned=lambda: True, uploads_in_flight=4)


def _large(server: str, presigned: bool) -> _Job:
    url = f"{server}/s3/bucket/key?X-Amz-Signature=abc" if presigned else ""
    return _Job(ObjectInfo("d/big.bin", len(BODY), "", download_url=url))


def test_a_body_cut_off_midway_and_a_503_are_read_again_from_byte_zero(server: str) -> None:
    _Handler.script = {"s3": ["cut", 503]}
    job = _large(server, presigned=True)
    _objects(server).download_many("repo", "main", [job], parallelism=2)
    assert job.closed is True and job.sink.getvalue() == BODY
    assert _Handler.hits == ["s3 -", "s3 -", "s3 -"]  # never through lakeFS


def test_a_refused_presigned_url_is_read_through_lakefs_with_its_credentials(
    server: str,
) -> None:
    _Handler.script = {"s3": [403]}
    job = _large(server, presigned=True)
    _objects(server).download_many("repo", "main", [job], parallelism=2)
    assert job.closed is True and job.sink.getvalue() == BODY
    assert _Handler.hits == ["s3 -", "lakefs Basic key"]


def test_a_missing_object_fails_at_once_and_closes_its_job(server: str) -> None:
    _Handler.script = {"lakefs": [404]}
    job = _large(server, presigned=False)
    with pytest.raises(NotFoundError, match=r"lakeFS download repo@main/d/big\.bin failed"):
        _objects(server).download_many("repo", "main", [job], parallelism=2)
    assert job.closed is False and _Handler.hits == ["lakefs Basic key"]


@pytest.mark.parametrize("size", [100, len(BODY)], ids=["small", "large"])
def test_a_local_file_that_is_gone_is_read_through_lakefs(
    server: str, tmp_path: Path, size: int
) -> None:
    gone = ObjectInfo("d/x.bin", size, "", download_url=f"file://{tmp_path}/gone.bin")
    job = _Job(gone)
    _Handler.script = {"lakefs": [404]}  # ...where it is missing too
    with pytest.raises(NotFoundError):
        _objects(server).download_many("repo", "main", [job], parallelism=2)
    assert job.closed is False  # once (a second close fails the job's assertion)
    assert _Handler.hits == ["lakefs Basic key"]
    served = _Job(gone)
    _objects(server).download_many("repo", "main", [served], parallelism=2)
    assert served.closed is True and served.sink.getvalue()[:5] == BODY[:5]
