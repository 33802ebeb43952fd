"""The coordination contract against every real backend.

lakeFS objects (the running stack), S3 conditional writes on versitygw (the production
profile's S3 server: it checks If-Match and If-None-Match itself and serves racing requests
concurrently), DynamoDB Local, and put-and-verify on versitygw through a client that may
only PUT, GET, LIST and DELETE.
Each test gets its own namespace (root, prefix or partition) on session-wide servers.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from perago.adapters.lakefs import LakeFSStore
from perago.coord import CoordStore, PredicateFailedError, Versioned, build_store
from perago.coord.dynamodb import DynamoDBStore, dynamodb_client
from perago.coord.lakefs_objects import DEFAULT_BRANCH, LakeFSObjectsStore
from perago.coord.put_and_verify import PutAndVerify, PutAndVerifyStore, RWLock, S3Objects
from perago.coord.s3 import S3Store, s3_client
from tests.coord_contract import CoordContract, FakeClock

from .coord_servers import S3_KEYS, dynamodb_endpoint, moto_endpoint, s3_endpoint

pytestmark = pytest.mark.integration
SERVERS = (s3_endpoint, moto_endpoint, dynamodb_endpoint)  # session fixtures, used by name below

KEYS = {**S3_KEYS, "region": "us-east-1"}


def _ns() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


# -- lakeFS objects (the default) -----------------------------------------------------------


@pytest.fixture(scope="module")
def coord_repo(store: LakeFSStore) -> Iterator[str]:
    name = f"coord-{uuid.uuid4().hex[:10]}"
    store.create_repository(name)
    yield name
    try:
        store.delete_repository(name)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


class TestLakeFSObjects(CoordContract):
    @pytest.fixture
    def coord(self, store: LakeFSStore, coord_repo: str) -> Iterator[CoordStore]:
        yield LakeFSObjectsStore(store, coord_repo, root=f"_perago/{_ns()}")


def test_lakefs_store_writes_uncommitted_objects_on_its_own_branch(
    store: LakeFSStore, coord_repo: str
) -> None:
    root = f"_perago/{_ns()}"
    coord = LakeFSObjectsStore(store, coord_repo, root=root)
    head = store.branch_head(coord_repo, "main")
    v = coord.set_if("leases/x", b"hello", None)
    assert DEFAULT_BRANCH in dict(store.list_branches(coord_repo))
    # hidden: users' branch lists (lakeFS UI, lakectl branch list) do not show it
    assert DEFAULT_BRANCH not in {b.id for b in store.branches.list_branches(coord_repo).results}
    assert store.branch_head(coord_repo, DEFAULT_BRANCH) == head  # nothing committed
    assert store.has_uncommitted(coord_repo, DEFAULT_BRANCH)
    assert not list(store.list_objects(coord_repo, "main", root))
    buf = io.BytesIO()
    store.download(coord_repo, DEFAULT_BRANCH, f"{root}/leases/x/g{int(v):020d}", buf)
    assert buf.getvalue() == b"vhello"


def test_lakefs_store_prunes_old_generations(store: LakeFSStore, coord_repo: str) -> None:
    root = f"_perago/{_ns()}"
    clock = FakeClock()
    coord = LakeFSObjectsStore(
        store, coord_repo, root=root, keep=3, prune_grace=timedelta(seconds=60), clock=clock.now
    )
    v = coord.set_if("k", b"0", None)
    for i in range(1, 10):
        v = coord.set_if("k", str(i).encode(), v)
    paths = [o.path for o in store.list_objects(coord_repo, DEFAULT_BRANCH, f"{root}/k/")]
    assert len(paths) == 10  # not old enough
    clock.sleep(61)
    v = coord.set_if("k", b"10", v)
    paths = [o.path for o in store.list_objects(coord_repo, DEFAULT_BRANCH, f"{root}/k/")]
    assert [int(p.rsplit("/g", 1)[1]) for p in paths] == [9, 10, 11]
    assert coord.get("k") == Versioned(b"10", v)


def test_lakefs_store_via_factory(store: LakeFSStore, coord_repo: str) -> None:
    coord = build_store(
        "lakefs", {"repository": coord_repo, "root": f"_perago/{_ns()}"}, lakefs=store
    )
    v = coord.set_if("k", b"x", None)
    assert coord.get("k") == Versioned(b"x", v)


# -- S3 conditional writes on versitygw -------------------------------------------------------


@pytest.fixture(scope="session")
def s3(s3_endpoint: str) -> Any:
    return s3_client(endpoint_url=s3_endpoint, **KEYS)


@pytest.fixture(scope="session")
def bucket(s3: Any) -> str:
    name = f"perago-coord-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=name)
    return name


class TestS3(CoordContract):
    @pytest.fixture
    def coord(self, s3: Any, bucket: str) -> Iterator[CoordStore]:
        yield S3Store(s3, bucket, prefix=f"{_ns()}/")

    def test_scan_is_sorted_and_prefix_isolated(
        self, coord: CoordStore, moto_endpoint: str
    ) -> None:
        """On moto: versitygw's posix backend keeps objects as files, so it cannot hold a key
        and a key under it (``s/a`` and ``s/a/x``: ObjectParentIsFile), which S3 can."""
        client = s3_client(endpoint_url=moto_endpoint, **KEYS)
        name = f"perago-coord-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=name)
        super().test_scan_is_sorted_and_prefix_isolated(S3Store(client, name, prefix=f"{_ns()}/"))


def test_s3_objects_carry_their_generation_and_deletes_are_tombstones(s3: Any, bucket: str) -> None:
    prefix = f"{_ns()}/"
    coord = S3Store(s3, bucket, prefix=prefix)
    v1 = coord.set_if("k", b"x", None)
    coord.delete_if("k", v1)
    body = s3.get_object(Bucket=bucket, Key=prefix + "k")["Body"].read()
    assert body == b"2 t\n"
    # the server also enforces If-Match on DeleteObject (a stale ETag is refused)
    etag = v1.split(":", 1)[1]
    with pytest.raises(s3.exceptions.ClientError, match="PreconditionFailed"):
        s3.delete_object(Bucket=bucket, Key=prefix + "k", IfMatch=f'"{etag}"')


def test_s3_store_via_factory(s3_endpoint: str, bucket: str) -> None:
    coord = build_store(
        "s3",
        {"endpoint_url": s3_endpoint, "bucket": bucket, "prefix": f"{_ns()}/", **KEYS},
        lakefs=None,
    )
    v = coord.set_if("k", b"x", None)
    assert coord.get("k") == Versioned(b"x", v)


# -- DynamoDB Local --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dynamodb(dynamodb_endpoint: str) -> Any:
    return dynamodb_client(endpoint_url=dynamodb_endpoint, **KEYS)


@pytest.fixture(scope="session")
def table(dynamodb: Any) -> str:
    name = "perago-coord"
    DynamoDBStore(dynamodb, name).create_table()
    DynamoDBStore(dynamodb, name).create_table()  # idempotent
    return name


class TestDynamoDB(CoordContract):
    @pytest.fixture
    def coord(self, dynamodb: Any, table: str) -> Iterator[CoordStore]:
        yield DynamoDBStore(dynamodb, table, namespace=_ns())


def test_dynamodb_store_via_factory(dynamodb_endpoint: str) -> None:
    coord = build_store(
        "dynamodb",
        {
            "endpoint_url": dynamodb_endpoint,
            "table": "perago-coord-factory",
            "create_table": "true",
            **KEYS,
        },
        lakefs=None,
    )
    v = coord.set_if("k", b"x", None)
    assert coord.get("k") == Versioned(b"x", v)


# -- put-and-verify on plain S3 operations ---------------------------------------------------


class PlainS3:
    """An S3 client that allows only unconditional PUT, GET, LIST and DELETE."""

    _ALLOWED = {"put_object", "get_object", "delete_object", "get_paginator", "exceptions"}
    _CONDITIONS = {"IfMatch", "IfNoneMatch", "IfModifiedSince", "IfUnmodifiedSince"}

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        if name not in self._ALLOWED:
            raise AssertionError(f"put-and-verify must not call S3 {name}")
        target = getattr(self._client, name)
        if name == "exceptions":
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            assert not self._CONDITIONS & set(kwargs), f"{name} with a condition: {kwargs}"
            if name == "get_paginator":
                assert args == ("list_objects_v2",), args
            self.calls.add(name)
            return target(*args, **kwargs)

        return call


@pytest.fixture(scope="session")
def plain_s3(s3: Any) -> PlainS3:
    return PlainS3(s3)


class TestPutAndVerifyS3(CoordContract):
    @pytest.fixture
    def coord(self, plain_s3: PlainS3, bucket: str) -> Iterator[CoordStore]:
        yield PutAndVerifyStore(S3Objects(plain_s3, bucket), root=_ns())


def test_put_and_verify_used_only_plain_operations(plain_s3: PlainS3, bucket: str) -> None:
    coord = PutAndVerifyStore(S3Objects(plain_s3, bucket), root=_ns())
    v = coord.set_if("k", b"x", None)
    coord.delete_if("k", v)
    assert plain_s3.calls <= {"put_object", "get_object", "delete_object", "get_paginator"}
    assert {"put_object", "delete_object", "get_paginator"} <= plain_s3.calls


def test_rw_lock_on_s3(plain_s3: PlainS3, bucket: str) -> None:
    engine = PutAndVerify(S3Objects(plain_s3, bucket), attempts=2)
    lock = RWLock(engine, f"{_ns()}/archive")
    readers = [lock.try_lock_read(), lock.try_lock_read()]
    with pytest.raises(PredicateFailedError):
        lock.try_lock_write()
    for r in readers:
        lock.unlock(r)
    writer = lock.try_lock_write()
    with pytest.raises(PredicateFailedError):
        lock.try_lock_read()
    with pytest.raises(PredicateFailedError):
        lock.try_lock_write()
    lock.unlock(writer)
    lock.unlock(lock.try_lock_read())


def test_put_and_verify_via_factory(s3_endpoint: str, bucket: str) -> None:
    coord = build_store(
        "put_and_verify",
        {"endpoint_url": s3_endpoint, "bucket": bucket, "prefix": _ns(), **KEYS},
        lakefs=None,
    )
    v = coord.set_if("k", b"x", None)
    assert coord.get("k") == Versioned(b"x", v)
