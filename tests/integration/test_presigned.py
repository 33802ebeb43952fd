"""Pre-signed transfers on the S3 stack variant (versitygw and a lakeFS on it).

Bytes must go straight between the workspace and object storage, lakeFS answering metadata
calls only; a publication and a materialization must carry the same bytes as through lakeFS;
the content cache must recognise what a pre-signed upload put there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from perago.adapters.curl import CurlPool, Transfer
from perago.adapters.http import HttpConfig
from perago.adapters.lakefs import LakeFSStore
from perago.config import Settings, load
from perago.core.orchestrator import TaskSnapshot
from perago.core.store import ObjectInfo
from perago.errors import ConfigError, StoreError
from perago.publish import AttemptIdentity, Publisher, WorkspaceTarget
from perago.testing import StaticLedger
from perago.workspace import ContentCache, Diff, materialize
from perago_dev.s3_stack import BUCKET, S3Stack, s3_stack
from tests.clock import tick_past

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Stack]:
    with s3_stack(tmp_path_factory.mktemp("s3-stack")) as stack:
        yield stack


class RecordingPool(CurlPool):
    """The real engine, recording each request it sends (method, URL), after ``spoil``."""

    def __init__(self, http: HttpConfig, spoil: Callable[[str], str] = lambda url: url) -> None:
        super().__init__(http)
        self.requests: list[tuple[str, str]] = []
        self._spoil = spoil

    def run(self, transfers: Iterable[Transfer], **kwargs: Any) -> None:
        def recorded(t: Transfer) -> Transfer:
            begin = t.begin

            def begin_recorded() -> Callable[[bytes], object]:
                sink = begin()  # a transfer sets its request before the engine reads it
                t.url = self._spoil(t.url)
                self.requests.append((t.method, t.url))
                return sink

            t.begin = begin_recorded  # type: ignore[method-assign]
            return t

        super().run((recorded(t) for t in transfers), **kwargs)


class Recording(LakeFSStore):
    """The real store, recording every HTTP request of its byte transfers and listings."""

    def __init__(self, settings: Settings, spoil: Callable[[str], str] = lambda url: url) -> None:
        super().__init__(settings)
        pool = RecordingPool(self._http, spoil)
        self._curl.close()
        self._curl = self._objects._pool = pool
        self.requests = pool.requests


def _identity(task: str) -> tuple[AttemptIdentity, StaticLedger]:
    me = AttemptIdentity("wf-presign", "step", task, retry_count=0, poll_count=1, task_type="tt")
    snapshot = TaskSnapshot(task, "tt", "step", "wf-presign", "IN_PROGRESS", 0, 1, "w", 60, {})
    return me, StaticLedger(snapshot)


def test_bytes_go_straight_to_object_storage_both_ways(s3: S3Stack, tmp_path: Path) -> None:
    store = Recording(load(s3.env()))
    assert store.presigned()
    store.create_repository("presign-both")
    out = tmp_path / "out"
    files = {"a.bin": os.urandom(70_000), "d/e/b.bin": os.urandom(3), "empty.txt": b""}
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    tick_past(out)  # a file written in the upload's clock tick is never adopted
    me, ledger = _identity("t-upload")
    cache = ContentCache(tmp_path / "cache", max_bytes=1 << 24)
    publisher = Publisher(store, ledger, worker_id="w", cache=cache)
    base = store.branch_head("presign-both", "main")
    ref = publisher.publish(
        me, WorkspaceTarget("presign-both", "main", base), "data/", out, Diff(added=tuple(files))
    ).ref
    assert cache.adopt(out) == len(files)  # as the worker does once the attempt is reported
    lakefs_host = s3.lakefs_endpoint
    puts = [u for m, u in store.requests if m == "PUT" and u.startswith(s3.s3_endpoint)]
    assert len(puts) == len(files)  # each file's bytes: one PUT to S3
    # ...and no data file through lakeFS's objects endpoint (scope markers, a few bytes of
    # metadata each, still are)
    assert not [u for m, u in store.requests if m == "POST" and "/objects?path=data" in u]
    # lakeFS stores them on S3, with the bytes' MD5 as checksum
    listed = {o.path: o for o in store.list_objects("presign-both", ref, "data/")}
    for rel, data in files.items():
        obj = listed[f"data/{rel}"]
        assert obj.physical_address.startswith("s3://perago-data/presign-both/")
        assert obj.checksum == hashlib.md5(data, usedforsecurity=False).hexdigest()

    # Read back without the cache: from S3, through pre-signed URLs in the listing.
    store.requests.clear()
    first = tmp_path / "first"
    materialize(store, "presign-both", ref, "data/", first, parallelism=4)
    for rel, data in files.items():
        assert (first / rel).read_bytes() == data
    gets = [u for m, u in store.requests if m == "GET"]
    assert len([u for u in gets if u.startswith(s3.s3_endpoint)]) == len(files)
    assert not [u for u in gets if u.startswith(lakefs_host) and "/objects?" in u]

    # With the cache that adopted the uploads: no transfer at all (same address both ways).
    store.requests.clear()
    again = tmp_path / "again"
    materialize(store, "presign-both", ref, "data/", again, parallelism=4, cache=cache)
    assert {rel: (again / rel).read_bytes() for rel in files} == files
    assert not [u for m, u in store.requests if u.startswith(s3.s3_endpoint)]


class _Job:
    """A download job into a plain file (perago.core.store.DownloadJob)."""

    def __init__(self, obj: ObjectInfo, dest: Path) -> None:
        self.obj, self.dest, self.ok = obj, dest, False
        self.file: BinaryIO | None = None

    def open(self) -> BinaryIO:
        self.file = self.dest.open("w+b")
        return self.file

    def close(self, ok: bool) -> None:
        assert self.file is not None
        self.file.close()
        self.ok = ok


def _key(obj: ObjectInfo) -> str:
    """The object's key in the bucket, from its physical address."""
    prefix = f"s3://{BUCKET}/"
    assert obj.physical_address.startswith(prefix), obj.physical_address
    return obj.physical_address[len(prefix) :]


