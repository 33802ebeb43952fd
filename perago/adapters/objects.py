"""The one way object bytes move between this machine and lakeFS or its object storage.

Three paths, chosen per object; the transfers run on libcurl's multi interface
(:mod:`perago.adapters.curl`), large downloads stream on threads through urllib3, both with
the adapters' one HTTP configuration (:mod:`perago.adapters.http`) and one retry policy:

- **pre-signed**: when lakeFS's blockstore can sign URLs (``PERAGO_PRESIGN``), reads GET the
  URL the listing carries; writes ask lakeFS for an address, PUT the bytes there and link
  them to their path (three requests, many in flight at once). A URL object storage refuses
  (expired, a policy, clock skew) or a PUT it breaks off falls back to lakeFS;
- **through lakeFS**: a GET of the object, or a POST of the file;
- **local**: an object of lakeFS's local blockstore on this machine
  (``PERAGO_LAKEFS_LOCAL_BLOCKSTORE``, a ``file://`` URL) is copied by the kernel, on
  threads; one that cannot be read there is fetched through lakeFS.

Bodies up to 1 MiB are read into memory at once; larger ones stream in blocks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, BinaryIO
from urllib.parse import quote, urlsplit

import structlog
import urllib3

from perago.adapters.curl import CurlPool, Transfer
from perago.adapters.http import HttpConfig
from perago.core import lakefs_names as names
from perago.core.parallel import run_parallel
from perago.core.retry_policy import retrying
from perago.core.store import DownloadJob, FileSink, ObjectInfo, Sink, UploadJob
from perago.errors import (
    ConflictError,
    HeadMovedError,
    NotFoundError,
    StoreError,
    WorkspaceError,
)

__all__ = ["ObjectBytes", "error_for", "unsigned"]

log = structlog.get_logger("perago.adapters.objects")
#: Files up to this size are sent from memory (at most this much per transfer in flight).
SMALL_BODY = 1024 * 1024
_BLOCK = 1024 * 1024
_REFUSED = frozenset({400, 401, 403})


def unsigned(url: str) -> str:
    """A pre-signed URL without its query (signature, expiry): it names the object's bytes."""
    return url.split("?", 1)[0]


def error_for(status: int | None, reason: str, body: str, what: str) -> StoreError:
    message = f"{what} failed with HTTP {status}: {body[:300] or reason}"
    if status == 404:
        return NotFoundError(message, status=status)
    if status == 412 and names.HEAD_MOVED in body:  # the one place lakeFS's text is read
        return HeadMovedError(message, status=status)
    if status in (409, 412):
        return ConflictError(message, status=status)
    if status in (401, 403):
        return StoreError(
            message + " (check LAKECTL_CREDENTIALS_ACCESS_KEY_ID/SECRET_ACCESS_KEY and the "
            "user's permissions)",
            status=status,
            non_retryable=True,
        )
    return StoreError(message, status=status)


def unreadable(source: Path, what: str, e: OSError) -> WorkspaceError:
    return WorkspaceError(
        f"cannot read {source} to {what} ({e.strerror or e}); the workspace changed after the "
        "diff (a thread of the task body still writing?) or the disk failed; the attempt fails "
        "and Conductor retries it"
    )


def _stats(answer: bytes | bytearray, path: str, address: str = "") -> ObjectInfo:
    stats = json.loads(answer)
    return ObjectInfo(
        path=path,
        size=int(stats.get("size_bytes") or 0),
        checksum=str(stats.get("checksum", "")),
        physical_address=address or str(stats.get("physical_address", "")),
    )


