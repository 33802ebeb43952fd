"""Every object byte and lakeFS listing this process moves over HTTP, on libcurl's multi
interface, driven from the calling thread.

Materializing thousands of small objects is one request each; with a Python thread per
transfer, ``http.client`` and the GIL cost about 0.35 ms of client CPU per object on a
2-core machine, more than lakeFS spends answering. libcurl parses and moves the bytes in C
and keeps its connections alive, so only a short callback per object runs in Python (about
0.07 ms: 5,000 x 1 KiB in 0.6 s instead of 1.9 s). Large bodies stream through the same
callbacks in 512 KiB blocks.

The engine knows HTTP, not lakeFS: each :class:`Transfer` says what to send, where its
answer goes, and what a finished response means, and may go on to another request (a
fallback, or the next step of a pre-signed upload). A transfer that fails transiently (no
answer, connection reset, HTTP 429/502/503/504) starts again after a wait set by the
adapters' one retry policy (:mod:`perago.core.retry_policy`); one that may have landed
and must not land twice (``idempotent = False``) is never sent again and gets a fresh
connection (libcurl resends a request whose reused connection died unanswered). The loop
wakes every quarter second, so the drain's exception reaches it promptly; whatever ends the
loop closes every transfer still open.
"""

from __future__ import annotations

import heapq
import io
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import BinaryIO
from urllib.parse import urlsplit

import pycurl

from perago.adapters.http import HttpConfig
from perago.core.retry_policy import RETRY_FOR_S, Backoff
from perago.errors import StoreError, TransientStoreError
from perago.telemetry import metrics

__all__ = ["CurlPool", "Reply", "Transfer"]

_TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
#: libcurl errors no retry mends: bad URL or scheme, a certificate not trusted or unreadable.
_LASTING = frozenset({1, 3, 58, 60, 77})
_TLS_HINT = "; trust the server's CA with SSL_CERT_FILE (a PEM bundle)"
_TLS_ERRORS = frozenset({58, 60, 77})
_ERROR_BODY = 300  # bytes of an error response kept for the message
#: Bytes per read or write callback of a large body (libcurl's default is 16 KiB).
_BLOCK = 512 * 1024


class Transfer(ABC):
    """One request at a time: what to send, where its answer goes, and what its end means."""

    #: The next try's request (a transfer may change it, see ``ended`` and ``again``).
    method: str = "GET"
    url: str = ""
    headers: tuple[str, ...] = ()
    #: The body of a POST or PUT: bytes, or a file sent whole from its start.
    body: bytes | BinaryIO | None = None
    body_size: int = 0
    #: Whether ``ended`` needs the response's headers (a Python call per header line).
    wants_headers: bool = False
    #: False: a request that may have landed is never sent a second time.
    idempotent: bool = True
    #: The whole request's limit in seconds (besides the connection's read timeout).
    timeout: float | None = None
    #: False: 429 and 5xx answers go to ``ended`` like any other (the caller decides).
    retries_statuses: bool = True

    @abstractmethod
    def begin(self) -> Callable[[bytes], object]:
        """Start (or start over): the function that takes the response's bytes."""

    @abstractmethod
    def ended(self, status: int, head: bytes, headers: Mapping[str, str]) -> bool:
        """The response ended with ``status`` (``head``: the first bytes of its body;
        ``headers``, lower-case names, if ``wants_headers``).

        True: done. False: send the next request at once (the transfer changed it). Raising
        ends the whole batch, except :class:`TransientStoreError`.
        """

    def again(self) -> None:  # noqa: B027 - a hook most transfers need not fill
        """A transient failure: the next try (after a wait) sends what this leaves set."""

    @abstractmethod
    def failed(self, why: str) -> Exception:
        """The error to raise when tries ran out (``why``: the last transient failure)."""

    @abstractmethod
    def close(self, ok: bool) -> None:
        """Release what ``begin`` opened; ``ok`` once the transfer is complete."""


class Reply:
    """A buffered response of :meth:`CurlPool.request`."""

    def __init__(self, status: int, headers: Mapping[str, str], data: bytes) -> None:
        self.status, self.headers, self.data = status, headers, data


class _Request(Transfer):
    """One request whose whole answer is kept (listings, metadata calls, small writes)."""

    def __init__(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        what: str,
        idempotent: bool,
        timeout: float | None = None,
        retries_statuses: bool = True,
    ) -> None:
        self.method, self.url, self.body, self.idempotent = method, url, body, idempotent
        self.timeout, self.retries_statuses = timeout, retries_statuses
        self.headers = (*(f"{k}: {v}" for k, v in headers.items()), "Expect:")
        self.wants_headers = True
        self._what = what
        self._data = bytearray()
        self.reply: Reply | None = None

    def begin(self) -> Callable[[bytes], object]:
        self._data = bytearray()
        return self._data.extend

    def ended(self, status: int, head: bytes, headers: Mapping[str, str]) -> bool:
        self.reply = Reply(status, dict(headers), bytes(self._data))
        return True

    def failed(self, why: str) -> Exception:
        landed = "" if self.idempotent else "; whether it landed is unknown: read it back"
        return StoreError(
            f"{self._what} failed: no answer from {urlsplit(self.url).netloc} ({why}){landed}; "
            "is the server running and reachable?"
        )

    def close(self, ok: bool) -> None:
        pass


