"""The production profile's own processes: PostgreSQL and an S3 server (versitygw).

``perago dev up --profile production`` runs the topology users run, in miniature: Conductor
and lakeFS keep their state in PostgreSQL, and lakeFS keeps its objects in a real S3 server,
which signs the pre-signed URLs Perago's workers move bytes with. PostgreSQL is the
distribution's own server binary with a data folder of the stack's; the S3 server is versitygw
(Apache-2.0, Versity's maintained S3 gateway, one Go binary built from the Go module proxy,
objects kept as plain files, SigV4 pre-signed URLs and an S3-style access log), built from
``recipes/versitygw``.

PostgreSQL refuses to run as root: under root its data folder lives where the ``postgres``
account can reach it (``/var/tmp/perago-dev-postgres/<stack id>``) and the server runs as that
account; otherwise it lives in the stack folder and runs as the caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import subprocess
from pathlib import Path

from perago.errors import StackError
from perago_dev.paths import StackPaths

__all__ = [
    "BUCKET",
    "DATABASES",
    "conductor_postgres_args",
    "ensure_bucket",
    "ensure_databases",
    "init_postgres",
    "lakefs_blockstore",
    "lakefs_database",
    "postgres_command",
    "postgres_data",
    "postgres_ready",
    "postgres_user",
    "versitygw_command",
]

HOST = "127.0.0.1"
BUCKET = "perago-data"
REGION = "us-east-1"
#: One database per server, owned by the ``postgres`` role (trust on loopback only).
DATABASES = ("lakefs", "conductor")
_ROOT_DATA = Path("/var/tmp/perago-dev-postgres")
_PG_ROLE = "postgres"


def postgres_user() -> str | None:
    """The account to run PostgreSQL as: ``postgres`` under root (it refuses root), else None."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(_PG_ROLE)
    except KeyError:
        raise StackError(
            "PostgreSQL refuses to run as root and there is no 'postgres' account to run it "
            "as; install PostgreSQL from your distribution (it creates the account) or run "
            "`perago dev up --profile production` as an ordinary user"
        ) from None
    return _PG_ROLE


def postgres_data(paths: StackPaths) -> Path:
    """PostgreSQL's data folder for this stack (see the module's note on root)."""
    if os.geteuid() == 0:
        stack_id = hashlib.sha256(str(paths.stack).encode()).hexdigest()[:12]
        return _ROOT_DATA / stack_id
    return paths.data / "production" / "postgres"


def _chown(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def init_postgres(bin_dir: Path, data: Path, log: Path) -> None:
    """``initdb`` the data folder once: trust authentication (the server listens on loopback
    only), UTF-8, no locale."""
    if (data / "PG_VERSION").is_file():
        return
    user = postgres_user()
    if user is not None:
        _ROOT_DATA.mkdir(mode=0o755, parents=True, exist_ok=True)
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    if user is not None:
        _chown(data, user)
    cmd = [str(bin_dir / "initdb"), "-D", str(data), "-U", _PG_ROLE, "-A", "trust"]
    cmd += ["-E", "UTF8", "--no-locale", "--no-instructions"]
    with log.open("ab") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, user=user, check=False)
    if done.returncode != 0:
        raise StackError(
            f"initdb failed (exit {done.returncode}); see {log}, then `perago dev down --wipe` "
            "and `perago dev up --profile production` again"
        )


def postgres_command(bin_dir: Path, data: Path, port: int) -> list[str]:
    """The server on loopback TCP only (no Unix socket to place), durable as in production."""
    return [
        str(bin_dir / "postgres"),
        "-D",
        str(data),
        "-p",
        str(port),
        "-c",
        f"listen_addresses={HOST}",
        "-c",
        "unix_socket_directories=",
        "-c",
        "max_connections=200",
    ]


def _client(bin_dir: Path, tool: str, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(bin_dir / tool), "-h", HOST, "-p", str(port), "-U", _PG_ROLE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)


def postgres_ready(bin_dir: Path, port: int) -> bool:
    """Does the server accept connections (not merely listen while it starts)?"""
    try:
        return _client(bin_dir, "pg_isready", port, "-q", "-t", "2").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_databases(bin_dir: Path, port: int) -> None:
    """Create lakeFS's and Conductor's databases if missing (their servers make the tables)."""
    for name in DATABASES:
        done = _client(bin_dir, "createdb", port, name)
        if done.returncode != 0 and "already exists" not in done.stderr:
            raise StackError(
                f"creating PostgreSQL database {name!r} failed: {done.stderr.strip()}; "
                "check the server's log (`.stack/logs/postgres.log`)"
            )


def conductor_postgres_args(port: int, conductor_port: int) -> list[str]:
    """Conductor's store, queue, index, execution lock and large payloads all on PostgreSQL."""
    url = f"jdbc:postgresql://{HOST}:{port}/conductor"
    return [
        f"--spring.datasource.url={url}",
        f"--spring.datasource.username={_PG_ROLE}",
        "--spring.datasource.password=",
        "--conductor.db.type=postgres",
        "--conductor.queue.type=postgres",
        "--conductor.indexing.type=postgres",
        "--conductor.workflow-execution-lock.type=postgres",
        "--conductor.external-payload-storage.type=postgres",
        f"--conductor.external-payload-storage.postgres.url={url}",
        f"--conductor.external-payload-storage.postgres.username={_PG_ROLE}",
        "--conductor.external-payload-storage.postgres.password=",
        "--conductor.external-payload-storage.postgres.conductor-url="
        f"http://{HOST}:{conductor_port}",
    ]


def lakefs_database(postgres_port: int) -> str:
    """lakeFS's ``database`` section (a YAML flow mapping): its KV on PostgreSQL."""
    conn = f"postgres://{_PG_ROLE}@{HOST}:{postgres_port}/lakefs?sslmode=disable"
    return f'{{ type: postgres, postgres: {{ connection_string: "{conn}" }} }}'


def lakefs_blockstore(*, s3_port: int, s3_key: str, s3_secret: str) -> str:
    """lakeFS's ``blockstore`` section: its objects in the S3 server's bucket, pre-signed URLs
    on (lakeFS's default, living 15 minutes)."""
    return (
        f'{{ type: s3, default_namespace_prefix: "s3://{BUCKET}/", s3: {{ '
        f'endpoint: "http://{HOST}:{s3_port}", force_path_style: true, region: {REGION}, '
        "discover_bucket_region: false, "
        f'credentials: {{ access_key_id: "{s3_key}", secret_access_key: "{s3_secret}" }} }} }}'
    )


def versitygw_command(binary: Path, data: Path, port: int, access_log: Path) -> list[str]:
    """versitygw on loopback serving ``data`` (one folder per bucket), with an access log.

    Its root keys come from the environment (``ROOT_ACCESS_KEY_ID``...), not the command line
    that ``ps`` shows."""
    return [
        str(binary),
        "--port",
        f"{HOST}:{port}",
        "--health",
        "/health",
        "--keep-alive",
        "--quiet",
        "--access-log",
        str(access_log),
        "posix",
        str(data),
    ]


def ensure_bucket(port: int, key: str, secret: str) -> None:
    """Create lakeFS's bucket if it is missing."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://{HOST}:{port}",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, proxies={}, retries={"max_attempts": 3}),
    )
    try:
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=BUCKET)
    except (BotoCoreError, ClientError) as e:
        raise StackError(
            f"creating bucket {BUCKET!r} on the S3 server failed ({e}); see `.stack/logs/s3.log`"
        ) from e
