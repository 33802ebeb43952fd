"""Stack variants beside the running stack: an S3 blockstore (versitygw and a lakeFS that
stores there), and a second lakeFS configured otherwise (``lakefs_beside``).

The default stack keeps lakeFS's data on the local disk, where lakeFS cannot pre-sign URLs,
so every byte passes through lakeFS. On S3 (or GCS, Azure) a client can move the bytes
straight to object storage with pre-signed URLs and lakeFS sees metadata only; this variant
is where Perago's pre-signed transfers are tested and benchmarked against ``lakectl
--pre-sign``, beside any running stack. Both processes run on free loopback ports under a
folder of the caller's, for as long as the ``with`` block lasts; nothing outlives it.

The S3 server is the production profile's (:mod:`perago_dev.production`): versitygw checks
SigV4 signatures and expiry as S3 does, so an expired or tampered pre-signed URL is refused
for real. lakeFS keeps its metadata in its local KV here, to start in a second.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import string
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from perago.errors import StackError
from perago_dev import production
from perago_dev.build import build_versitygw
from perago_dev.paths import stack_paths
from perago_dev.stack import HOST, Credentials, load_credentials, render_lakefs_config

__all__ = ["BUCKET", "S3Stack", "free_port", "lakefs_beside", "s3_stack"]

BUCKET = production.BUCKET
_START_TIMEOUT = 60.0


@dataclass(frozen=True)
class S3Stack:
    """Where the variant's servers answer, and lakeFS's admin keys (never logged)."""

    lakefs_endpoint: str
    s3_endpoint: str
    access_key_id: str
    secret_access_key: str
    lakectl_config: Path
    s3_access_key_id: str
    s3_secret_access_key: str
    access_log: Path

    def env(self) -> dict[str, str]:
        """Perago's settings for this lakeFS (the ``PERAGO_*`` variables)."""
        return {
            "PERAGO_LAKEFS_ENDPOINT": self.lakefs_endpoint,
            "PERAGO_LAKEFS_ACCESS_KEY_ID": self.access_key_id,
            "PERAGO_LAKEFS_SECRET_ACCESS_KEY": self.secret_access_key,
        }


def free_port() -> int:
    """A TCP port free on loopback right now."""
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
    """versitygw and a lakeFS on it, with state under ``work``; stopped on exit.

    Needs the lakeFS binary of ``perago dev build``; builds versitygw if missing.
    """
    lakefs = stack_paths().bin / "lakefs"
    if not lakefs.exists():
        raise StackError(f"{lakefs} is missing: run `perago dev build` first")
    versitygw = build_versitygw()
    # Every run starts empty: a bucket of an earlier run holds objects its lakeFS forgot.
    for old in ("lakefs", "s3"):
        shutil.rmtree(work / old, ignore_errors=True)
    (work / "s3").mkdir(parents=True)
    s3_port, lakefs_port = free_port(), free_port()
    s3 = f"http://{HOST}:{s3_port}"
    s3_key, s3_secret = "AKIA" + _key(16), _key(40)
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LAKEFS_", "AWS_", "VGW_", "ROOT_"))
    }
    access_log = work / "s3-access.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gateway = production.versitygw_command(versitygw, work / "s3", s3_port, access_log)
        keys = {"ROOT_ACCESS_KEY_ID": s3_key, "ROOT_SECRET_ACCESS_KEY": s3_secret}
        procs.append(_spawn(gateway, work / "s3.log", {**clean, **keys}))
        _wait(f"{s3}/health", procs[0], work / "s3.log", "versitygw")
        production.ensure_bucket(s3_port, s3_key, s3_secret)
        creds = Credentials("AKIA" + _key(16), _key(40), _key(48))
        blockstore = production.lakefs_blockstore(
            s3_port=s3_port, s3_key=s3_key, s3_secret=s3_secret
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
            s3_access_key_id=s3_key,
            s3_secret_access_key=s3_secret,
            access_log=access_log,
        )
    finally:
        for proc in reversed(procs):
            _stop(proc)


@contextlib.contextmanager
def lakefs_beside(work: Path, *, actions: bool = True) -> Iterator[str]:
    """A second lakeFS on a free port, its local KV and blockstore under ``work``, with the
    running stack's keys: its endpoint, stopped on exit. ``actions=False``: it runs no hooks
    (``actions.enabled: false``), for tests of what Perago assumes about hooks."""
    paths = stack_paths()
    lakefs = paths.bin / "lakefs"
    if not lakefs.exists():
        raise StackError(f"{lakefs} is missing: run `perago dev build` first")
    shutil.rmtree(work / "lakefs", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    creds = load_credentials(paths.credentials)
    config = work / "lakefs.yaml"
    config.write_text(
        render_lakefs_config(data=work / "lakefs", port=port, credentials=creds, actions=actions)
    )
    config.chmod(0o600)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFS_")}
    proc = _spawn([str(lakefs), "run", "-c", str(config)], work / "lakefs.log", clean)
    try:
        url = f"http://{HOST}:{port}"
        _wait(f"{url}/api/v1/healthcheck", proc, work / "lakefs.log", "a second lakeFS")
        yield url
    finally:
        _stop(proc)
