"""Start, stop and describe the local stack: lakeFS and Conductor as processes on 127.0.0.1.

lakeFS runs with its embedded local KV and local blockstore; Conductor with its embedded
SQLite store. Pids, logs and data stay in the stack folder; ``down`` stops exactly the
processes ``up`` started (a pid is only signalled if its command line names this stack).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from perago.dev.build import build, conductor_jar, find_java
from perago.dev.paths import StackPaths, stack_paths
from perago.errors import StackError

__all__ = ["ServiceStatus", "StackInfo", "down", "info", "status", "up"]

SERVICES = ("lakefs", "conductor")


@dataclass(frozen=True)
class StackInfo:
    lakefs_endpoint: str
    conductor_url: str
    access_key_id: str
    secret_access_key: str
    lakectl: Path
    stack_dir: Path

    def env(self) -> dict[str, str]:
        return {
            "CONDUCTOR_SERVER_URL": self.conductor_url,
            "LAKECTL_SERVER_ENDPOINT_URL": self.lakefs_endpoint,
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": self.access_key_id,
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": self.secret_access_key,
        }


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    pid: int | None
    url: str
    healthy: bool


def _random(n: int, alphabet: str) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _config(paths: StackPaths) -> dict[str, str]:
    """Credentials and ports, generated once per stack folder and kept (mode 0600)."""
    if paths.credentials.exists():
        saved: dict[str, str] = json.loads(paths.credentials.read_text())
        return saved
    upper = string.ascii_uppercase + string.digits
    config = {
        "access_key_id": "AKIA" + _random(16, upper),
        "secret_access_key": _random(40, string.ascii_letters + string.digits),
        "encrypt_secret": _random(32, string.ascii_letters + string.digits),
        "lakefs_port": os.environ.get("PERAGO_LAKEFS_PORT", "18000"),
        "conductor_port": os.environ.get("PERAGO_CONDUCTOR_PORT", "18080"),
    }
    paths.credentials.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.credentials, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(config, f)
    return config


def info() -> StackInfo:
    paths = stack_paths()
    c = _config(paths)
    return StackInfo(
        lakefs_endpoint=f"http://127.0.0.1:{c['lakefs_port']}",
        conductor_url=f"http://127.0.0.1:{c['conductor_port']}/api",
        access_key_id=c["access_key_id"],
        secret_access_key=c["secret_access_key"],
        lakectl=paths.bin / "lakectl",
        stack_dir=paths.stack,
    )


def _lakefs_yaml(paths: StackPaths, c: dict[str, str]) -> Path:
    data = paths.data / "lakefs"
    text = f"""\
listen_address: "127.0.0.1:{c["lakefs_port"]}"
database: {{ type: local, local: {{ path: "{data}/metadata" }} }}
blockstore: {{ type: local, local: {{ path: "{data}/block" }} }}
committed: {{ local_cache: {{ dir: "{data}/cache" }} }}
auth: {{ encrypt: {{ secret_key: "{c["encrypt_secret"]}" }} }}
installation: {{ user_name: perago, access_key_id: "{c["access_key_id"]}", \
secret_access_key: "{c["secret_access_key"]}" }}
stats: {{ enabled: false }}
security: {{ check_latest_version: false }}
email_subscription: {{ enabled: false }}
"""
    path = paths.run / "lakefs.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _command(paths: StackPaths, service: str, c: dict[str, str]) -> tuple[list[str], Path]:
    if service == "lakefs":
        (paths.data / "lakefs").mkdir(parents=True, exist_ok=True)
        return [str(paths.bin / "lakefs"), "run", "-c", str(_lakefs_yaml(paths, c))], paths.stack
    jar = conductor_jar(paths)
    if jar is None:
        raise StackError("the Conductor server jar is missing: run `perago dev build`")
    data = paths.data / "conductor"
    data.mkdir(parents=True, exist_ok=True)
    return [
        str(find_java()),
        "-Xms256m",
        "-Xmx1536m",
        "-jar",
        str(jar),
        f"--server.port={c['conductor_port']}",
        "--server.address=127.0.0.1",
        f"--spring.datasource.url=jdbc:sqlite:{data}/conductor.db"
        "?busy_timeout=15000&journal_mode=WAL",
        "--conductor.db.type=sqlite",
        "--conductor.queue.type=sqlite",
        "--conductor.indexing.type=sqlite",
        "--conductor.workflow-execution-lock.type=local_only",
        "--conductor.app.ownerEmailMandatory=false",
    ], data


def _health_url(service: str, c: dict[str, str]) -> str:
    if service == "lakefs":
        return f"http://127.0.0.1:{c['lakefs_port']}/api/v1/healthcheck"
    return f"http://127.0.0.1:{c['conductor_port']}/health"


def _port(service: str, c: dict[str, str]) -> int:
    return int(c[f"{service}_port"])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(200 <= r.status < 300)
    except OSError:
        return False


def _ours(paths: StackPaths, pid: int) -> bool:
    """Is ``pid`` a live process started for this stack folder (not a recycled pid)?"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return str(paths.stack) in cmdline or str(paths.bin) in cmdline


