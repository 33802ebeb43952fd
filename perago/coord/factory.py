"""Build the configured coordination store.

Options are plain strings named like the settings they come from: option ``bucket`` is
``PERAGO_COORD_BUCKET``. An empty string counts as unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from perago.coord.store import CoordStore
from perago.errors import ConfigError

if TYPE_CHECKING:
    from perago.adapters.lakefs import LakeFSStore

__all__ = ["KINDS", "OPTIONS", "build_store"]

_AWS = ("endpoint_url", "region", "access_key_id", "secret_access_key")

#: Every backend's options; the first ``required`` ones must be set.
OPTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "lakefs": (("repository",), ("branch", "root", "source_branch")),
    "s3": (("bucket",), ("prefix", *_AWS)),
    "put_and_verify": (("bucket",), ("prefix", *_AWS)),
    "dynamodb": (("table",), ("namespace", "create_table", *_AWS)),
    "memory": ((), ()),
}
KINDS = tuple(OPTIONS)


def _env(name: str) -> str:
    return f"PERAGO_COORD_{name.upper()}"


def build_store(kind: str, options: Mapping[str, str], *, lakefs: LakeFSStore | None) -> CoordStore:
    """A store of ``kind`` ("lakefs" is the default deployment: no extra infrastructure)."""
    if kind not in OPTIONS:
        raise ConfigError(
            f"unknown coordination backend {kind!r}: set PERAGO_COORD_BACKEND to one of "
            f"{', '.join(KINDS)}"
        )
    known = {o for required, optional in OPTIONS.values() for o in (*required, *optional)}
    unknown = sorted(k for k, v in options.items() if v and k not in known)
    if unknown:
        raise ConfigError(
            f"unknown coordination option(s) {', '.join(_env(k) for k in unknown)}; known: "
            f"{', '.join(_env(k) for k in sorted(known))}"
        )
    opts = {k: v for k, v in options.items() if v}
    required, _ = OPTIONS[kind]
    missing = [_env(o) for o in required if o not in opts]
    if missing:
        raise ConfigError(f"coordination backend {kind} needs {', '.join(missing)}")
    aws = {o: opts.get(o) for o in _AWS}

    if kind == "memory":
        from perago.coord.memory import MemoryStore

        return MemoryStore()
    if kind == "lakefs":
        if lakefs is None:
            raise ConfigError(
                "coordination backend lakefs needs a lakeFS connection (LAKECTL_SERVER_ENDPOINT_URL"
                " and credentials); or choose another PERAGO_COORD_BACKEND"
            )
        from perago.coord.lakefs_objects import DEFAULT_BRANCH, DEFAULT_ROOT, LakeFSObjectsStore

        return LakeFSObjectsStore(
            lakefs,
            opts["repository"],
            branch=opts.get("branch", DEFAULT_BRANCH),
            root=opts.get("root", DEFAULT_ROOT),
            source_branch=opts.get("source_branch"),
        )
    if kind in ("s3", "put_and_verify"):
        from perago.coord.s3 import s3_client

        client = s3_client(**aws)
        prefix = opts.get("prefix", "perago/coord/")
        if kind == "s3":
            from perago.coord.s3 import S3Store

            return S3Store(client, opts["bucket"], prefix=prefix)
        from perago.coord.put_and_verify import PutAndVerifyStore, S3Objects

        return PutAndVerifyStore(S3Objects(client, opts["bucket"]), root=prefix)
    from perago.coord.dynamodb import DynamoDBStore, dynamodb_client

    store = DynamoDBStore(
        dynamodb_client(**aws), opts["table"], namespace=opts.get("namespace", "perago")
    )
    create = opts.get("create_table", "false").lower()
    if create not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{_env('create_table')} must be true or false, not {create!r}")
    if create in ("true", "1", "yes"):
        store.create_table()
    return store
