"""Session fixtures for the coordination backends' servers: versitygw and moto (S3),
and DynamoDB Local.

Both run as child processes on free loopback ports and are stopped at session end. DynamoDB
Local is fetched once from Maven Central (``perago-dev/perago_dev/recipes/dynamodb/pom.xml``) into
``<stack dir>/dynamodb`` and reused. Without a server the tests skip on a laptop but fail
when ``CI`` is set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from perago_dev.paths import exclusive

DYNAMODB_LOCAL_MAIN = "com.amazonaws.services.dynamodbv2.local.main.ServerRunner"


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            unavailable(f"{proc.args} exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers: good enough
        except OSError:
            time.sleep(0.1)
    _stop(proc)
    unavailable(f"{proc.args} did not answer on {url} within {timeout:.0f}s (log: {log})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _serve(
    cmd: list[str],
    url: str,
    log: Path,
    timeout: float,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        except OSError as e:
            unavailable(f"cannot start {cmd[0]}: {e}")
    try:
        _wait_http(url, proc, log, timeout)
        yield url.removesuffix("/health")
    finally:
        _stop(proc)


#: The root keys of the S3 server the coordination tests start (a throwaway server).
S3_KEYS = {"access_key_id": "PERAGOCOORDTEST", "secret_access_key": "coord-test-secret"}


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """versitygw, the production profile's S3 server, on a free port with its own folder
    (built from the Go module proxy on first use): conditional writes (If-Match,
    If-None-Match) checked by a real server, racing requests served concurrently."""
    from perago_dev.build import build_versitygw

    try:
        binary = build_versitygw()
    except Exception as e:  # noqa: BLE001 - the reason is the message
        unavailable(f"versitygw could not be built: {e}")
    root = tmp_path_factory.mktemp("versitygw")
    (root / "data").mkdir()
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("VGW_", "ROOT_"))},
        "ROOT_ACCESS_KEY_ID": S3_KEYS["access_key_id"],
        "ROOT_SECRET_ACCESS_KEY": S3_KEYS["secret_access_key"],
    }
    cmd = [str(binary), "--port", f"127.0.0.1:{port}", "--health", "/health", "posix"]
    yield from _serve(
        [*cmd, str(root / "data")],
        f"http://127.0.0.1:{port}/health",
        root / "versitygw.log",
        30,
        env=env,
    )


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server (conditional writes, among others) on a free port, one request at a
    time so that a conditional write is atomic as on S3 (see ``moto_serial``)."""
    try:
        import moto.moto_server.werkzeug_app  # noqa: F401
    except ImportError:
        unavailable("moto's server is missing: pip install 'moto[server]>=5'")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    root = Path(__file__).resolve().parents[2]
    yield from _serve(
        [sys.executable, "-m", "tests.integration.moto_serial", "127.0.0.1", str(port)],
        f"http://127.0.0.1:{port}",
        log,
        30,
        cwd=root,
    )


def _stack_dir() -> Path:
    override = os.environ.get("PERAGO_STACK_DIR")
    if override:
        return Path(override).resolve()
    return Path(__file__).resolve().parents[2] / ".stack"


def dynamodb_local_dir() -> Path:
    """The DynamoDB Local jars and native library, fetched once (keyed by the pom's hash);
    test processes side by side wait for the one fetching them."""
    target = _stack_dir() / "dynamodb"
    target.mkdir(parents=True, exist_ok=True)
    with exclusive(target.parent / ".dynamodb-lock"):
        return _fetch_dynamodb_local(target)


def _fetch_dynamodb_local(target: Path) -> Path:
    root = Path(__file__).resolve().parents[2]
    pom = root / "perago-dev" / "perago_dev" / "recipes" / "dynamodb" / "pom.xml"
    stamp = target / ".stamp"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and any(target.glob("DynamoDBLocal-*.jar")):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        unavailable("Maven (mvn) is needed once to fetch DynamoDB Local from Maven Central")
    target.mkdir(parents=True, exist_ok=True)
    for old in [*target.glob("*.jar"), *target.glob("*.so"), *target.glob("*.dylib")]:
        old.unlink()
    log = target / "fetch.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [
                str(mvn),
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={target}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=pom.parent,
        )
    if done.returncode != 0 or not any(target.glob("DynamoDBLocal-*.jar")):
        unavailable(f"fetching DynamoDB Local failed (exit {done.returncode}); see {log}")
    stamp.write_text(digest)
    return target


@pytest.fixture(scope="session")
def dynamodb_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """DynamoDB Local, in memory, on a free port."""
    java = shutil.which("java")
    if java is None:
        unavailable("java is needed to run DynamoDB Local")
    jars = dynamodb_local_dir()
    port = _free_port()
    work = tmp_path_factory.mktemp("dynamodb")
    cmd = [
        java,
        f"-Djava.library.path={jars}",
        "-cp",
        f"{jars}/*",
        DYNAMODB_LOCAL_MAIN,
        "-inMemory",
        "-port",
        str(port),
    ]
    yield from _serve(cmd, f"http://127.0.0.1:{port}", work / "dynamodb.log", 60, cwd=work)
