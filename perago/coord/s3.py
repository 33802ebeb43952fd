"""Coordination store on S3 conditional writes (``If-None-Match: *`` and ``If-Match``).

One object per key under ``prefix``. The body starts with a header line naming the key's
generation, which makes every write's ETag unique: a plain ETag would repeat when a value
repeats, and an ``If-Match`` on it would then succeed against a different write (ABA). The
version is ``<generation>:<etag>``. A delete is a conditional write of a tombstone, so the
generation survives it; tombstones stay in the bucket (a few bytes each): do not let a
lifecycle rule expire objects under the prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from perago.coord.errors import CoordStoreError, PredicateFailedError
from perago.coord.store import Versioned, check_key, check_prefix
from perago.core.retry_policy import coordination_reads

__all__ = ["S3Store", "retry_reads", "s3_client"]

T = TypeVar("T")

_LOST = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409", "404"}


def s3_client(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> Any:
    """A boto3 S3 client; without keys boto3's default credential chain applies.

    botocore's own retries are off: a retried conditional write that had landed would come
    back 412 and turn a win into a reported loss. Reads are retried here instead.
    """
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or None,
        region_name=region or None,
        aws_access_key_id=access_key_id or None,
        aws_secret_access_key=secret_access_key or None,
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def encode(generation: int, value: bytes | None) -> bytes:
    """``b"<gen> v\\n" + value`` for a value, ``b"<gen> t\\n"`` for a tombstone."""
    return b"%d %s\n" % (generation, b"t" if value is None else b"v") + (value or b"")


def decode(body: bytes, where: str) -> tuple[int, bytes | None]:
    head, sep, rest = body.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 2 or not parts[0].isdigit() or parts[1] not in (b"v", b"t"):
        raise CoordStoreError(
            f"{where} is not a Perago coordination object; keep other writers out of the prefix"
        )
    return int(parts[0]), (None if parts[1] == b"t" else rest)


class S3Store:
    """Keys as objects ``<prefix><key>`` in ``bucket``, written with S3 conditional headers."""

    def __init__(self, client: Any, bucket: str, *, prefix: str = "perago/coord/") -> None:
        self._s3 = client
        self._bucket = bucket
        self._prefix = prefix

    def _where(self, key: str) -> str:
        return f"s3://{self._bucket}/{self._prefix}{key}"

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(Bucket=self._bucket, **kwargs)
        except ClientError as e:
            if _code(e) in _LOST:
                raise
            raise CoordStoreError(f"S3 {what} failed: {_code(e)} {e}", status=_status(e)) from e
        except BotoCoreError as e:
            raise CoordStoreError(f"S3 {what} failed: {e}; is the endpoint reachable?") from e

    def _read(self, key: str) -> tuple[int, bytes | None, str] | None:
        """(generation, value or None for a tombstone, etag), or None if there is no object."""
        return retry_reads(lambda: self._read_once(key))

    def _read_once(self, key: str) -> tuple[int, bytes | None, str] | None:
        try:
            r = self._call(f"get {self._where(key)}", self._s3.get_object, Key=self._prefix + key)
        except ClientError as e:
            if _code(e) in ("NoSuchKey", "404"):
                return None
            raise CoordStoreError(
                f"S3 get {self._where(key)} failed: {e}", status=_status(e)
            ) from e
        with r["Body"] as body:
            data = body.read()
        gen, value = decode(data, self._where(key))
        return gen, value, str(r["ETag"]).strip('"')

    def _put(self, key: str, body: bytes, **condition: str) -> str:
        try:
            r = self._call(
                f"put {self._where(key)}",
                self._s3.put_object,
                Key=self._prefix + key,
                Body=body,
                **condition,
            )
        except ClientError as e:
            raise PredicateFailedError(
                f"coordination key {key!r} changed (S3 said {_code(e)}): re-read it and "
                "decide again"
            ) from e
        return str(r["ETag"]).strip('"')

    def get(self, key: str) -> Versioned | None:
        check_key(key)
        found = self._read(key)
        if found is None:
            return None
        gen, value, etag = found
        return None if value is None else Versioned(value, f"{gen}:{etag}")

    def set_if(self, key: str, value: bytes, expected: str | None) -> str:
        check_key(key)
        if expected is None:
            found = self._read(key)
            if found is None:
                gen = 1
                etag = self._put(key, encode(gen, value), IfNoneMatch="*")
            elif found[1] is None:  # a tombstone: continue its generation
                gen = found[0] + 1
                etag = self._put(key, encode(gen, value), IfMatch=_quoted(found[2]))
            else:
                raise PredicateFailedError(
                    f"coordination key {key!r} exists (version {found[0]}), expected absent: "
                    "re-read it and decide again"
                )
        else:
            old, old_etag = _parse(key, expected)
            gen = old + 1
            etag = self._put(key, encode(gen, value), IfMatch=_quoted(old_etag))
        return f"{gen}:{etag}"

    def delete_if(self, key: str, expected: str) -> None:
        check_key(key)
        old, old_etag = _parse(key, expected)
        self._put(key, encode(old + 1, None), IfMatch=_quoted(old_etag))

    def scan(self, prefix: str) -> Iterator[tuple[str, Versioned]]:
        check_prefix(prefix)
        for key in retry_reads(lambda: self._list(prefix)):
            current = self.get(key)
            if current is not None:
                yield key, current

    def _list(self, prefix: str) -> list[str]:
        paginator = self._s3.get_paginator("list_objects_v2")
        keys: list[str] = []
        try:
            for page in paginator.paginate(Bucket=self._bucket, Prefix=self._prefix + prefix):
                keys.extend(str(o["Key"])[len(self._prefix) :] for o in page.get("Contents", []))
        except (ClientError, BotoCoreError) as e:
            raise CoordStoreError(
                f"S3 list s3://{self._bucket}/{self._prefix}{prefix} failed: {e}",
                status=_status(e) if isinstance(e, ClientError) else None,
            ) from e
        return sorted(keys)


def retry_reads(read: Callable[[], T]) -> T:
    """Repeat a read after a transient failure (reads are safe to repeat; writes are not),
    on the coordination store's schedule (perago.core.retry_policy.coordination_reads)."""
    return coordination_reads(_transient)(read)


def _transient(e: BaseException) -> bool:
    """No answer, a 5xx or a 429: worth another read. A 4xx will not change."""
    return isinstance(e, CoordStoreError) and (
        e.status is None or e.status >= 500 or e.status == 429
    )


def _quoted(etag: str) -> str:
    return f'"{etag}"'


def _parse(key: str, version: str) -> tuple[int, str]:
    gen, sep, etag = version.partition(":")
    if not sep or not gen.isdigit() or not etag:
        raise PredicateFailedError(
            f"{version!r} is not an S3 coordination version of {key!r} (want <generation>:<etag>)"
        )
    return int(gen), etag


def _status(e: ClientError) -> int | None:
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None