def _refusals(s3: S3Stack, key: str, action: str) -> int:
    """How many requests for ``key`` the S3 server refused with 403, by its access log."""
    lines = s3.access_log.read_text(errors="replace").splitlines()
    return sum(f" s3_{action} {key} " in line and " 403 " in line for line in lines)


def test_an_expired_presigned_url_falls_back_to_lakefs(s3: S3Stack, tmp_path: Path) -> None:
    """The S3 server checks a URL's expiry as S3 does: an expired one is refused (403) and the
    bytes come through lakeFS instead, one by one and in a batch."""
    import boto3
    from botocore.config import Config

    store = LakeFSStore(load(s3.env()))
    store.create_repository("presign-expired")
    src = tmp_path / "x.bin"
    src.write_bytes(b"through lakeFS after all")
    store.upload("presign-expired", "main", "x.bin", src)
    [stored] = store.list_objects("presign-expired", "main", "")
    client = boto3.client(
        "s3",
        endpoint_url=s3.s3_endpoint,
        aws_access_key_id=s3.s3_access_key_id,
        aws_secret_access_key=s3.s3_secret_access_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"),
    )
    params = {"Bucket": BUCKET, "Key": _key(stored)}
    expired = client.generate_presigned_url("get_object", Params=params, ExpiresIn=1)
    deadline = time.monotonic() + 10
    while True:  # until the server itself says it expired
        try:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(expired).close()
        except urllib.error.HTTPError as e:
            assert e.code == 403
            break
        assert time.monotonic() < deadline, "the URL did not expire within 10 s"
        time.sleep(0.2)
    refused = _refusals(s3, _key(stored), "GetObject")

    dest = tmp_path / "dest.bin"
    with dest.open("wb") as f:
        store.download("presign-expired", "main", "x.bin", f, url=expired)
    assert dest.read_bytes() == b"through lakeFS after all"
    # the same in a batch (libcurl): the refused URL's body never reaches the file
    job = _Job(ObjectInfo("x.bin", 24, "", download_url=expired), tmp_path / "batch.bin")
    store.download_many("presign-expired", "main", [job], parallelism=2)
    assert job.ok and (tmp_path / "batch.bin").read_bytes() == b"through lakeFS after all"
    assert _refusals(s3, _key(stored), "GetObject") == refused + 2


class Tampering(Recording):
    """Every pre-signed URL lakeFS hands out arrives with a wrong signature, as after a key
    rotation: the S3 server refuses it (403 SignatureDoesNotMatch)."""

    def __init__(self, settings: Settings, s3_endpoint: str) -> None:
        self._s3 = s3_endpoint
        super().__init__(settings, self._spoil)

    def _spoil(self, url: str) -> str:
        if not url.startswith(self._s3):
            return url
        return re.sub(r"X-Amz-Signature=[0-9a-f]+", "X-Amz-Signature=" + "0" * 64, url)

    def list_objects(self, *args: Any, **kwargs: Any) -> Iterator[ObjectInfo]:
        for obj in super().list_objects(*args, **kwargs):
            yield dataclasses.replace(obj, download_url=self._spoil(obj.download_url))


def test_a_refused_presigned_url_falls_back_to_lakefs_both_ways(
    s3: S3Stack, tmp_path: Path
) -> None:
    store = Tampering(load(s3.env()), s3.s3_endpoint)
    assert store.presigned()
    store.create_repository("presign-refused")
    files = {"small.bin": os.urandom(100), "big.bin": os.urandom(3 << 20)}
    for rel, data in files.items():
        (tmp_path / rel).write_bytes(data)
        assert store.upload("presign-refused", "main", rel, tmp_path / rel).size == len(data)
    puts = [u for m, u in store.requests if m == "PUT" and u.startswith(s3.s3_endpoint)]
    assert len(puts) == len(files)  # each tried its pre-signed URL first...
    posts = [u for m, u in store.requests if m == "POST" and "/objects?path=" in u]
    assert len(posts) == len(files)  # ...then went through lakeFS
    ref = store.commit("presign-refused", "main", message="up", metadata={}).id
    listed = {o.path: o for o in store.list_objects("presign-refused", ref, "")}
    assert {p: o.size for p, o in listed.items()} == {p: len(d) for p, d in files.items()}

    # Read back: the listing's spoiled URLs are refused, lakeFS serves the bytes.
    store.requests.clear()
    materialize(store, "presign-refused", ref, "", tmp_path / "out", parallelism=2)
    assert {rel: (tmp_path / "out" / rel).read_bytes() for rel in files} == files
    for obj in listed.values():
        assert _refusals(s3, _key(obj), "PutObject") == 0  # lakeFS wrote it, not a URL
        assert _refusals(s3, _key(obj), "GetObject") >= 1


