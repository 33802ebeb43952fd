"""One typed settings object, loaded once from the environment (or an injected mapping).

Variable names follow the ecosystems Perago sits in: ``CONDUCTOR_SERVER_URL`` (Conductor SDK)
and ``LAKECTL_SERVER_ENDPOINT_URL`` / ``LAKECTL_CREDENTIALS_*`` (lakectl); Perago's own
settings are ``PERAGO_*``. :func:`load` is the only reader of the environment (a mapping it is
given, so tests stay hermetic), of lakectl's file below it, and of ``PERAGO_COORD_*``;
:class:`Settings` is a plain pydantic model that validates what it found.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)

from perago.core.policy import AccessPolicy, patterns
from perago.errors import ConfigError

__all__ = ["Settings", "load"]


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseModel):
    """Everything a worker, the CLI and the publisher need to know about their surroundings.

    Each field is read from ``PERAGO_<FIELD>``; a ``validation_alias`` names the ecosystem's
    variables that come first (``CONDUCTOR_SERVER_URL``, ``LAKECTL_*``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    conductor_server_url: str = Field(
        default="http://127.0.0.1:18080/api",
        validation_alias=AliasChoices("CONDUCTOR_SERVER_URL", "PERAGO_CONDUCTOR_SERVER_URL"),
        description="Conductor's API URL; `/api` is appended when missing.",
    )
    conductor_auth_key: str = Field(
        default="",
        validation_alias=AliasChoices("CONDUCTOR_AUTH_KEY", "PERAGO_CONDUCTOR_AUTH_KEY"),
        description="Key id of an application with access to Conductor (Orkes, or any "
        "server or gateway that takes conductor-python's `X-Authorization` token). With "
        "`CONDUCTOR_AUTH_SECRET`, every call carries a token from `POST /api/token`, renewed "
        "every 45 minutes and whenever the server says it expired. Unset: no auth header.",
    )
    conductor_auth_secret: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("CONDUCTOR_AUTH_SECRET", "PERAGO_CONDUCTOR_AUTH_SECRET"),
        description="Secret of `CONDUCTOR_AUTH_KEY` (a credential: keep it in a Secret; never "
        "logged).",
    )
    worker_domain: str = Field(
        default="",
        validation_alias=AliasChoices("CONDUCTOR_WORKER_DOMAIN", "PERAGO_WORKER_DOMAIN"),
        description="Conductor task domain this worker polls for every task (a workflow "
        "started with `taskToDomain` routes its tasks to workers of that domain). A task's "
        "own domain (`PERAGO_TASK_DOMAINS`, then `@task(domain=...)`) wins. Unset: the "
        "default domain.",
    )
    task_domains: dict[str, str] = Field(
        default_factory=dict,
        description='Task domain per task name as a JSON object, e.g. `{"orders_clean": '
        '"team-a"}`; wins over `@task(domain=...)` and `CONDUCTOR_WORKER_DOMAIN`.',
    )
    task_concurrency: dict[str, int] = Field(
        default_factory=dict,
        description="How many attempts of a task type one worker runs at once, as a JSON "
        'object, e.g. `{"orders_clean": 1}`; wins over `@task(concurrency=...)`. '
        "`PERAGO_CONCURRENCY` stays the total; a task type at its limit is not polled.",
    )
    lakefs_endpoint: str = Field(
        default="http://127.0.0.1:18000",
        validation_alias=AliasChoices("LAKECTL_SERVER_ENDPOINT_URL", "PERAGO_LAKEFS_ENDPOINT"),
        description="lakeFS server URL, with or without `/api/v1` (as lakectl takes it). "
        "The three lakeFS settings also come from lakectl's configuration file "
        "(`LAKECTL_CONFIG_FILE`, else `~/.lakectl.yaml`: `server.endpoint_url`, "
        "`credentials.access_key_id`, `credentials.secret_access_key`); the variables win "
        "over the file, as with lakectl.",
    )
    lakefs_access_key_id: str = Field(
        default="",
        validation_alias=AliasChoices(
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID", "PERAGO_LAKEFS_ACCESS_KEY_ID"
        ),
        description="lakeFS access key id of the worker's user (a credential: keep it in a "
        "Secret).",
    )
    lakefs_secret_access_key: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices(
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", "PERAGO_LAKEFS_SECRET_ACCESS_KEY"
        ),
        description="lakeFS secret access key (a credential: keep it in a Secret; never logged).",
    )
    work_dir: Path = Field(
        default_factory=lambda: Path(tempfile.gettempdir()) / "perago",
        description="Folder for attempt workspaces (one private subfolder per attempt, removed "
        "when it ends); needs room for the largest workspace times the concurrency plus "
        "`PERAGO_PUBLICATIONS_IN_FLIGHT`.",
    )
    worker_id: str = Field(
        default_factory=_default_worker_id,
        description="The worker id reported to Conductor when polling and updating tasks.",
    )
    concurrency: int = Field(
        default=2,
        ge=1,
        le=256,
        description="Task bodies one worker process runs at once (`perago worker --concurrency` "
        "overrides it); attempts that are only publishing count against "
        "`PERAGO_PUBLICATIONS_IN_FLIGHT` instead.",
    )
    publications_in_flight: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="Attempts whose body has finished and that are still publishing "
        "(uploading, waiting for the branch lease, merging, reporting) beyond "
        "`PERAGO_CONCURRENCY`: they do not hold a body's place, so a worker polls for the "
        "next body while fan-out siblings wait for the lease and then publish together. "
        "Default: the same as `PERAGO_CONCURRENCY`, so a worker holds at most twice its "
        "concurrency in workspaces (the Helm chart's scratch size assumes so). 0: an "
        "attempt holds its place until it has reported. Each keeps its workspace until "
        "its report.",
    )
    poll_interval: timedelta = Field(
        default=timedelta(milliseconds=200),
        description="When none of the worker's task types has a task, how long it waits in "
        "one long-poll (of each type in turn) before asking every type again.",
    )
    shutdown_grace: timedelta = Field(
        default=timedelta(seconds=30),
        description="After SIGTERM, how long in-flight attempts may finish before they are "
        "interrupted (and reported FAILED, so Conductor retries them).",
    )
    extension_interval: timedelta | None = Field(
        default=None,
        description="How often a running attempt extends its Conductor response timeout; "
        "unset: a third of the task's response timeout, at least 1 s.",
    )
    transfer_parallelism: int = Field(
        default=25,
        ge=1,
        le=128,
        description="Object downloads in flight into a workspace (from lakeFS, or object "
        "storage when pre-signed): objects up to 1 MiB driven by libcurl from one thread, "
        "larger ones one per thread. 25, like `lakectl local`.",
    )
    upload_parallelism: int = Field(
        default=100,
        ge=1,
        le=512,
        description="Uploads in flight at once, pre-signed or through lakeFS (driven by libcurl "
        "from one thread, so many cost little; files over 1 MiB stream from disk). Each waits "
        "mostly on lakeFS or object storage, so more in flight hide the wait "
        "(docs/benchmarks.md). Lower it for a small lakeFS shared by many workers.",
    )
    presign: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Move object bytes straight between the workspace and object storage "
        "with URLs lakeFS pre-signs, so lakeFS sees metadata only (like `lakectl --pre-sign`): "
        "`auto` where lakeFS's blockstore supports it (S3, GCS, Azure; not the local "
        "blockstore), `on` to require it, `off` to send every byte through lakeFS.",
    )
    lakefs_local_blockstore: Path | None = Field(
        default=None,
        description="lakeFS's local blockstore folder (`blockstore.local.path`), for a worker "
        "that shares lakeFS's filesystem: objects stored under it are read from it directly "
        "instead of through lakeFS's API (only under this folder; anything missing or "
        "unreadable there is read through lakeFS). Unset: every byte through lakeFS.",
    )
    cache_dir: Path = Field(
        default_factory=lambda: Path(tempfile.gettempdir()) / "perago-cache",
        description="Folder of the worker-local content cache (one subfolder per worker "
        "process; those of dead processes are removed at start). On the same filesystem as "
        "`PERAGO_WORK_DIR`, an attempt borrows its files (a rename; they come back after the "
        "report only if provably unchanged); elsewhere it gets copies. Never links.",
    )
    cache_bytes: int = Field(
        default=1024**3,
        ge=0,
        description="Size bound of the worker-local content cache in bytes (least recently "
        "used entries are evicted); 0 turns the cache off.",
    )
    http_timeout: timedelta = Field(
        default=timedelta(seconds=60),
        description="Timeout of one HTTP request to lakeFS or Conductor.",
    )
    cluster_id: str = Field(
        default="",
        pattern=r"^[a-z0-9]{0,20}$",
        description="Names the Conductor cluster this worker serves (lower-case letters and "
        "digits): staging branches become `perago-<id>-stg-...` and the janitor removes only "
        "its own cluster's, so clusters sharing one lakeFS never remove each other's. Unset: "
        "`perago-stg-...`.",
    )
    params_extra: Literal["forbid", "ignore"] = Field(
        default="forbid",
        description="What a task does with params keys its model does not declare: `forbid` "
        "fails the attempt terminally, naming them (a typo never goes unnoticed); `ignore` "
        "drops them. A params model's own `model_config['extra']` wins.",
    )
    wap_keep_branch: bool = Field(
        default=False,
        description="Keep a write-audit-publish workflow's isolated branch "
        "(`perago-wap-<workflow id>`) after it published, and the janitor keeps those of "
        "failed workflows too, for inspection; unset: removed after publishing, and by the "
        "janitor once the workflow failed or was terminated.",
    )
    allowed_targets: str = Field(
        default="",
        description="Where this worker's tasks may publish: comma-separated globs of "
        "`repository/branch` (e.g. `analytics/main,analytics/dev-*`); unset: anywhere its "
        "lakeFS credentials reach. Anything else fails the attempt before it reads anything "
        "(terminal). Isolated write-audit-publish branches of an allowed repository count as "
        "allowed.",
    )
    allowed_sources: str = Field(
        default="",
        description="What this worker's tasks may read (their workspace's branch or named "
        "ref, and their named inputs): comma-separated globs of `repository/ref` (e.g. "
        "`analytics/*,reference/v*`); unset: anything. A commit id is checked through the "
        "branch it is read with.",
    )
    protected_branches: str = Field(
        default="",
        description="Branches no ordinary task may publish to: comma-separated globs of "
        "`branch` or `repository/branch` (e.g. `main`); only `perago_wap_publish` lands "
        "there, after its workflow's audit. Read-only tasks and inputs may read them.",
    )
    wap_sweep_interval: timedelta = Field(
        default=timedelta(minutes=2),
        description="How often, in seconds, a running worker removes the isolated branches "
        "of write-audit-publish workflows that ended in any state (failed audit, timed out, "
        "terminated), as the janitor would (`PERAGO_WAP_KEEP_BRANCH` keeps them); 0: only "
        "at start and by `perago janitor`.",
    )
    janitor_on_start: bool = Field(
        default=True,
        description="Run one janitor pass when a worker starts (staging branches of dead "
        "attempts, expired branch leases).",
    )
    #: Coordination backend for branch leases ("lakefs", "s3", "dynamodb", "put_and_verify",
    #: "memory", or "none" to publish without leases); its options come from
    #: PERAGO_COORD_<OPTION>. The default keeps each repository's leases in that repository.
    coord_backend: str = Field(
        default="lakefs",
        description="Coordination backend for branch leases: `lakefs`, `s3`, `dynamodb`, "
        "`put_and_verify`, `memory`, or `none` to publish without leases.",
    )
    coord_options: dict[str, str] = Field(
        default_factory=dict,
        description="The backend's options, one variable each: `PERAGO_COORD_<OPTION>` (see "
        "the table below), or all at once as a JSON object in `PERAGO_COORD_OPTIONS`.",
    )
    lease_ttl: timedelta = Field(
        default=timedelta(seconds=30),
        description="Lifetime of a branch lease; a holder renews it while it writes.",
    )
    max_clock_skew_rate: float = Field(
        default=1.5,
        ge=1.0,
        description="How much faster than a lease holder's clock another worker's clock may "
        "run; a dead holder's lease is taken over after `lease_ttl` times this.",
    )
    spark_master: str | None = Field(
        default=None,
        description="Spark master URL (`local[2]`, `spark://host:7077`, `k8s://...`) or Spark "
        "Connect remote (`sc://host:15002`) of the worker's session. Unset: the user's Spark "
        "configuration decides (`spark.master`/`spark.remote` in `PERAGO_SPARK_CONF`, "
        "`SPARK_REMOTE`, `MASTER`, `spark-defaults.conf`), else `local[*]`; the log says which "
        "was used and where it came from (`spark_session_started`).",
    )
    spark_shared_filesystem: bool = Field(
        default=False,
        description="Every Spark executor sees the worker's `PERAGO_WORK_DIR` at the same path "
        "(a shared volume): local-projection Spark tasks may then run on a cluster master. "
        "Unset: on a non-local master or Spark Connect they are refused (declare them "
        "`in_place=True`).",
    )
    spark_jars_dir: Path | None = Field(
        default=None,
        description="Folder of the S3A connector's jars (hadoop-aws matching pyspark's Hadoop, "
        "the AWS SDK bundle) for in-place tasks, fetched at build time: `perago dev env` sets "
        "it to the stack's `spark-jars`, the worker image to `/opt/perago/spark-jars`. Unset: "
        "`spark_s3a_package` is resolved through Ivy at the first in-place task.",
    )
    spark_jars_on_executors: bool = Field(
        default=False,
        description="The jars of `spark_jars_dir` lie at the same path on every executor's "
        "host too (one machine, or executors from the worker's image): a cluster's executors "
        "load them where they lie instead of each copying them (686 MB) into its work folder. "
        "`perago dev env` sets it, its cluster runs on the same machine.",
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description='Extra Spark settings as a JSON object, e.g. `{"spark.driver.memory": "2g"}`.',
    )
    #: The S3A connector for in-place tasks, resolved from Maven Central once and cached.
    spark_s3a_package: str = Field(
        default="org.apache.hadoop:hadoop-aws:3.5.0",
        description="Maven coordinates of the S3A connector in-place tasks use; resolved once "
        "and cached in `spark_ivy_dir`.",
    )
    spark_ivy_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "perago" / "ivy",
        description="Ivy cache of Spark packages (the S3A connector).",
    )

    @field_validator(
        "poll_interval",
        "shutdown_grace",
        "http_timeout",
        "lease_ttl",
        "extension_interval",
        "wap_sweep_interval",
        mode="before",
    )
    @classmethod
    def _seconds(cls, value: object) -> object:
        # Environment variables say durations in seconds ("0.5", "30").
        if isinstance(value, str):
            try:
                return timedelta(seconds=float(value))
            except ValueError:
                return value
        return value

    def access_policy(self) -> AccessPolicy:
        """The allowed targets and sources and the protected branches (perago.core.policy)."""
        return AccessPolicy(
            patterns(self.allowed_targets),
            patterns(self.allowed_sources),
            patterns(self.protected_branches),
        )

    @field_validator("coord_backend")
    @classmethod
    def _known_backend(cls, kind: str) -> str:
        from perago.coord.factory import KINDS

        if kind != "none" and kind not in KINDS:
            raise ValueError(f"must be one of none, {', '.join(KINDS)} (PERAGO_COORD_BACKEND)")
        return kind

    @field_validator(
        "spark_conf", "coord_options", "task_domains", "task_concurrency", mode="before"
    )
    @classmethod
    def _json_object(cls, value: object) -> object:
        # PERAGO_SPARK_CONF='{"spark.executor.memory": "2g"}'
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"must be a JSON object ({e})") from e
        return value

    @field_validator("task_concurrency")
    @classmethod
    def _positive_limits(cls, limits: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in limits.items() if v < 1}
        if bad:
            raise ValueError(f"each limit must be at least 1, got {bad}")
        return limits

    @field_validator("conductor_server_url")
    @classmethod
    def _conductor_api(cls, url: str) -> str:
        url = url.rstrip("/")
        return url if url.endswith("/api") else url + "/api"

    @field_validator("lakefs_endpoint")
    @classmethod
    def _lakefs_base(cls, url: str) -> str:
        url = url.rstrip("/")
        return url.removesuffix("/api/v1")

    @property
    def publishing_places(self) -> int:
        """Places for attempts that only publish: ``publications_in_flight``, or as many as
        the concurrency when it is unset."""
        if self.publications_in_flight is None:
            return self.concurrency
        return self.publications_in_flight

    @property
    def lakefs_api_url(self) -> str:
        return self.lakefs_endpoint + "/api/v1"

    def require_lakefs_credentials(self) -> None:
        if not self.lakefs_access_key_id or not self.lakefs_secret_access_key.get_secret_value():
            raise ConfigError(
                "lakeFS credentials are not set: export LAKECTL_CREDENTIALS_ACCESS_KEY_ID and "
                "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY (for the local stack: "
                'eval "$(perago dev env)")'
            )