def _pid(paths: StackPaths, service: str) -> int | None:
    try:
        pid = int(paths.pid_file(service).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _ours(paths, pid) else None


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _start(paths: StackPaths, service: str, c: dict[str, str]) -> subprocess.Popen[bytes]:
    port = _port(service, c)
    if _port_busy(port):
        env_name = f"PERAGO_{service.upper()}_PORT"
        raise StackError(
            f"port {port} for {service} is in use by another process; stop it, or delete "
            f"{paths.credentials} and set {env_name} to a free port"
        )
    cmd, cwd = _command(paths, service, c)
    log = paths.log_file(service).open("ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFS_")}
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    paths.pid_file(service).write_text(str(proc.pid))
    return proc


def _wait_healthy(
    paths: StackPaths,
    service: str,
    c: dict[str, str],
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    url = _health_url(service, c)
    while time.monotonic() < deadline:
        if _healthy(url):
            return
        if proc is not None and proc.poll() is not None:
            timeout = -1  # it exited: say so below instead of waiting on
            break
        time.sleep(0.5)
    tail = (
        "\n".join(paths.log_file(service).read_text(errors="replace").splitlines()[-20:])
        if paths.log_file(service).exists()
        else ""
    )
    what = "exited" if timeout < 0 else f"did not become healthy at {url} within {timeout:.0f}s"
    raise StackError(f"{service} {what}; last log lines ({paths.log_file(service)}):\n{tail}")


def up(*, progress: bool = False) -> StackInfo:
    """Build if needed, start what is not running, wait until both answer. Idempotent."""
    paths = build(progress=progress)
    c = _config(paths)
    started: dict[str, subprocess.Popen[bytes]] = {}
    for service in SERVICES:
        if _pid(paths, service) is None:
            started[service] = _start(paths, service, c)
    for service, timeout in (("lakefs", 60.0), ("conductor", 240.0)):
        _wait_healthy(paths, service, c, timeout, started.get(service))
    return info()


def _stop(paths: StackPaths, service: str) -> bool:
    pid = _pid(paths, service)
    paths.pid_file(service).unlink(missing_ok=True)
    if pid is None:
        return False
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _ours(paths, pid):
        time.sleep(0.2)
    if _ours(paths, pid):
        os.killpg(pid, signal.SIGKILL)
        while _ours(paths, pid):
            time.sleep(0.1)
    return True


def down(*, wipe: bool = False) -> list[str]:
    """Stop exactly the processes this stack started; with ``wipe`` delete its data too."""
    paths = stack_paths()
    stopped = [s for s in SERVICES if _stop(paths, s)]
    if wipe:
        shutil.rmtree(paths.data, ignore_errors=True)
    return stopped


def restart(service: str) -> None:
    """Stop and start one service (tests kill servers mid-attempt with this)."""
    paths = stack_paths()
    c = _config(paths)
    _stop(paths, service)
    _wait_healthy(paths, service, c, 240.0, _start(paths, service, c))


def status() -> dict[str, ServiceStatus]:
    paths = stack_paths()
    c = _config(paths)
    result = {}
    for service in SERVICES:
        pid = _pid(paths, service)
        url = _health_url(service, c)
        result[service] = ServiceStatus(
            service, pid is not None, pid, url, pid is not None and _healthy(url)
        )
    return result
