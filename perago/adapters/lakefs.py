"""The only module that talks to lakeFS.

The calls every publication makes (branches created, read and deleted, commits read and
made, the merge, first-parent history), object bytes (:mod:`perago.adapters.objects`) and
listings go over one libcurl engine as plain JSON: the generated ``lakefs_sdk`` costs about
four times the CPU per request (its models and urllib3; docs/benchmarks.md, (l)), and
buffers whole bodies in memory. The rarer calls keep the generated client. Every error is
translated into a :class:`perago.errors.StoreError` subclass.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar
from urllib.parse import quote, urlencode

import lakefs_sdk
import structlog
import urllib3
from lakefs_sdk.exceptions import ApiException
from pydantic import SecretStr

from perago.adapters.curl import CurlPool
from perago.adapters.http import HttpConfig
from perago.adapters.objects import ObjectBytes, error_for, unsigned
from perago.core.retry_policy import retrying
from perago.core.store import Commit, DownloadJob, ObjectInfo, UploadJob
from perago.errors import ConfigError, NotFoundError, StoreError

__all__ = ["LakeFSConnection", "LakeFSStore"]

T = TypeVar("T")
log = structlog.get_logger("perago.adapters.lakefs")
MAX_DELETE_BATCH = 1000


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, StoreError):
        return e.status in (429, 502, 503, 504) or e.status is None
    return isinstance(e, urllib3.exceptions.HTTPError | OSError)


#: Retries for calls that are safe to repeat (reads, deletes, idempotent creates).
_retry_idempotent = retrying(_is_transient)


def _translate(e: ApiException, what: str) -> StoreError:
    body = e.body if isinstance(e.body, str) else str(e.body or "")
    return error_for(e.status, str(e.reason or ""), body, f"lakeFS {what}")


def _check(status: int, data: bytes, what: str) -> None:
    if status >= 300:
        raise error_for(status, "", data[:300].decode(errors="replace"), what)


def _commit(c: dict[str, Any]) -> Commit:
    return Commit(
        id=c["id"],
        parents=tuple(c.get("parents") or ()),
        message=c.get("message") or "",
        metadata=dict(c.get("metadata") or {}),
        created=int(c.get("creation_date") or 0),
    )


def _part(name: str) -> str:
    """A repository, branch or ref as one segment of a URL path."""
    return quote(name, safe="")


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
    """A :class:`perago.core.store.VersionStore` backed by a lakeFS server."""

    def __init__(self, settings: LakeFSConnection) -> None:
        settings.require_lakefs_credentials()
        secret = settings.lakefs_secret_access_key.get_secret_value()
        http = HttpConfig.for_lakefs(
            settings.lakefs_api_url,
            settings.lakefs_access_key_id,
            secret,
            read_timeout=settings.http_timeout.total_seconds(),
        )
        config = lakefs_sdk.Configuration(
            host=http.base,
            username=settings.lakefs_access_key_id,
            password=secret,
            ssl_ca_cert=http.ca_file,  # the same CA file as the other two clients
        )
        config.connection_pool_maxsize = max(16, settings.transfer_parallelism * 2)
        self._client = lakefs_sdk.ApiClient(config)
        self._http = http
        self._timeout = (http.connect_timeout, http.read_timeout)
        self._base = http.base
        self._auth = dict(http.headers)
        self._curl = CurlPool(http)
        self._objects = ObjectBytes(
            self._curl,
            http,
            presigned=self.presigned,
            uploads_in_flight=settings.upload_parallelism,
        )
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
        self._objects.close()
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

    def _json(
        self,
        method: str,
        path: str,
        what: str,
        *,
        body: dict[str, Any] | None = None,
        idempotent: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """One call as plain JSON over the libcurl engine (``path`` under the API root).

        A status says what it always says (:func:`error_for`); retries are the caller's
        (``_retry_idempotent``, or none for the writes that move heads)."""
        headers = {**self._auth, "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        reply = self._curl.request(
            method,
            self._base + path,
            f"lakeFS {what}",
            headers=headers,
            body=data,
            idempotent=idempotent,
            timeout=timeout,
            retries_statuses=False,
        )
        _check(reply.status, reply.data, f"lakeFS {what}")
        if "json" not in reply.headers.get("content-type", ""):
            return reply.data.decode(errors="replace") or None  # a created branch's text
        return json.loads(reply.data)

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
        ref = self._json(
            "GET",
            f"/repositories/{_part(repository)}/branches/{_part(branch)}",
            f"get branch {repository}/{branch}",
        )
        return str(ref["commit_id"])

    @_retry_idempotent
    def get_commit(self, repository: str, ref: str) -> Commit:
        return _commit(
            self._json(
                "GET",
                f"/repositories/{_part(repository)}/commits/{_part(ref)}",
                f"get commit {repository}@{ref}",
            )
        )

    @_retry_idempotent
    def log(self, repository: str, ref: str, *, amount: int = 50) -> list[Commit]:
        """First-parent history of ``ref``, newest first."""
        query = urlencode({"amount": amount, "first_parent": "true", "limit": "true"})
        result = self._json(
            "GET",
            f"/repositories/{_part(repository)}/refs/{_part(ref)}/commits?{query}",
            f"log {repository}@{ref}",
        )
        return [_commit(c) for c in result["results"]]

    @_retry_idempotent
    def create_branch(
        self, repository: str, name: str, source: str, *, hidden: bool = False
    ) -> None:
        """``hidden``: left out of users' branch lists (lakeFS UI, ``lakectl branch list``)."""
        self._json(
            "POST",
            f"/repositories/{_part(repository)}/branches",
            f"create branch {repository}/{name}",
            body={"name": name, "source": source, "hidden": hidden},
        )

    @_retry_idempotent
    def delete_branch(self, repository: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            self._json(
                "DELETE",
                f"/repositories/{_part(repository)}/branches/{_part(name)}",
                f"delete branch {repository}/{name}",
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
            self._json(
                "POST",
                f"/repositories/{_part(repository)}/branches/{_part(branch)}/commits",
                f"commit on {repository}/{branch}",
                body={"message": message, "metadata": metadata},
                idempotent=False,
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
        result = self._json(
            "POST",
            f"/repositories/{_part(repository)}/refs/{_part(source)}/merge/{_part(destination)}",
            f"merge {source} into {repository}/{destination}",
            body={"message": message, "metadata": metadata},
            idempotent=False,
            timeout=timeout,
        )
        return str(result["reference"])

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
                        address, url = unsigned(address), address
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
        reply = self._curl.request("GET", f"{url}/objects/ls?{query}", what, headers=self._auth)
        _check(reply.status, reply.data, f"lakeFS {what}")
        page: dict[str, Any] = json.loads(reply.data)
        return page

    def download(
        self, repository: str, ref: str, path: str, dest: IO[bytes], *, url: str = ""
    ) -> None:
        """Stream one object into ``dest`` (rewound and truncated first, so retries are safe).

        With ``url`` (an :class:`ObjectInfo`'s ``download_url``) the bytes come straight
        from object storage or a local file; one refused or unreadable falls back to lakeFS.
        """
        self._objects.download(repository, ref, path, dest, url=url)

    def download_many(
        self, repository: str, ref: str, jobs: Iterable[DownloadJob], *, parallelism: int
    ) -> None:
        """Every job's object, ``parallelism`` at a time (:mod:`perago.adapters.objects`)."""
        self._objects.download_many(repository, ref, jobs, parallelism=parallelism)

    def upload(self, repository: str, branch: str, path: str, source: Path) -> ObjectInfo:
        """Stream a local file to ``branch``; returns what lakeFS stored."""
        return self._objects.upload(repository, branch, path, source)

    def upload_many(
        self, repository: str, branch: str, jobs: Iterable[UploadJob], *, parallelism: int
    ) -> None:
        """Every job's file to ``branch``, ``PERAGO_UPLOAD_PARALLELISM`` in flight (each
        cheap on libcurl's multi interface: the wait is lakeFS's or object storage's)."""
        self._objects.upload_many(repository, branch, jobs)

    def upload_bytes(
        self, repository: str, branch: str, path: str, data: bytes, *, if_absent: bool = False
    ) -> None:
        """A small object through lakeFS; ``if_absent``: created only if there is none (a
        conditional create is sent once: if no answer came, whether it landed is unknown)."""
        what = f"lakeFS upload {repository}/{branch}/{path}"
        url = (
            f"{self._base}/repositories/{quote(repository, safe='')}/branches/"
            f"{quote(branch, safe='')}/objects?path={quote(path, safe='')}"
        )
        headers = {**self._auth, "Content-Type": "application/octet-stream"}
        if if_absent:
            headers["If-None-Match"] = "*"
        reply = self._curl.request(
            "POST", url, what, headers=headers, body=data, idempotent=not if_absent
        )
        _check(reply.status, reply.data, what)

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