def copy_local(url: str, sink: Sink, size: int) -> bool:
    """Copy the local file a ``file://`` URL names into ``sink`` (by the kernel if the sink
    is a file of its own); False, with the sink emptied, if it cannot be read or is not
    ``size`` bytes."""
    try:
        src = os.open(url[len("file://") :], os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if isinstance(sink, FileSink):
            copied = sink.copy_from(src, size)
        else:
            copied = 0
            while chunk := os.read(src, _BLOCK):
                copied += sink.write(chunk)
        if copied == size:
            return True
    except OSError:
        pass
    finally:
        os.close(src)
    sink.seek(0)
    sink.truncate()
    return False


class _Paths:
    """lakeFS's object endpoints and credentials."""

    def __init__(self, http: HttpConfig) -> None:
        self.base = http.base
        self.auth = http.header_lines
        self.headers = dict(http.headers)

    def url(self, repository: str, tail: str, path: str) -> str:
        return (
            f"{self.base}/repositories/{quote(repository, safe='')}/{tail}"
            f"?path={quote(path, safe='')}"
        )

    def object(self, repository: str, ref: str, path: str) -> str:
        return self.url(repository, f"refs/{quote(ref, safe='')}/objects", path)

    def upload(self, repository: str, branch: str, path: str) -> str:
        return self.url(repository, f"branches/{quote(branch, safe='')}/objects", path)

    def backing(self, repository: str, branch: str, path: str) -> str:
        return self.url(repository, f"branches/{quote(branch, safe='')}/staging/backing", path)


class ObjectGet(Transfer):
    """One object into its job's sink: pre-signed if listed so, else through lakeFS."""

    def __init__(
        self, paths: _Paths, repository: str, ref: str, job: DownloadJob, sink: Sink | None = None
    ) -> None:
        self._job = job
        self._sink = sink
        obj = job.obj
        self._what = f"download {repository}@{ref}/{obj.path}"
        self._through_lakefs = (paths.object(repository, ref, obj.path), paths.auth)
        self._presigned = obj.download_url.startswith(("http://", "https://"))
        if self._presigned:
            self.url, self.headers = obj.download_url, ()
        else:
            self.url, self.headers = self._through_lakefs

    def begin(self) -> Callable[[bytes], object]:
        if self._sink is None:
            self._sink = self._job.open()
        else:
            self._sink.seek(0)
            self._sink.truncate()
        sink: Sink = self._sink
        return sink.write

    def ended(self, status: int, head: bytes, headers: Mapping[str, str]) -> bool:
        if status == 200:
            return True
        if self._presigned and status in _REFUSED:
            log.info("presigned_url_refused", status=status, path=self._job.obj.path)
            self._presigned = False
            self.url, self.headers = self._through_lakefs
            return False
        server = "object storage" if self._presigned else "lakeFS"
        raise error_for(status, "", head.decode(errors="replace"), f"{server} {self._what}")

    def failed(self, why: str) -> Exception:
        where = urlsplit(self.url).netloc
        return StoreError(
            f"{self._what} failed: no answer from {where} ({why}); is lakeFS (or object "
            "storage, for a pre-signed URL) running and reachable?"
        )

    def close(self, ok: bool) -> None:
        if self._sink is not None:
            self._job.close(ok)


class ObjectPut(Transfer):
    """One file to a branch: pre-signed (address, PUT, link) or a POST through lakeFS.

    A transient failure of a pre-signed step starts again with a new address; a PUT that
    object storage refuses or breaks off (a server refusing a large body often answers 403
    and closes while the body is still on its way) goes through lakeFS instead.
    """

    def __init__(
        self, paths: _Paths, repository: str, branch: str, job: UploadJob, *, presigned: bool
    ) -> None:
        self._paths, self._job = paths, job
        self._what = f"upload {repository}/{branch}/{job.path}"
        self._post_url = paths.upload(repository, branch, job.path)
        self._backing = paths.backing(repository, branch, job.path)
        self._file: BinaryIO | None = None
        self._payload: bytes | BinaryIO | None = None
        self._size = 0
        self._answer = bytearray()
        self._location: dict[str, object] = {}
        self._step = ""
        self._go("address" if presigned else "post")

    def _go(self, step: str) -> None:
        self._step = step
        self.wants_headers = step == "put"
        if step == "address":
            self.method, self.url, self.body = "GET", self._backing + "&presign=true", None
            self.headers = self._paths.auth
        elif step == "put":
            self.method, self.url = "PUT", str(self._location["presigned_url"])
            self.headers, self.body, self.body_size = ("Expect:",), self._payload, self._size
        elif step == "link":
            self.method, self.url = "PUT", self._backing
            self.headers = (*self._paths.auth, "Content-Type: application/json", "Expect:")
            self.body = None  # set once the PUT's ETag is known
        else:  # post
            self.method, self.url = "POST", self._post_url
            self.headers = (*self._paths.auth, "Content-Type: application/octet-stream", "Expect:")
            self.body, self.body_size = self._payload, self._size

    def begin(self) -> Callable[[bytes], object]:
        if self._payload is None:
            self._open()
            if self._step in ("put", "post"):
                self.body, self.body_size = self._payload, self._size
        self._answer = bytearray()
        return self._answer.extend

    def _open(self) -> None:
        source = self._job.source
        try:  # a local file that cannot be read is no network fault: never retried
            f = source.open("rb")
            try:
                self._size = os.fstat(f.fileno()).st_size
                if self._size <= SMALL_BODY:
                    self._payload = f.read()
                    self._size = len(self._payload)
                    f.close()
                else:
                    self._file = self._payload = f
            except BaseException:
                f.close()
                raise
        except OSError as e:
            raise unreadable(source, self._what, e) from e

    def ended(self, status: int, head: bytes, headers: Mapping[str, str]) -> bool:
        step = self._step
        if step == "put" and status in _REFUSED:
            log.info("presigned_url_refused", status=status, path=self._job.path, method="PUT")
            self._go("post")
            return False
        if status >= 300:
            server = "object storage" if step == "put" else "lakeFS"
            raise error_for(status, "", head.decode(errors="replace"), f"{server} {self._what}")
        if step == "address":
            self._location = json.loads(self._answer)
            self._go("put")
            return False
        if step == "put":
            metadata = {
                "staging": self._location,
                "checksum": headers.get("etag", "").strip('"'),
                "size_bytes": self._size,
            }
            self._go("link")
            self.body = json.dumps(metadata).encode()
            return False
        address = unsigned(str(self._location["presigned_url"])) if step == "link" else ""
        stored = _stats(self._answer, self._job.path, address)
        if step == "link" and not stored.size:
            stored = ObjectInfo(stored.path, self._size, stored.checksum, stored.physical_address)
        self._job.done(stored)
        return True

    def again(self) -> None:
        if self._step == "put":
            log.info("presigned_put_failed", path=self._job.path)
            self._go("post")
        elif self._step == "link":
            self._go("address")  # the address may be spent: ask for a new one

    def failed(self, why: str) -> Exception:
        return StoreError(
            f"{self._what} failed: no answer from {urlsplit(self.url).netloc} ({why}); "
            "is lakeFS running and reachable?"
        )

    def close(self, ok: bool) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._payload = self.body = None


class _Opened:
    """A job whose sink is open already (its local copy failed): closed once at most."""

    def __init__(self, job: DownloadJob, sink: Sink) -> None:
        self.obj, self.sink, self._job, self._closed = job.obj, sink, job, False

    def open(self) -> Sink:
        return self.sink

    def close(self, ok: bool) -> None:
        if not self._closed:
            self._closed = True
            self._job.close(ok)


class _IntoStream:
    """A single download's job: its sink is the caller's stream."""

    def __init__(self, obj: ObjectInfo, dest: IO[bytes]) -> None:
        self.obj, self._dest = obj, dest

    def open(self) -> Sink:
        self._dest.seek(0)
        self._dest.truncate()
        return self._dest

    def close(self, ok: bool) -> None:
        pass


class _Stored:
    """A single upload's job, keeping what lakeFS stored."""

    def __init__(self, path: str, source: Path) -> None:
        self.path, self.source = path, source
        self.stored: ObjectInfo | None = None

    def done(self, stored: ObjectInfo) -> None:
        self.stored = stored


def _transient(e: BaseException) -> bool:
    if isinstance(e, StoreError):
        return e.status in (429, 502, 503, 504) or e.status is None
    return False


def _stream_get(
    streams: urllib3.PoolManager,
    paths: _Paths,
    repository: str,
    ref: str,
    job: DownloadJob,
    sink: Sink | None,
) -> None:
    """One large object into its job's sink, pre-signed first if listed so."""
    ok = False
    try:
        if sink is None:
            sink = job.open()
        _stream_into(streams, paths, repository, ref, job.obj, sink)
        ok = True
    finally:
        if sink is not None:
            job.close(ok)


@retrying(_transient)
def _stream_into(
    streams: urllib3.PoolManager,
    paths: _Paths,
    repository: str,
    ref: str,
    obj: ObjectInfo,
    sink: Sink,
) -> None:
    what = f"download {repository}@{ref}/{obj.path}"
    sources = [(paths.object(repository, ref, obj.path), paths.headers, "lakeFS")]
    if obj.download_url.startswith(("http://", "https://")):
        sources.insert(0, (obj.download_url, {}, "object storage"))
    for url, headers, server in sources:
        sink.seek(0)
        sink.truncate()
        try:
            resp = streams.request("GET", url, headers=headers, preload_content=False)
        except urllib3.exceptions.HTTPError as e:
            raise StoreError(
                f"{server} {what} failed: no answer from {urlsplit(url).netloc} ({e}); "
                f"is {server} running and reachable?"
            ) from e
        whole = False
        try:
            if server == "object storage" and resp.status in _REFUSED:
                log.info("presigned_url_refused", status=resp.status, path=obj.path)
                continue
            if resp.status >= 300:
                body = resp.read(300).decode(errors="replace")
                raise error_for(resp.status, str(resp.reason or ""), body, f"{server} {what}")
            try:
                for chunk in resp.stream(_BLOCK):
                    sink.write(chunk)
            except urllib3.exceptions.HTTPError as e:
                raise StoreError(f"{server} {what} failed midway ({e})") from e
            whole = True
            return
        finally:
            if not whole:  # unread bytes: the connection is not reused
                resp.close()
            resp.release_conn()


class ObjectBytes:
    """Downloads and uploads of objects for :class:`perago.adapters.lakefs.LakeFSStore`."""

    def __init__(
        self,
        pool: CurlPool,
        http: HttpConfig,
        *,
        presigned: Callable[[], bool],
        uploads_in_flight: int,
    ) -> None:
        self._pool = pool
        self._streams = http.stream_pool(maxsize=64)  # the one policy retries (_stream_into)
        self._paths = _Paths(http)
        self._presigned = presigned
        self._uploads_in_flight = uploads_in_flight

    def close(self) -> None:
        self._streams.clear()

    def download(
        self, repository: str, ref: str, path: str, dest: IO[bytes], *, url: str = ""
    ) -> None:
        """One object into ``dest`` (rewound and truncated first)."""
        size = 0
        if url.startswith("file://"):
            try:
                size = os.stat(url[len("file://") :]).st_size
            except OSError:
                url = ""  # not shared after all, or collected: through lakeFS
        job = _IntoStream(ObjectInfo(path, size, "", download_url=url), dest)
        self.download_many(repository, ref, [job], parallelism=1)

    def download_many(
        self, repository: str, ref: str, jobs: Iterable[DownloadJob], *, parallelism: int
    ) -> None:
        """Local objects first (kernel copies on ``parallelism`` threads), then the rest and
        the local ones that could not be read, ``parallelism`` in flight."""
        remote: list[DownloadJob] = []
        local: list[DownloadJob] = []
        for job in jobs:
            (local if job.obj.download_url.startswith("file://") else remote).append(job)
        unread: list[_Opened] = []

        def copy(job: DownloadJob) -> None:
            sink = job.open()
            if copy_local(job.obj.download_url, sink, job.obj.size):
                job.close(True)
            else:  # not shared after all, or collected: through lakeFS
                log.info("local_blockstore_unreadable", path=job.obj.path)
                unread.append(_Opened(job, sink))

        paths = self._paths
        try:
            if local:
                run_parallel(local, copy, parallelism=parallelism)
            pending: list[tuple[DownloadJob, Sink | None]] = [(o, o.sink) for o in unread]
            pending += [(job, None) for job in remote]
            # Large objects one per thread, streamed by urllib3: their cost is moving bytes,
            # which libcurl's callbacks on one thread do at 0.6x the pace (docs/benchmarks.md).
            large = [(job, sink) for job, sink in pending if job.obj.size > SMALL_BODY]
            if large:

                def get_one(item: tuple[DownloadJob, Sink | None]) -> None:
                    job, sink = item
                    _stream_get(self._streams, paths, repository, ref, job, sink)

                run_parallel(large, get_one, parallelism=parallelism)
            small = (
                ObjectGet(paths, repository, ref, job, sink)
                for job, sink in pending
                if job.obj.size <= SMALL_BODY
            )
            self._pool.run(small, concurrency=parallelism)
        except BaseException:
            for opened in unread:  # those no transfer began (the others closed once already)
                opened.close(False)
            raise

    def upload(self, repository: str, branch: str, path: str, source: Path) -> ObjectInfo:
        job = _Stored(path, source)
        self.upload_many(repository, branch, [job])
        assert job.stored is not None
        return job.stored

    def upload_many(
        self,
        repository: str,
        branch: str,
        jobs: Iterable[UploadJob],
        *,
        parallelism: int | None = None,
    ) -> None:
        """Every file, ``PERAGO_UPLOAD_PARALLELISM`` in flight (or ``parallelism``)."""
        presigned = self._presigned()
        paths = self._paths
        self._pool.run(
            (ObjectPut(paths, repository, branch, job, presigned=presigned) for job in jobs),
            concurrency=parallelism or self._uploads_in_flight,
        )
