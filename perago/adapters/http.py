"""Keep-alive HTTP/1.1 for object bytes, over the standard library's ``http.client``.

Moving many small objects is one request each, so the client's CPU per request sets the
pace on a small machine. urllib3's pool manager costs about twice ``http.client``'s CPU per
request (URL parsing, pool keys, response wrappers; docs/benchmarks.md), so the transfers
use ``http.client`` connections directly, shared by all threads through one idle list per
server. Metadata calls keep the generated SDK.

A connection is reused only after its response was read to the end, and only if the server
has not closed it meanwhile (an idle keep-alive timeout: checked with a zero-timeout poll
before each reuse, as urllib3 does). If the server closes it in the instant between that
check and the request, an idempotent request (GET, HEAD, PUT, DELETE) is sent once more on a
new connection; a POST is not, since it may have landed (a conditional create would then
answer that its own object exists): the caller decides. Every other failure is an
``OSError`` or an ``http.client.HTTPException`` for the caller to translate.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
from collections.abc import Mapping
from typing import IO, Any
from urllib.parse import urlsplit

__all__ = ["Response", "Transport", "TransportError"]

TransportError = (OSError, http.client.HTTPException)

#: Methods a server may see twice with the same effect as once.
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})

#: Bytes read from a file body per send (http.client's default, 8 KiB, costs a system call
#: pair per 8 KiB).
_BLOCK = 256 * 1024

#: What a reused keep-alive connection raises when the server had closed it meanwhile.
_STALE = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    BrokenPipeError,
    ConnectionAbortedError,
)


class _ReadTimeout:
    """A connection whose connect timeout (its ``timeout``) differs from its read timeout."""

    read_timeout: float
    sock: Any

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.sock.settimeout(self.read_timeout)


class _Connection(_ReadTimeout, http.client.HTTPConnection):
    pass


class _TLSConnection(_ReadTimeout, http.client.HTTPSConnection):
    pass


def _closed_by_server(conn: Any) -> bool:
    """An idle connection with something to read has been closed (or spoken on) by the server."""
    if conn.sock is None:
        return False  # it connects again by itself
    poller = select.poll()
    poller.register(conn.sock, select.POLLIN)
    try:
        return bool(poller.poll(0))
    except OSError:
        return True


class Response:
    """A response: ``status``, ``reason``, ``headers``; ``data`` when preloaded, else
    ``read`` it and ``release_conn`` (the connection is reused only if read to the end)."""

    def __init__(
        self, transport: Transport, key: tuple[str, str, int], conn: Any, raw: Any
    ) -> None:
        self._transport, self._key, self._conn, self._raw = transport, key, conn, raw
        self.status: int = raw.status
        self.reason: str = raw.reason
        self.headers: http.client.HTTPMessage = raw.headers
        self._data: bytes | None = None

    @property
    def data(self) -> bytes:
        if self._data is None:
            self._data = self.read()
            self.release_conn()
        return self._data

    def read(self, amt: int = -1) -> bytes:
        data: bytes = self._raw.read() if amt < 0 else self._raw.read(amt)
        return data

    def release_conn(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._raw.isclosed() and not self._raw.will_close:
            self._transport._put(self._key, conn)
        else:  # unread bytes, or the server closes it: not reusable
            self._raw.close()
            conn.close()


class Transport:
    """Connections to any number of servers, shared by threads; ``maxsize`` idle per server."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, maxsize: int) -> None:
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._maxsize = maxsize
        self._idle: dict[tuple[str, str, int], list[Any]] = {}
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | IO[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        preload_content: bool = True,
        timeout: float | None = None,
    ) -> Response:
        parts = urlsplit(url)
        scheme = parts.scheme or "http"
        port = parts.port or (443 if scheme == "https" else 80)
        key = (scheme, parts.hostname or "", port)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        start = body.tell() if body is not None and hasattr(body, "tell") else None
        for last in (False, True):
            conn, reused = self._get(key, timeout)
            try:
                conn.request(method, target, body=body, headers=dict(headers or {}))
                raw = conn.getresponse()
            except _STALE:
                conn.close()
                if not reused or last or method not in _IDEMPOTENT:
                    raise
                if start is not None:
                    body.seek(start)  # type: ignore[union-attr]
                continue
            except BaseException:
                conn.close()
                raise
            resp = Response(self, key, conn, raw)
            if preload_content:
                try:
                    resp.data  # noqa: B018 - read now, give the connection back
                except BaseException:
                    conn.close()
                    raise
            return resp
        raise AssertionError("unreachable")

    def _get(self, key: tuple[str, str, int], timeout: float | None) -> tuple[Any, bool]:
        read_timeout = timeout or self._read_timeout
        while True:
            with self._lock:
                idle = self._idle.get(key)
                conn = idle.pop() if idle else None
            if conn is None or not _closed_by_server(conn):
                break
            conn.close()
        if conn is not None:
            conn.read_timeout = read_timeout
            if conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            return conn, True
        scheme, host, port = key
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            conn = _TLSConnection(
                host, port, timeout=self._connect_timeout, context=self._tls, blocksize=_BLOCK
            )
        else:
            conn = _Connection(host, port, timeout=self._connect_timeout, blocksize=_BLOCK)
        conn.read_timeout = read_timeout
        return conn, False

    def _put(self, key: tuple[str, str, int], conn: Any) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self._maxsize:
                idle.append(conn)
                return
        conn.close()
