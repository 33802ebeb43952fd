"""The only module that talks to lakeFS.

Metadata calls go through the generated ``lakefs_sdk``; object bytes and listings go over
:mod:`perago.adapters.http` (streamed: the generated client buffers whole bodies in memory,
and costs more CPU per request). Every SDK error is translated into a
:class:`perago.errors.StoreError` subclass.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import lakefs_sdk
import structlog
import urllib3
from lakefs_sdk.exceptions import ApiException
from pydantic import SecretStr
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from perago.adapters.curl import CurlPool, Transfer
from perago.adapters.http import Response, Transport, TransportError
from perago.errors import ConfigError, ConflictError, NotFoundError, StoreError, WorkspaceError
from perago.parallel import run_parallel
from perago.store import Commit, DownloadJob, ObjectInfo, Sink, UploadJob, download_one

__all__ = ["LakeFSConnection", "LakeFSStore"]

T = TypeVar("T")
log = structlog.get_logger("perago.adapters.lakefs")
_CHUNK = 1024 * 1024
#: Files up to this size are uploaded from memory (at most this much per transfer thread).
_SMALL_BODY = 1024 * 1024
MAX_DELETE_BATCH = 1000


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, StoreError):
        return e.status in (429, 502, 503, 504) or e.status is None
    return isinstance(e, urllib3.exceptions.HTTPError | OSError)


#: Retries for calls that are safe to repeat (reads, deletes, idempotent creates).
_retry_idempotent = retry(
    retry=retry_if_exception(_is_transient),
    stop=stop_after_delay(60),
    wait=wait_exponential(multiplier=0.2, max=5),
    reraise=True,
)


def _unsigned(url: str) -> str:
    """A pre-signed URL without its query (signature, expiry): it names the object's bytes."""
    return url.split("?", 1)[0]


def _unreadable(source: Path, what: str, e: OSError) -> WorkspaceError:
    return WorkspaceError(
        f"cannot read {source} to {what} ({e.strerror or e}); the workspace changed after the "
        "diff (a thread of the task body still writing?) or the disk failed; the attempt fails "
        "and Conductor retries it"
    )


def _translate(e: ApiException, what: str) -> StoreError:
    body = e.body if isinstance(e.body, str) else str(e.body or "")
    return _error_for(e.status, str(e.reason or ""), body, f"lakeFS {what}")


def _error_for(status: int | None, reason: str, body: str, what: str) -> StoreError:
    message = f"{what} failed with HTTP {status}: {body[:300] or reason}"
    if status == 404:
        return NotFoundError(message, status=status)
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


class _ObjectGet(Transfer):
    """One object of :meth:`LakeFSStore.download_many` into its job's sink."""

    def __init__(self, store: LakeFSStore, repository: str, ref: str, job: DownloadJob) -> None:
        self._job = job
        self._sink: Sink | None = None
        obj = job.obj
        self._what = f"download {repository}@{ref}/{obj.path}"
        self._through_lakefs = (
            store._url(repository, f"refs/{quote(ref, safe='')}/objects", obj.path),
            tuple(f"{k}: {v}" for k, v in store._auth.items()),
        )
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

    def ended(self, status: int, head: bytes) -> bool:
        if status == 200:
            return True
        if self._presigned and status in (400, 401, 403):
            log.info("presigned_url_refused", status=status, path=self._job.obj.path)
            self._presigned = False
            self.url, self.headers = self._through_lakefs
            return False
        server = "object storage" if self._presigned else "lakeFS"
        raise _error_for(status, "", head.decode(errors="replace"), f"{server} {self._what}")

    def failed(self, why: str) -> Exception:
        where = urlsplit(self.url).netloc
        return StoreError(
            f"{self._what} failed: no answer from {where} ({why}); is lakeFS (or object "
            "storage, for a pre-signed URL) running and reachable?"
        )

    def close(self, ok: bool) -> None:
        if self._sink is not None:
            self._job.close(ok)