@pytest.fixture
def local_blockstore(stack_env: dict[str, str]) -> None:
    from perago_dev.stack import info

    if info().profile != "embedded":
        pytest.skip("about lakeFS's local blockstore: the embedded profile's")


@pytest.mark.usefixtures("local_blockstore")
def test_presign_on_is_refused_where_lakefs_cannot_presign(settings: Settings) -> None:
    """The default stack's local blockstore cannot pre-sign: auto sends bytes through lakeFS,
    on is a configuration error that says what to do."""
    env = {
        "PERAGO_LAKEFS_ENDPOINT": settings.lakefs_endpoint,
        "PERAGO_LAKEFS_ACCESS_KEY_ID": settings.lakefs_access_key_id,
        "PERAGO_LAKEFS_SECRET_ACCESS_KEY": settings.lakefs_secret_access_key.get_secret_value(),
    }
    assert not LakeFSStore(load(env)).presigned()
    with pytest.raises(ConfigError, match="cannot pre-sign URLs on its local blockstore"):
        LakeFSStore(load({**env, "PERAGO_PRESIGN": "on"})).presigned()


def test_presign_off_sends_every_byte_through_lakefs(s3: S3Stack, tmp_path: Path) -> None:
    store = Recording(load({**s3.env(), "PERAGO_PRESIGN": "off"}))
    store.create_repository("presign-off")
    src = tmp_path / "x.bin"
    src.write_bytes(b"via lakeFS")
    stored = store.upload("presign-off", "main", "x.bin", src)
    assert stored.physical_address.startswith("s3://")
    [listed] = store.list_objects("presign-off", "main", "", direct=True)
    assert listed.download_url == "" and listed.physical_address == stored.physical_address
    materialize(store, "presign-off", "main", "", tmp_path / "dest", parallelism=2)
    assert (tmp_path / "dest" / "x.bin").read_bytes() == b"via lakeFS"
    assert not [u for _, u in store.requests if u.startswith(s3.s3_endpoint)]


@pytest.mark.usefixtures("local_blockstore")
def test_a_worker_beside_lakefs_reads_its_local_blockstore_directly(
    settings: Settings, stack_env: dict[str, str], tmp_path: Path
) -> None:
    """PERAGO_LAKEFS_LOCAL_BLOCKSTORE: objects under that folder are copied from it, never
    fetched through lakeFS; an object whose file is gone is read through lakeFS instead; an
    address outside the folder is never read directly."""
    from perago_dev.stack import info

    block = info().stack_dir / "data" / "lakefs" / "block"
    store = Recording(load({**stack_env, "PERAGO_LAKEFS_LOCAL_BLOCKSTORE": str(block)}))
    repo = f"direct-{os.getpid()}-{os.urandom(3).hex()}"
    store.create_repository(repo)
    try:
        src = tmp_path / "src"
        files = {"a.bin": os.urandom(5000), "b/c.bin": os.urandom(7)}
        for rel, data in files.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
            store.upload(repo, "main", f"d/{rel}", src / rel)
        listed = list(store.list_objects(repo, "main", "d/", direct=True))
        assert all(o.download_url.startswith(f"file://{block.resolve()}/") for o in listed)
        store.requests.clear()
        materialize(store, repo, "main", "d/", tmp_path / "out", parallelism=2)
        assert {rel: (tmp_path / "out" / rel).read_bytes() for rel in files} == files
        assert not [u for m, u in store.requests if m == "GET" and "/objects?" in u]
        # A file that is gone (a garbage collection on lakeFS's side): through lakeFS.
        gone = next(o for o in listed if o.path == "d/b/c.bin")
        Path(gone.download_url[len("file://") :]).rename(tmp_path / "moved")
        try:
            dest = tmp_path / "again.bin"
            store.requests.clear()
            with dest.open("wb") as f, pytest.raises(StoreError):
                store.download(repo, "main", gone.path, f, url=gone.download_url)
            # asked lakeFS, which cannot serve it either: an error, not a silent empty file
            assert [m for m, u in store.requests if "/objects?" in u][:1] == ["GET"]
        finally:
            (tmp_path / "moved").rename(gone.download_url[len("file://") :])
        # Outside the folder: never read directly.
        elsewhere = Recording(load({**stack_env, "PERAGO_LAKEFS_LOCAL_BLOCKSTORE": str(tmp_path)}))
        assert [
            o.download_url for o in elsewhere.list_objects(repo, "main", "d/", direct=True)
        ] == [
            "",
            "",
        ]
    finally:
        store.delete_repository(repo)