class _Slot:
    """A curl handle and the transfer it carries."""

    def __init__(self, handle: pycurl.Curl) -> None:
        self.handle = handle
        self.transfer: Transfer | None = None
        self.backoff: Backoff | None = None
        self.sink: Callable[[bytes], object] = _discard
        self.head = bytearray()
        self.headers: dict[str, str] = {}

    def write(self, data: bytes) -> None:
        # The status is not known here (libcurl answers getinfo only after the transfer):
        # the start of every body is kept for an error message; a non-200 body reaching the
        # sink is discarded with it (started over, or closed as failed).
        if len(self.head) < _ERROR_BODY:
            self.head += data[: _ERROR_BODY - len(self.head)]
        self.sink(data)

    def header(self, line: bytes) -> None:
        name, sep, value = line.decode("latin-1").partition(":")
        if sep:
            self.headers[name.strip().lower()] = value.strip()
        elif name.startswith("HTTP/"):  # a new response (after a 100 Continue): its own
            self.headers = {}


def _discard(_: bytes) -> None:
    pass


def _new_handle(http: HttpConfig) -> pycurl.Curl:
    h = pycurl.Curl()
    h.setopt(pycurl.NOSIGNAL, 1)
    h.setopt(pycurl.PROXY, "")  # as the rest of the client: no proxy from the environment
    h.setopt(pycurl.CONNECTTIMEOUT_MS, int(http.connect_timeout * 1000))
    # a read timeout: fail when under 1 byte/s for that long
    h.setopt(pycurl.LOW_SPEED_LIMIT, 1)
    h.setopt(pycurl.LOW_SPEED_TIME, max(1, round(http.read_timeout)))
    h.setopt(pycurl.FOLLOWLOCATION, 0)
    h.setopt(pycurl.BUFFERSIZE, _BLOCK)
    h.setopt(pycurl.UPLOAD_BUFFERSIZE, _BLOCK)
    if http.ca_file:
        h.setopt(pycurl.CAINFO, http.ca_file)
    if http.ca_dir:
        h.setopt(pycurl.CAPATH, http.ca_dir)
    return h


def _reader(t: Transfer) -> tuple[Callable[[int], bytes], int]:
    """What libcurl reads a request body with, from its start, and the body's size."""
    body = t.body
    if isinstance(body, bytes):
        return io.BytesIO(body).read, len(body)
    assert body is not None
    body.seek(0)
    return body.read, t.body_size


#: Sets of handles (one per batch that ran at once) a pool keeps between batches: each
#: holds up to a batch's concurrency of open connections. Single requests (listings, the
#: coordination store's objects, one download) keep sets of one handle apart, more of them:
#: many attempts of a worker make them at once, and each would otherwise connect anew.
IDLE_SETS = 2
IDLE_SINGLES = 16


class CurlPool:
    """Curl handles kept between batches, so their connections stay alive: a task reading a
    few objects does not pay a connect per object. One batch at a time uses a set of them."""

    def __init__(self, http: HttpConfig | None = None) -> None:
        self._http = http if http is not None else HttpConfig()
        self._idle: list[tuple[pycurl.CurlMulti, list[pycurl.Curl]]] = []
        self._idle_singles: list[tuple[pycurl.CurlMulti, list[pycurl.Curl]]] = []
        self._lock = threading.Lock()

    def run(
        self, transfers: Iterable[Transfer], *, concurrency: int, retry_for: float = RETRY_FOR_S
    ) -> None:
        """Run every transfer, ``concurrency`` at a time; the first lasting failure raises.

        A transient failure is tried again until ``retry_for`` seconds after the first try.
        """
        idle, limit = (
            (self._idle_singles, IDLE_SINGLES) if concurrency == 1 else (self._idle, IDLE_SETS)
        )
        with self._lock:
            multi, handles = idle.pop() if idle else (pycurl.CurlMulti(), [])
        try:
            _run(multi, handles, transfers, concurrency, lambda: _new_handle(self._http),
                 retry_for)  # fmt: skip
        finally:
            with self._lock:
                keep = len(idle) < limit
                if keep:
                    idle.append((multi, handles))
            if not keep:  # more batches ran at once than usual: their connections go
                for h in handles:
                    h.close()
                multi.close()

    def request(
        self,
        method: str,
        url: str,
        what: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None = None,
        idempotent: bool = True,
        timeout: float | None = None,
        retries_statuses: bool = True,
    ) -> Reply:
        """One request, its whole answer buffered; no answer at all raises a StoreError
        (after the retry policy's tries, if ``idempotent``). ``timeout``: the whole
        request's limit in seconds. ``retries_statuses`` False: a 429 or 5xx answer is
        returned like any other, for a caller whose own policy reads the status."""
        call = _Request(method, url, headers, body, what, idempotent, timeout, retries_statuses)
        self.run([call], concurrency=1)
        assert call.reply is not None
        return call.reply

    def close(self) -> None:
        with self._lock:
            idle, self._idle, self._idle_singles = self._idle + self._idle_singles, [], []
        for multi, handles in idle:
            for h in handles:
                h.close()
            multi.close()