class _ObjectPost(Transfer):
    """One file of :meth:`LakeFSStore.upload_many` (at most ``_SMALL_BODY`` bytes)."""

    def __init__(self, store: LakeFSStore, repository: str, branch: str, job: UploadJob) -> None:
        self._job = job
        self._what = f"upload {repository}/{branch}/{job.path}"
        self.url = store._url(repository, f"branches/{quote(branch, safe='')}/objects", job.path)
        auth = tuple(f"{k}: {v}" for k, v in store._auth.items())
        # no "Expect: 100-continue" round trip before the body
        self.headers = (*auth, "Content-Type: application/octet-stream", "Expect:")
        self._answer = bytearray()

    def begin(self) -> Callable[[bytes], object]:
        if self.body is None:
            try:  # a local file that cannot be read is no network fault: never retried
                self.body = self._job.source.read_bytes()
            except OSError as e:
                raise _unreadable(self._job.source, self._what, e) from e
        self._answer = bytearray()
        return self._answer.extend

    def ended(self, status: int, head: bytes) -> bool:
        if status >= 300:
            raise _error_for(status, "", head.decode(errors="replace"), f"lakeFS {self._what}")
        stats = json.loads(self._answer)
        self._job.done(
            ObjectInfo(
                path=self._job.path,
                size=int(stats.get("size_bytes") or 0),
                checksum=str(stats.get("checksum", "")),
                physical_address=str(stats.get("physical_address", "")),
            )
        )
        return True

    def failed(self, why: str) -> Exception:
        return StoreError(
            f"lakeFS {self._what} failed: no answer from {urlsplit(self.url).netloc} ({why}); "
            "is lakeFS running and reachable?"
        )

    def close(self, ok: bool) -> None:
        self.body = None


def _commit(c: Any) -> Commit:
    return Commit(
        id=c.id,
        parents=tuple(c.parents or ()),
        message=c.message or "",
        metadata=dict(c.metadata or {}),
        created=int(getattr(c, "creation_date", 0) or 0),
    )


class LakeFSConnection(Protocol):
    """The values the adapter connects with; :class:`perago.config.Settings` has them (the
    adapter does not import the settings module: settings build adapters, not the reverse)."""

    @property
    def lakefs_api_url(self) -> str: ...
    @property
    def lakefs_access_key_id(self) -> str: ...
    @property
    def lakefs_secret_access_key(self) -> SecretStr: ...
    @property
    def http_timeout(self) -> timedelta: ...
    @property
    def transfer_parallelism(self) -> int: ...
    @property
    def upload_parallelism(self) -> int: ...
    @property
    def presign(self) -> str: ...
    @property
    def lakefs_local_blockstore(self) -> Path | None: ...
    def require_lakefs_credentials(self) -> None: ...


