"""Coordination store on DynamoDB conditional writes.

One item per key: partition key ``pk`` (a namespace, so several deployments can share a
table), sort key ``sk`` (the key), ``value`` (binary), ``generation`` (number). A write is an
``UpdateItem`` whose condition names the expected generation and which increments it
atomically; reads are strongly consistent. A delete turns the item into a tombstone
(``deleted``), keeping its generation; ``ttl`` is set on tombstones only when a
``tombstone_ttl`` is configured (the table's TTL attribute), and once DynamoDB purges a
tombstone that key's generations restart from 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from perago.coord.errors import CoordStoreError, PredicateFailedError
from perago.coord.s3 import retry_reads
from perago.coord.store import Versioned, check_key, check_prefix

__all__ = ["DynamoDBStore", "dynamodb_client"]

_NAMES = {"#v": "value", "#g": "generation", "#d": "deleted", "#t": "ttl"}


def dynamodb_client(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> Any:
    """A boto3 DynamoDB client without botocore retries (see :func:`perago.coord.s3.s3_client`)."""
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint_url or None,
        region_name=region or None,
        aws_access_key_id=access_key_id or None,
        aws_secret_access_key=secret_access_key or None,
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> int | None:
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


class DynamoDBStore:
    """Keys as items ``(namespace, key)`` of ``table``."""

    def __init__(
        self,
        client: Any,
        table: str,
        *,
        namespace: str = "perago",
        tombstone_ttl: timedelta | None = None,
    ) -> None:
        self._db = client
        self._table = table
        self._ns = namespace
        self._tombstone_ttl = tombstone_ttl

    def create_table(self) -> None:
        """Create the table (pay per request, TTL on ``ttl``) unless it exists."""
        try:
            self._db.create_table(
                TableName=self._table,
                KeySchema=[
                    {"AttributeName": "pk", "KeyType": "HASH"},
                    {"AttributeName": "sk", "KeyType": "RANGE"},
                ],
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                BillingMode="PAY_PER_REQUEST",
            )
        except ClientError as e:
            if _code(e) != "ResourceInUseException":
                raise self._error("create table", e) from e
            return
        except BotoCoreError as e:
            raise self._error("create table", e) from e
        try:
            self._db.get_waiter("table_exists").wait(
                TableName=self._table, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
            )
            self._db.update_time_to_live(
                TableName=self._table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"},
            )
        except (ClientError, BotoCoreError) as e:
            raise self._error("enable TTL on", e) from e

    def _error(self, what: str, e: Exception) -> CoordStoreError:
        status = _status(e) if isinstance(e, ClientError) else None
        return CoordStoreError(f"DynamoDB {what} table {self._table!r} failed: {e}", status=status)

    def _key(self, key: str) -> dict[str, Any]:
        return {"pk": {"S": self._ns}, "sk": {"S": key}}

    def _update(self, key: str, expression: str, condition: str, values: dict[str, Any]) -> int:
        try:
            r = self._db.update_item(
                TableName=self._table,
                Key=self._key(key),
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeNames={
                    n: v for n, v in _NAMES.items() if n in expression + condition
                },
                ExpressionAttributeValues=values,
                ReturnValues="UPDATED_NEW",
            )
        except ClientError as e:
            if _code(e) in ("ConditionalCheckFailedException", "TransactionConflictException"):
                raise PredicateFailedError(
                    f"coordination key {key!r} is not at the expected version: re-read it and "
                    "decide again"
                ) from e
            raise self._error(f"update {key!r} in", e) from e
        except BotoCoreError as e:
            raise self._error(f"update {key!r} in", e) from e
        return int(r["Attributes"]["generation"]["N"])

    def get(self, key: str) -> Versioned | None:
        check_key(key)

        def read() -> Any:
            try:
                return self._db.get_item(
                    TableName=self._table, Key=self._key(key), ConsistentRead=True
                )
            except (ClientError, BotoCoreError) as e:
                raise self._error(f"get {key!r} from", e) from e

        return _versioned(retry_reads(read).get("Item"))

    def set_if(self, key: str, value: bytes, expected: str | None) -> str:
        check_key(key)
        if expected is None:
            gen = self._update(
                key,
                "SET #v = :v, #g = if_not_exists(#g, :zero) + :one REMOVE #d, #t",
                "attribute_not_exists(pk) OR #d = :true",
                {
                    ":v": {"B": value},
                    ":zero": {"N": "0"},
                    ":one": {"N": "1"},
                    ":true": {"BOOL": True},
                },
            )
        else:
            gen = self._update(
                key,
                "SET #v = :v, #g = #g + :one",
                "#g = :expected AND attribute_not_exists(#d)",
                {":v": {"B": value}, ":one": {"N": "1"}, ":expected": _number(key, expected)},
            )
        return str(gen)

    def delete_if(self, key: str, expected: str) -> None:
        check_key(key)
        values: dict[str, Any] = {
            ":one": {"N": "1"},
            ":true": {"BOOL": True},
            ":expected": _number(key, expected),
        }
        expression = "SET #d = :true, #g = #g + :one"
        if self._tombstone_ttl is not None:
            expression += ", #t = :ttl"
            values[":ttl"] = {"N": str(int(time.time() + self._tombstone_ttl.total_seconds()))}
        self._update(
            key, expression + " REMOVE #v", "#g = :expected AND attribute_not_exists(#d)", values
        )

    def scan(self, prefix: str) -> Iterator[tuple[str, Versioned]]:
        check_prefix(prefix)
        condition = "pk = :ns" + (" AND begins_with(sk, :p)" if prefix else "")
        values: dict[str, Any] = {":ns": {"S": self._ns}}
        if prefix:
            values[":p"] = {"S": prefix}
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "KeyConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "ConsistentRead": True,
            }
            if start:
                kwargs["ExclusiveStartKey"] = start

            def page(kw: dict[str, Any] = kwargs) -> Any:
                try:
                    return self._db.query(**kw)
                except (ClientError, BotoCoreError) as e:
                    raise self._error(f"query {prefix!r} in", e) from e

            r = retry_reads(page)
            for item in r.get("Items", []):
                found = _versioned(item)
                if found is not None:
                    yield str(item["sk"]["S"]), found
            start = r.get("LastEvaluatedKey")
            if not start:
                return


def _versioned(item: dict[str, Any] | None) -> Versioned | None:
    if not item or item.get("deleted", {}).get("BOOL") or "value" not in item:
        return None
    return Versioned(bytes(item["value"]["B"]), str(item["generation"]["N"]))


def _number(key: str, version: str) -> dict[str, str]:
    if not version.isdigit():
        raise PredicateFailedError(
            f"{version!r} is not a DynamoDB coordination version of {key!r} (want a generation)"
        )
    return {"N": str(int(version))}