#: lakectl's configuration file keys, as Settings fields.
_LAKECTL_KEYS = {
    ("server", "endpoint_url"): "lakefs_endpoint",
    ("credentials", "access_key_id"): "lakefs_access_key_id",
    ("credentials", "secret_access_key"): "lakefs_secret_access_key",
}


def _lakectl_file(source: Mapping[str, str], *, injected: bool) -> dict[str, object]:
    """lakeFS settings from lakectl's YAML file: ``LAKECTL_CONFIG_FILE``, else (for the
    process environment only, so injected test environments stay hermetic) ``~/.lakectl.yaml``.
    """
    named = source.get("LAKECTL_CONFIG_FILE")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"LAKECTL_CONFIG_FILE={named} is not a file: point it at lakectl's YAML "
                "configuration or unset it"
            )
    else:
        path = Path(source.get("HOME") or Path.home()) / ".lakectl.yaml"
        if injected or not path.is_file():
            return {}
    import yaml  # only when there is a file to read

    try:
        body = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(
            f"cannot read lakectl's configuration {path} ({e}); fix or remove it"
        ) from e
    if not isinstance(body, dict):
        raise ConfigError(f"lakectl's configuration {path} is not a YAML mapping; fix it")
    found: dict[str, object] = {}
    for (section, key), field in _LAKECTL_KEYS.items():
        value = (body.get(section) or {}).get(key) if isinstance(body.get(section), dict) else None
        if value:
            found[field] = str(value)
    return found