def _run(
    multi: pycurl.CurlMulti,
    handles: list[pycurl.Curl],
    transfers: Iterable[Transfer],
    concurrency: int,
    new_handle: Callable[[], pycurl.Curl],
    retry_for: float,
) -> None:
    pending: Iterator[Transfer] = iter(transfers)
    waiting: list[tuple[float, int, Transfer, Backoff]] = []  # (due, seq, transfer, backoff)
    slots: list[_Slot] = []
    free: list[_Slot] = []
    busy: dict[int, _Slot] = {}
    seq = 0

    def can_start() -> bool:
        return bool(free) or len(slots) < concurrency

    def take() -> _Slot:
        if free:
            return free.pop()
        if len(handles) == len(slots):
            handles.append(new_handle())
        slots.append(_Slot(handles[len(slots)]))
        return slots[-1]

    def start(slot: _Slot, t: Transfer, backoff: Backoff | None) -> None:
        slot.transfer, slot.backoff = t, backoff
        slot.head = bytearray()
        slot.headers = {}
        slot.sink = t.begin()
        h = slot.handle
        h.setopt(pycurl.URL, t.url)
        h.setopt(pycurl.HTTPHEADER, list(t.headers))
        h.setopt(pycurl.TIMEOUT_MS, 0 if t.timeout is None else max(1, int(t.timeout * 1000)))
        if t.method in ("GET", "POST", "PUT"):
            h.unsetopt(pycurl.CUSTOMREQUEST)
        else:  # DELETE: sent without a body
            h.setopt(pycurl.CUSTOMREQUEST, t.method)
        if t.body is None:
            h.setopt(pycurl.HTTPGET, 1)
        else:
            read, size = _reader(t)
            if t.method == "PUT":
                h.setopt(pycurl.UPLOAD, 1)
                h.setopt(pycurl.INFILESIZE_LARGE, size)
            else:
                h.setopt(pycurl.POST, 1)
                h.setopt(pycurl.POSTFIELDSIZE_LARGE, size)
            h.setopt(pycurl.READFUNCTION, read)
        h.setopt(pycurl.FRESH_CONNECT, 0 if t.idempotent else 1)
        if t.wants_headers:
            h.setopt(pycurl.HEADERFUNCTION, slot.header)
        else:
            h.unsetopt(pycurl.HEADERFUNCTION)
        h.setopt(pycurl.WRITEFUNCTION, slot.write)
        multi.add_handle(h)
        busy[id(h)] = slot

    def finish(slot: _Slot, curl_error: str | None, code: int = 0) -> None:
        multi.remove_handle(slot.handle)
        del busy[id(slot.handle)]
        t, backoff = slot.transfer, slot.backoff
        assert t is not None
        slot.transfer = None
        free.append(slot)
        status = int(slot.handle.getinfo(pycurl.RESPONSE_CODE))
        if code in _LASTING:
            t.close(False)
            raise t.failed(f"{curl_error}{_TLS_HINT if code in _TLS_ERRORS else ''}")
        try:
            if curl_error is not None:
                raise TransientStoreError(curl_error)
            if status in _TRANSIENT_STATUS and t.retries_statuses:
                raise TransientStoreError(f"HTTP {status}: {bytes(slot.head)[:200]!r}")
            done = t.ended(status, bytes(slot.head), slot.headers)
        except TransientStoreError as e:
            backoff = backoff or Backoff(retry_for=retry_for)
            wait = backoff.next_wait(e) if t.idempotent else None
            if wait is None:
                t.close(False)
                raise t.failed(str(e)) from None
            t.again()
            metrics.TRANSFER_RETRIES.inc()
            nonlocal seq
            seq += 1
            heapq.heappush(waiting, (time.monotonic() + wait, seq, t, backoff))
            return
        except BaseException:
            t.close(False)
            raise
        if done:
            t.close(True)
        else:  # the transfer's next request: at once
            start(free.pop(), t, backoff)

    try:
        exhausted = False
        while True:
            now = time.monotonic()
            while can_start() and waiting and waiting[0][0] <= now:
                _, _, t, backoff = heapq.heappop(waiting)
                start(take(), t, backoff)
            while can_start() and not exhausted:
                fresh = next(pending, None)
                if fresh is None:
                    exhausted = True
                    break
                start(take(), fresh, None)
            if not busy and not waiting and exhausted:
                return
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            while True:
                queued, ok, errors = multi.info_read()
                for h in ok:
                    finish(busy[id(h)], None)
                for h, code, message in errors:
                    finish(busy[id(h)], message or f"libcurl error {code}", code)
                if not queued:
                    break
            if busy:
                multi.select(0.25)
            elif waiting:
                time.sleep(max(0.0, min(0.25, waiting[0][0] - time.monotonic())))
    finally:
        for slot in busy.values():
            multi.remove_handle(slot.handle)
            if slot.transfer is not None:
                slot.transfer.close(False)
        for _, _, t, _ in waiting:
            t.close(False)