class LakeFSStore:
    """A :class:`perago.store.VersionStore` backed by a lakeFS server."""

    #: How one object of :meth:`download_many` is fetched (a test records its URLs).
    _object_get: type[_ObjectGet] = _ObjectGet

    def __init__(self, settings: LakeFSConnection) -> None:
        settings.require_lakefs_credentials()
        secret = settings.lakefs_secret_access_key.get_secret_value()
        config = lakefs_sdk.Configuration(
            host=settings.lakefs_api_url,
            username=settings.lakefs_access_key_id,
            password=secret,
        )
        config.connection_pool_maxsize = max(16, settings.transfer_parallelism * 2)
        self._client = lakefs_sdk.ApiClient(config)
        self._timeout = settings.http_timeout.total_seconds()
        self._base = settings.lakefs_api_url
        token = base64.b64encode(f"{settings.lakefs_access_key_id}:{secret}".encode()).decode()
        self._auth = {"Authorization": f"Basic {token}"}
        self._http = Transport(
            connect_timeout=10,
            read_timeout=self._timeout,
            maxsize=max(16, settings.transfer_parallelism * 2),
        )
        self._curl = CurlPool(connect_timeout=10, read_timeout=self._timeout)
        self._uploads_in_flight = settings.upload_parallelism
        self.repos = lakefs_sdk.RepositoriesApi(self._client)
        self.branches = lakefs_sdk.BranchesApi(self._client)
        self.commits = lakefs_sdk.CommitsApi(self._client)
        self.refs = lakefs_sdk.RefsApi(self._client)
        self.objects = lakefs_sdk.ObjectsApi(self._client)
        self.tags = lakefs_sdk.TagsApi(self._client)
        self.experimental = lakefs_sdk.ExperimentalApi(self._client)
        self._presign_mode = settings.presign
        self._presign: bool | None = None  # decided on first use, from lakeFS's storage config
        local = settings.lakefs_local_blockstore
        self._local_root = os.path.realpath(local) + os.sep if local is not None else None

    def close(self) -> None:
        self._http.close()
        self._curl.close()
        self._client.close()

    def _call(
        self,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T:
        try:
            return fn(*args, _request_timeout=timeout or self._timeout, **kwargs)
        except ApiException as e:
            raise _translate(e, what) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise StoreError(
                f"lakeFS {what} failed: cannot reach {self._base} ({e}); is lakeFS running?"
            ) from e

    # -- repositories and refs ------------------------------------------------------------

    @_retry_idempotent
    def storage_namespace_for(self, name: str) -> str:
        """Where a new repository's data goes, as lakeFS says (its default namespace prefix),
        so the same call works on a local, S3, GCS or Azure blockstore."""
        storage = self._storage_config()
        prefix = (storage.default_namespace_prefix or "") if storage else ""
        if not prefix:
            kind = storage.blockstore_type if storage else "unknown"
            example = storage.blockstore_namespace_example if storage else ""
            raise StoreError(
                f"lakeFS ({kind} blockstore) has no default storage namespace prefix: set "
                f"blockstore.default_namespace_prefix in lakeFS's configuration, or create "
                f"repository {name!r} yourself (lakectl repo create, namespace like {example})"
            )
        return prefix + name if prefix.endswith("://") else prefix.rstrip("/") + "/" + name

    @_retry_idempotent
    def create_repository(self, name: str, *, default_branch: str = "main") -> None:
        self._call(
            f"create repository {name!r}",
            self.repos.create_repository,
            lakefs_sdk.RepositoryCreation(
                name=name,
                storage_namespace=self.storage_namespace_for(name),
                default_branch=default_branch,
            ),
        )

    @_retry_idempotent
    def delete_repository(self, name: str) -> None:
        self._call(f"delete repository {name!r}", self.repos.delete_repository, name)

    @_retry_idempotent
    def list_repositories(self) -> list[str]:
        names: list[str] = []
        after = ""
        while True:
            page = self._call(
                "list repositories", self.repos.list_repositories, after=after or None, amount=1000
            )
            names.extend(r.id for r in page.results)
            if not page.pagination.has_more:
                return names
            after = page.pagination.next_offset

    @_retry_idempotent
    def repository_exists(self, repository: str) -> bool:
        try:
            self._call(f"get repository {repository!r}", self.repos.get_repository, repository)
        except NotFoundError:
            return False
        return True

    @_retry_idempotent
    def default_branch(self, repository: str) -> str:
        repo = self._call(f"get repository {repository!r}", self.repos.get_repository, repository)
        return str(repo.default_branch)

    @_retry_idempotent
    def branch_head(self, repository: str, branch: str) -> str:
        ref = self._call(
            f"get branch {repository}/{branch}", self.branches.get_branch, repository, branch
        )
        return str(ref.commit_id)

    @_retry_idempotent
    def get_commit(self, repository: str, ref: str) -> Commit:
        return _commit(
            self._call(f"get commit {repository}@{ref}", self.commits.get_commit, repository, ref)
        )

    @_retry_idempotent
    def log(self, repository: str, ref: str, *, amount: int = 50) -> list[Commit]:
        """First-parent history of ``ref``, newest first."""
        result = self._call(
            f"log {repository}@{ref}",
            self.refs.log_commits,
            repository,
            ref,
            amount=amount,
            first_parent=True,
            limit=True,
        )
        return [_commit(c) for c in result.results]

    @_retry_idempotent
    def create_branch(
        self, repository: str, name: str, source: str, *, hidden: bool = False
    ) -> None:
        """``hidden``: left out of users' branch lists (lakeFS UI, ``lakectl branch list``)."""
        self._call(
            f"create branch {repository}/{name}",
            self.branches.create_branch,
            repository,
            lakefs_sdk.BranchCreation(name=name, source=source, hidden=hidden),
        )

    @_retry_idempotent
    def delete_branch(self, repository: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            self._call(
                f"delete branch {repository}/{name}", self.branches.delete_branch, repository, name
            )

    @_retry_idempotent
    def list_branches(self, repository: str, *, prefix: str = "") -> list[tuple[str, str]]:
        """Every branch, hidden ones included (Perago's staging and coordination branches)."""
        found: list[tuple[str, str]] = []
        after = ""
        while True:
            page = self._call(
                f"list branches of {repository}",
                self.branches.list_branches,
                repository,
                prefix=prefix or None,
                after=after or None,
                amount=1000,
                show_hidden=True,
            )
            found.extend((r.id, r.commit_id) for r in page.results)
            if not page.pagination.has_more:
                return found
            after = page.pagination.next_offset

    @_retry_idempotent
    def has_uncommitted(self, repository: str, branch: str) -> bool:
        page = self._call(
            f"diff branch {repository}/{branch}",
            self.branches.diff_branch,
            repository,
            branch,
            amount=1,
        )
        return bool(page.results)

    @_retry_idempotent
    def uncommitted_outside(self, repository: str, branch: str, prefix: str) -> list[str]:
        # One diff page per folder on the way to the prefix, grouped by "/": at each level at
        # most one entry (the next folder) is on the way, so a short page sees any stray path,
        # however much was written inside the prefix.
        levels = [""] + [
            "/".join(prefix.split("/")[: n + 1]) + "/" for n in range(prefix.count("/"))
        ]
        for level in levels:
            if level == prefix:
                break
            page = self._call(
                f"diff branch {repository}/{branch}",
                self.branches.diff_branch,
                repository,
                branch,
                prefix=level or None,
                delimiter="/",
                amount=20,
            )
            outside = [
                d.path
                for d in page.results
                if not (
                    (d.path.endswith("/") and prefix.startswith(d.path))
                    or d.path.startswith(prefix)
                )
            ]
            if outside:
                return outside
        return []

    @_retry_idempotent
    def create_tag(self, repository: str, tag: str, ref: str) -> None:
        self._call(
            f"create tag {repository}/{tag}",
            self.tags.create_tag,
            repository,
            lakefs_sdk.TagCreation(id=tag, ref=ref),
        )

    @_retry_idempotent
    def get_tag(self, repository: str, tag: str) -> str:
        return str(self._call(f"get tag {tag}", self.tags.get_tag, repository, tag).commit_id)

    # -- writes that move heads (never blindly retried: the caller decides) ---------------

    def commit(
        self, repository: str, branch: str, *, message: str, metadata: dict[str, str]
    ) -> Commit:
        return _commit(
            self._call(
                f"commit on {repository}/{branch}",
                self.commits.commit,
                repository,
                branch,
                lakefs_sdk.CommitCreation(message=message, metadata=metadata),
            )
        )

    def merge(
        self,
        repository: str,
        source: str,
        destination: str,
        *,
        message: str,
        metadata: dict[str, str],
        timeout: float | None = None,
    ) -> str:
        result = self._call(
            f"merge {source} into {repository}/{destination}",
            self.refs.merge_into_branch,
            repository,
            source,
            destination,
            merge=lakefs_sdk.Merge(message=message, metadata=metadata),
            timeout=timeout,
        )
        return str(result.reference)

    def revert(self, repository: str, branch: str, commit: str, *, parent_number: int) -> str:
        """Commit the undoing of ``commit`` on ``branch``; returns the new head.

        lakeFS answers 204 without the commit, so the head is read afterwards: only for
        branches no one else writes (a publisher's private staging branch).
        """
        self._call(
            f"revert {commit} on {repository}/{branch}",
            self.branches.revert_branch,
            repository,
            branch,
            lakefs_sdk.RevertCreation(ref=commit, parent_number=parent_number),
        )
        return self.branch_head(repository, branch)

    def hard_reset(
        self, repository: str, branch: str, ref: str, *, timeout: float | None = None
    ) -> None:
        """Never retried: a branch lease caps it with ``timeout`` (see Publisher._reset)."""
        self._call(
            f"hard-reset {repository}/{branch} to {ref}",
            self.experimental.hard_reset_branch,
            repository,
            branch,
            ref,
            timeout=timeout,
        )

    # -- objects ----------------------------------------------------------------------------

    def presigned(self) -> bool:
        """Whether object bytes move with pre-signed URLs (``PERAGO_PRESIGN`` and lakeFS's
        blockstore decide; asked once per store)."""
        if self._presign is None:
            if self._presign_mode == "off":
                self._presign = False
            else:
                storage = self._storage_config()
                supported = bool(storage.pre_sign_support) if storage else False
                if self._presign_mode == "on" and not supported:
                    kind = storage.blockstore_type if storage else "unknown"
                    raise ConfigError(
                        f"PERAGO_PRESIGN=on, but lakeFS at {self._base} cannot pre-sign URLs "
                        f"on its {kind} blockstore; set PERAGO_PRESIGN=auto (or off) to send "
                        "object bytes through lakeFS"
                    )
                self._presign = supported
            log.info("object_transfers", presigned=self._presign, mode=self._presign_mode)
        return self._presign

    @_retry_idempotent
    def _storage_config(self) -> Any:
        cfg = self._call("get storage config", lakefs_sdk.ConfigApi(self._client).get_config)
        return cfg.storage_config

    def list_objects(
        self, repository: str, ref: str, prefix: str, *, direct: bool = False
    ) -> Iterator[ObjectInfo]:
        """The objects under ``prefix``. With ``direct``, each carries a ``download_url`` that
        bypasses lakeFS where one exists: pre-signed where :meth:`presigned` (its address is
        then that URL without its signature, which is what a pre-signed upload of the same
        object reports), or ``file://`` under ``PERAGO_LAKEFS_LOCAL_BLOCKSTORE``."""
        presign = direct and self.presigned()
        after = ""
        while True:
            page = self._list_page(repository, ref, prefix, after, presign)
            for o in page["results"]:
                if o.get("path_type") == "object":
                    address = o.get("physical_address") or ""
                    if presign:
                        address, url = _unsigned(address), address
                    else:
                        url = self._local_url(address) if direct else ""
                    yield ObjectInfo(
                        path=o["path"],
                        size=int(o.get("size_bytes") or 0),
                        checksum=o.get("checksum", ""),
                        physical_address=address,
                        download_url=url,
                    )
            pagination = page["pagination"]
            if not pagination.get("has_more"):
                return
            after = pagination["next_offset"]

    def diff_refs(
        self, repository: str, left: str, right: str, *, prefix: str = ""
    ) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        after = ""
        while True:
            page = self._diff_page(repository, left, right, after, prefix)
            out += [(str(d.type), str(d.path)) for d in page.results if d.path_type == "object"]
            if not page.pagination.has_more:
                return out
            after = page.pagination.next_offset

    @_retry_idempotent
    def _diff_page(self, repository: str, left: str, right: str, after: str, prefix: str) -> Any:
        return self._call(
            f"diff {repository} {left}..{right}" + (f" under {prefix}" if prefix else ""),
            self.refs.diff_refs,
            repository,
            left,
            right,
            after=after or None,
            amount=1000,
            prefix=prefix or None,
        )

    @_retry_idempotent
    def copy_object(self, repository: str, source_ref: str, path: str, branch: str) -> None:
        self._call(
            f"copy {repository}@{source_ref}/{path} to {branch}",
            self.objects.copy_object,
            repository,
            branch,
            path,
            lakefs_sdk.ObjectCopyCreation(src_path=path, src_ref=source_ref),
        )

    def _local_url(self, address: str) -> str:
        """A ``file://`` URL for an object of the configured local blockstore, else ""."""
        if self._local_root is None or not address.startswith("local:///"):
            return ""
        path = os.path.normpath(address[len("local://") :])
        return f"file://{path}" if path.startswith(self._local_root) else ""

    @_retry_idempotent
    def _list_page(
        self, repository: str, ref: str, prefix: str, after: str, presign: bool = False
    ) -> dict[str, Any]:
        """One page of a listing as plain JSON: the generated models cost about 50 us per
        object to build, more than the listing itself (docs/benchmarks.md)."""
        what = f"list {repository}@{ref}/{prefix}"
        query = urlencode(
            {"prefix": prefix, "after": after, "amount": 1000, "presign": str(presign).lower()}
        )
        url = f"{self._base}/repositories/{quote(repository, safe='')}/refs/{quote(ref, safe='')}"
        resp = self._request("GET", f"{url}/objects/ls?{query}", what, timeout=self._timeout)
        self._check(resp, what)
        page: dict[str, Any] = json.loads(resp.data)
        return page

    def _url(self, repository: str, tail: str, path: str) -> str:
        return (
            f"{self._base}/repositories/{quote(repository, safe='')}/{tail}"
            f"?path={quote(path, safe='')}"
        )

    def _check(self, resp: Response, what: str, server: str = "lakeFS") -> None:
        if resp.status >= 300:
            body = resp.data[:300].decode(errors="replace") if resp.data else ""
            raise _error_for(resp.status, str(resp.reason or ""), body, f"{server} {what}")

    @_retry_idempotent
    def download(
        self, repository: str, ref: str, path: str, dest: IO[bytes], *, url: str = ""
    ) -> None:
        """Stream one object into ``dest`` (rewound and truncated first, so retries are safe).

        With ``url`` (an :class:`ObjectInfo`'s pre-signed ``download_url``) the bytes come
        straight from object storage; a URL it refuses (expired) falls back to lakeFS.
        """
        dest.seek(0)
        dest.truncate()
        what = f"download {repository}@{ref}/{path}"
        if url.startswith("file://"):
            try:
                with open(url[len("file://") :], "rb") as f:
                    shutil.copyfileobj(f, dest, _CHUNK)
                return
            except OSError as e:  # not shared after all, or collected: ask lakeFS
                log.info("local_blockstore_unreadable", path=path, error=str(e))
                dest.seek(0)
                dest.truncate()
                url = ""
        if url:
            resp = self._request(
                "GET", url, what, headers={}, server="object storage", preload_content=False
            )
            try:
                if resp.status in (400, 401, 403):
                    log.info("presigned_url_refused", status=resp.status, path=path)
                else:
                    self._check(resp, what, "object storage")
                    shutil.copyfileobj(resp, dest, _CHUNK)
                    return
            finally:
                resp.release_conn()
            dest.seek(0)
            dest.truncate()
        url = self._url(repository, f"refs/{quote(ref, safe='')}/objects", path)
        resp = self._request("GET", url, what, preload_content=False)
        try:
            self._check(resp, what)
            shutil.copyfileobj(resp, dest, _CHUNK)
        finally:
            resp.release_conn()

    def download_many(
        self, repository: str, ref: str, jobs: Iterable[DownloadJob], *, parallelism: int
    ) -> None:
        """Objects up to 1 MiB over libcurl's multi interface (:mod:`perago.adapters.curl`),
        larger ones through :meth:`download` on ``parallelism`` threads (one thread writing
        every byte of 10 x 50 MiB took twice as long); pre-signed URLs where listed (falling
        back to lakeFS when refused), else lakeFS."""
        large: list[DownloadJob] = []

        def small() -> Iterator[_ObjectGet]:
            for job in jobs:
                if job.obj.size > _SMALL_BODY:
                    large.append(job)
                else:
                    yield self._object_get(self, repository, ref, job)

        self._curl.get_all(small(), concurrency=parallelism)
        if large:
            run_parallel(
                large, lambda job: download_one(self, repository, ref, job), parallelism=parallelism
            )

    def upload_many(
        self, repository: str, branch: str, jobs: Iterable[UploadJob], *, parallelism: int
    ) -> None:
        """Small files over libcurl's multi interface (one POST each, like :meth:`upload`,
        ``PERAGO_UPLOAD_PARALLELISM`` in flight); larger ones, and every file when transfers
        are pre-signed, through :meth:`upload` on ``parallelism`` threads (their cost is
        bytes, not requests)."""
        small: list[UploadJob] = []
        threaded: list[UploadJob] = []
        presigned = self.presigned()
        for job in jobs:
            try:
                size = job.source.stat().st_size
            except OSError as e:
                raise _unreadable(job.source, f"upload {repository}/{branch}/{job.path}", e) from e
            (threaded if presigned or size > _SMALL_BODY else small).append(job)
        if threaded:

            def put(job: UploadJob) -> None:
                job.done(self.upload(repository, branch, job.path, job.source))

            run_parallel(threaded, put, parallelism=parallelism)
        self._curl.get_all(
            (_ObjectPost(self, repository, branch, job) for job in small),
            concurrency=self._uploads_in_flight,
        )

    def _request(
        self,
        method: str,
        url: str,
        what: str,
        *,
        headers: dict[str, str] | None = None,
        server: str = "lakeFS",
        **kwargs: Any,
    ) -> Response:
        """One HTTP request (lakeFS's auth unless ``headers`` says otherwise); no answer is a
        StoreError without a status, which the idempotent calls retry."""
        try:
            return self._http.request(
                method, url, headers=self._auth if headers is None else headers, **kwargs
            )
        except TransportError as e:
            where = urlsplit(url).netloc
            raise StoreError(
                f"{server} {what} failed: no answer from {where} ({type(e).__name__}: {e}); "
                f"is {server} running and reachable?"
            ) from e

    @_retry_idempotent
    def upload(
        self, repository: str, branch: str, path: str, source: Path, *, if_absent: bool = False
    ) -> ObjectInfo:
        """Stream a local file to ``branch``; returns what lakeFS stored."""
        what = f"upload {repository}/{branch}/{path}"
        url = self._url(repository, f"branches/{quote(branch, safe='')}/objects", path)
        try:
            # A local file that cannot be read is no network fault: never retried.
            f = source.open("rb")
        except OSError as e:
            raise _unreadable(source, what, e) from e
        with f:
            try:
                size = os.fstat(f.fileno()).st_size
                # a small file in one read and one send, not a pair per block
                body: bytes | IO[bytes] = f.read() if size <= _SMALL_BODY else f
            except OSError as e:
                raise _unreadable(source, what, e) from e
            if isinstance(body, bytes):
                size = len(body)
            if not if_absent and self.presigned():
                stored = self._upload_presigned(repository, branch, path, body, size, what)
                if stored is not None:
                    return stored
                if not isinstance(body, bytes):  # refused: the same bytes through lakeFS
                    body.seek(0)
            headers = {
                **self._auth,
                "Content-Type": "application/octet-stream",
                "Content-Length": str(size),
            }
            if if_absent:
                headers["If-None-Match"] = "*"
            resp = self._request("POST", url, what, body=body, headers=headers)
        self._check(resp, what)
        stats = json.loads(resp.data)
        return ObjectInfo(
            path=path,
            size=int(stats.get("size_bytes") or 0),
            checksum=str(stats.get("checksum", "")),
            physical_address=str(stats.get("physical_address", "")),
        )

    def _upload_presigned(
        self, repository: str, branch: str, path: str, f: bytes | IO[bytes], size: int, what: str
    ) -> ObjectInfo | None:
        """Ask lakeFS where to put the bytes, PUT them there, then link them to ``path``.

        None if object storage refused the URL (expired, clock skew, a policy): the caller
        sends the bytes through lakeFS instead, as a refused pre-signed download does."""
        backing = self._url(repository, f"branches/{quote(branch, safe='')}/staging/backing", path)
        resp = self._request("GET", backing + "&presign=true", what)
        self._check(resp, what)
        location = json.loads(resp.data)
        try:
            put = self._request(
                "PUT",
                location["presigned_url"],
                what,
                headers={"Content-Length": str(size)},
                server="object storage",
                body=f,
            )
        except StoreError as e:
            # A server refusing a large body often answers 403 and closes while the body is
            # still on its way: the client sees a broken connection, not the answer.
            log.info("presigned_put_failed", path=path, error=str(e))
            return None
        if put.status in (400, 401, 403):
            log.info("presigned_url_refused", status=put.status, path=path, method="PUT")
            return None
        self._check(put, what, "object storage")
        etag = str(put.headers.get("ETag", "")).strip('"')
        metadata = {"staging": location, "checksum": etag, "size_bytes": size}
        resp = self._request(
            "PUT",
            backing,
            what,
            headers={**self._auth, "Content-Type": "application/json"},
            body=json.dumps(metadata).encode(),
        )
        self._check(resp, what)
        stats = json.loads(resp.data)
        return ObjectInfo(
            path=path,
            size=int(stats.get("size_bytes") or size),
            checksum=str(stats.get("checksum", "")),
            physical_address=_unsigned(location["presigned_url"]),
        )

    def upload_bytes(
        self, repository: str, branch: str, path: str, data: bytes, *, if_absent: bool = False
    ) -> None:
        what = f"upload {repository}/{branch}/{path}"
        url = self._url(repository, f"branches/{quote(branch, safe='')}/objects", path)
        headers = {**self._auth, "Content-Type": "application/octet-stream"}
        if if_absent:
            headers["If-None-Match"] = "*"
        try:
            resp = self._http.request("POST", url, body=data, headers=headers)
        except TransportError as e:
            raise StoreError(
                f"lakeFS {what} failed: no answer from {self._base} ({e}); whether it landed "
                "is unknown: read the object back before deciding again"
            ) from e
        self._check(resp, what)

    @_retry_idempotent
    def delete_objects(self, repository: str, branch: str, paths: Sequence[str]) -> None:
        for i in range(0, len(paths), MAX_DELETE_BATCH):
            batch = list(paths[i : i + MAX_DELETE_BATCH])
            result = self._call(
                f"delete {len(batch)} objects on {repository}/{branch}",
                self.objects.delete_objects,
                repository,
                branch,
                lakefs_sdk.PathList(paths=batch),
            )
            errors = [e for e in (result.errors or []) if e.status_code not in (404,)]
            if errors:
                raise StoreError(
                    f"lakeFS refused to delete {len(errors)} objects on {repository}/{branch}, "
                    f"e.g. {errors[0].path}: {errors[0].message}"
                )