def load(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Build settings from ``env`` (default: the process environment) plus explicit overrides.

    lakeFS settings also come from lakectl's configuration file, with lakectl's precedence:
    variables over the file.
    """
    source = os.environ if env is None else env
    values: dict[str, object] = _lakectl_file(source, injected=env is not None)
    for name, field in Settings.model_fields.items():
        aliases: list[str] = []
        if isinstance(field.validation_alias, AliasChoices):
            aliases = [a for a in field.validation_alias.choices if isinstance(a, str)]
        aliases.append(f"PERAGO_{name.upper()}")
        for alias in aliases:
            if alias in source:
                values[name] = source[alias]
                break
    unknown = set(overrides) - set(Settings.model_fields)
    if unknown:
        raise ConfigError(
            f"unknown settings {sorted(unknown)}; known: {sorted(Settings.model_fields)}"
        )
    if "coord_options" not in values:
        values["coord_options"] = {
            k.removeprefix("PERAGO_COORD_").lower(): v
            for k, v in source.items()
            if k.startswith("PERAGO_COORD_") and k != "PERAGO_COORD_BACKEND"
        }
    values.update(overrides)
    try:
        return Settings(**values)
    except ValidationError as e:
        raise ConfigError(f"invalid Perago settings (fix the variables named below): {e}") from e
