"""A stack variant with an S3 blockstore: moto's S3 server and a lakeFS that stores there.

The default stack keeps lakeFS's data on the local disk, where lakeFS cannot pre-sign URLs,
so every byte passes through lakeFS. On S3 (or GCS, Azure) a client can move the bytes
straight to object storage with pre-signed URLs and lakeFS sees metadata only; this variant
is where Perago's pre-signed transfers are tested and benchmarked against ``lakectl
--pre-sign``. Both processes run on free loopback ports under a folder of the caller's, for
as long as the ``with`` block lasts; nothing outlives it.

moto is an S3 implementation in Python (``pip install 'moto[server]'``, in Perago's ``dev``
extra). It is far slower per request than a real S3, which slows both sides of a comparison
alike.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import string
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from perago.errors import StackError
from perago_dev.paths import stack_paths
from perago_dev.stack import HOST, Credentials, render_lakefs_config

__all__ = ["BUCKET", "S3Stack", "s3_stack"]

BUCKET = "perago-data"
_REGION = "us-east-1"
_START_TIMEOUT = 60.0


@dataclass(frozen=True)
class S3Stack:
    """Where the variant's servers answer, and lakeFS's admin keys (never logged)."""

    lakefs_endpoint: str
    s3_endpoint: str
    access_key_id: str
    secret_access_key: str
    lakectl_config: Path

    def env(self) -> dict[str, str]:
        """Perago's settings for this lakeFS (the ``PERAGO_*`` variables)."""
        return {
            "PERAGO_LAKEFS_ENDPOINT": self.lakefs_endpoint,
            "PERAGO_LAKEFS_ACCESS_KEY_ID": self.access_key_id,
            "PERAGO_LAKEFS_SECRET_ACCESS_KEY": self.secret_access_key,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _key(n: int) -> str:
    alphabet = string.ascii_uppercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), opener.open(url, timeout=2):
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise StackError(f"{what} did not start (see {log}):\n{tail}")


def _spawn(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def s3_stack(work: Path) -> Iterator[S3Stack]:
    """moto's S3 server and a lakeFS on it, with state under ``work``; stopped on exit.

    Needs the lakeFS binary of ``perago dev build`` and ``moto_server`` next to Python.
    """
    lakefs = stack_paths().bin / "lakefs"
    moto = Path(sys.executable).parent / "moto_server"
    if not lakefs.exists():
        raise StackError(f"{lakefs} is missing: run `perago dev build` first")
    if not moto.exists():
        raise StackError("moto_server is missing: pip install 'perago-runtime[dev]'")
    # moto keeps its objects in memory: lakeFS metadata of an earlier run would point at
    # nothing (and its keys differ), so every run starts empty.
    shutil.rmtree(work / "lakefs", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    s3_port, lakefs_port = _free_port(), _free_port()
    s3 = f"http://{HOST}:{s3_port}"
    # moto accepts any keys; lakeFS signs its requests and its pre-signed URLs with these.
    s3_key, s3_secret = _key(20), _key(40)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEFS_", "AWS_"))}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_spawn([str(moto), "-H", HOST, "-p", str(s3_port)], work / "moto.log", clean))
        _wait(f"{s3}/moto-api/", procs[0], work / "moto.log", "moto_server")
        request = urllib.request.Request(f"{s3}/{BUCKET}", method="PUT")
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10)
        creds = Credentials("AKIA" + _key(16), _key(40), _key(48))
        blockstore = (
            f'{{ type: s3, default_namespace_prefix: "s3://{BUCKET}/", s3: {{ '
            f'endpoint: "{s3}", force_path_style: true, region: {_REGION}, '
            f'credentials: {{ access_key_id: "{s3_key}", secret_access_key: "{s3_secret}" }} }} }}'
        )
        config = work / "lakefs.yaml"
        config.write_text(
            render_lakefs_config(
                data=work / "lakefs", port=lakefs_port, credentials=creds, blockstore=blockstore
            )
        )
        config.chmod(0o600)
        procs.append(_spawn([str(lakefs), "run", "-c", str(config)], work / "lakefs.log", clean))
        url = f"http://{HOST}:{lakefs_port}"
        _wait(f"{url}/api/v1/healthcheck", procs[1], work / "lakefs.log", "lakeFS on S3")
        lakectl = work / "lakectl.yaml"
        lakectl.write_text(
            f"credentials: {{ access_key_id: {creds.access_key_id}, "
            f"secret_access_key: {creds.secret_access_key} }}\n"
            f"server: {{ endpoint_url: {url}/api/v1 }}\n"
        )
        lakectl.chmod(0o600)
        yield S3Stack(
            lakefs_endpoint=url,
            s3_endpoint=s3,
            access_key_id=creds.access_key_id,
            secret_access_key=creds.secret_access_key,
            lakectl_config=lakectl,
        )
    finally:
        for proc in reversed(procs):
            _stop(proc)
