"""Build the configured coordination store.

Options are plain strings named like the settings they come from: option ``bucket`` is
``PERAGO_COORD_BUCKET``. An empty string counts as unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

from perago.coord.store import CoordStore
from perago.errors import ConfigError

if TYPE_CHECKING:
    from perago.coord.branch_leases import BranchLeases
    from perago.core.store import VersionStore

__all__ = ["KINDS", "OPTIONS", "branch_leases", "build_store", "check_options"]

_AWS = ("endpoint_url", "region", "access_key_id", "secret_access_key")

#: Every backend's options; the first ``required`` ones must be set.
OPTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # Without a repository, each target repository holds its own leases.
    "lakefs": ((), ("repository", "branch", "root", "source_branch")),
    "s3": (("bucket",), ("prefix", *_AWS)),
    "put_and_verify": (("bucket",), ("prefix", *_AWS)),
    "dynamodb": (("table",), ("namespace", "create_table", *_AWS)),
    "memory": ((), ()),
}
KINDS = tuple(OPTIONS)


def _env(name: str) -> str:
    return f"PERAGO_COORD_{name.upper()}"


def check_options(kind: str, options: Mapping[str, str]) -> dict[str, str]:
    """The set options of backend ``kind``; ConfigError naming the variable to fix."""
    if kind not in OPTIONS:
        raise ConfigError(
            f"unknown coordination backend {kind!r}: set PERAGO_COORD_BACKEND to one of "
            f"none, {', '.join(KINDS)}"
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
    return opts


def _require_boto3(kind: str) -> None:
    # boto3 is the `aws` extra: workers on the default lakefs backend do without it.
    try:
        import boto3  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"coordination backend {kind} needs boto3: install perago-runtime[aws] "
            "(or choose PERAGO_COORD_BACKEND=lakefs)"
        ) from e


def build_store(
    kind: str,
    options: Mapping[str, str],
    *,
    lakefs: VersionStore | None,
    repository: str | None = None,
) -> CoordStore:
    """A store of ``kind`` ("lakefs" is the default deployment: no extra infrastructure).

    ``repository`` is where the lakefs backend keeps its records when no
    ``PERAGO_COORD_REPOSITORY`` is set (the target repository of the lease).
    """
    opts = check_options(kind, options)
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

        home = opts.get("repository", repository)
        if not home:
            raise ConfigError(
                "coordination backend lakefs needs a repository: set PERAGO_COORD_REPOSITORY, "
                "or let each target repository hold its own leases (the worker's default)"
            )
        return LakeFSObjectsStore(
            lakefs,
            home,
            branch=opts.get("branch", DEFAULT_BRANCH),
            root=opts.get("root", DEFAULT_ROOT),
            source_branch=opts.get("source_branch"),
        )
    if kind in ("s3", "put_and_verify", "dynamodb"):
        _require_boto3(kind)
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


class LeaseSettings(Protocol):
    """The settings branch leases are built from (``perago.config.Settings`` has them)."""

    @property
    def coord_backend(self) -> str: ...
    @property
    def coord_options(self) -> Mapping[str, str]: ...
    @property
    def lease_ttl(self) -> timedelta: ...
    @property
    def max_clock_skew_rate(self) -> float: ...


def branch_leases(settings: LeaseSettings, lakefs: VersionStore | None) -> BranchLeases | None:
    """The worker's branch leases, or None when ``PERAGO_COORD_BACKEND=none``.

    Options are checked now, so a misconfigured backend stops the worker at start-up; stores
    are built on first use (per target repository for the lakefs backend without a
    repository option).
    """
    from perago.coord.branch_leases import BranchLeases
    from perago.coord.lease import LeaseManager

    kind = settings.coord_backend
    if kind == "none":
        return None
    check_options(kind, settings.coord_options)

    def manager(repository: str) -> LeaseManager:
        store = build_store(kind, settings.coord_options, lakefs=lakefs, repository=repository)
        return LeaseManager(
            store, ttl=settings.lease_ttl, max_clock_skew_rate=settings.max_clock_skew_rate
        )

    # A publisher waits for a busy lease long enough to take over a dead holder's, twice.
    wait = settings.lease_ttl * settings.max_clock_skew_rate * 2 + timedelta(seconds=5)
    if kind == "lakefs" and not settings.coord_options.get("repository"):
        return BranchLeases(manager, wait=wait)
    return BranchLeases.shared(manager(""), wait=wait)
