"""Start, stop and describe the local stack: lakeFS and Conductor as processes on 127.0.0.1.

Two profiles. ``embedded`` (the default): lakeFS with its embedded local KV store and local
blockstore, Conductor with its embedded SQLite store, so nothing but the stack folder holds
state. ``production``: both on PostgreSQL and lakeFS's objects in an S3 server, each another
local process (:mod:`perago_dev.production`). The processes are detached (their
own session) and outlive the command that started them; ``down`` stops exactly the processes
``up`` started: a pid from a pid file is signalled only while its command line is still this
stack's binary, so a recycled pid is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from perago.errors import StackError
from perago_dev import production
from perago_dev.build import build, conductor_jar, find_java, postgres_bin, step
from perago_dev.paths import SERVICES, StackPaths, exclusive, stack_paths

__all__ = [
    "PROFILES",
    "Credentials",
    "ServiceStatus",
    "StackInfo",
    "conductor_command",
    "down",
    "info",
    "load_credentials",
    "parse_port",
    "render_lakefs_config",
    "resolve_ports",
    "resolve_profile",
    "restart",
    "service_pids",
    "status",
    "up",
]

HOST = "127.0.0.1"
#: Each profile's services, in start order (a later layer needs the earlier ones answering).
PROFILES = {
    "embedded": ("lakefs", "conductor"),
    "production": ("postgres", "s3", "lakefs", "conductor"),
}
PROFILE_ENV = "PERAGO_STACK_PROFILE"
_LAYERS = (("postgres", "s3"), ("lakefs", "conductor"))
DEFAULT_PORTS = {"postgres": 18432, "s3": 18900, "lakefs": 18000, "conductor": 18080}
PORT_ENV = {
    "postgres": "PERAGO_POSTGRES_PORT",
    "s3": "PERAGO_S3_PORT",
    "lakefs": "PERAGO_LAKEFS_PORT",
    "conductor": "PERAGO_CONDUCTOR_PORT",
}
HEALTH_TIMEOUTS = {"postgres": 60.0, "s3": 30.0, "lakefs": 60.0, "conductor": 180.0}
TITLES = {
    "postgres": "PostgreSQL",
    "s3": "S3 (versitygw)",
    "lakefs": "lakeFS",
    "conductor": "Conductor",
}
STOP_GRACE_SECONDS = 15.0
_TAIL_LINES = 20

# Popen objects of processes started by this interpreter: kept so they are reaped after
# ``down`` (no zombies for /proc checks) and never garbage-collected while running.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class StackInfo:
    """How to reach the stack; ``env()`` is what ``perago dev env`` exports."""

    lakefs_endpoint: str
    conductor_url: str
    access_key_id: str
    secret_access_key: str
    lakectl: Path
    stack_dir: Path
    profile: str = "embedded"

    def env(self) -> dict[str, str]:
        env = {
            "CONDUCTOR_SERVER_URL": self.conductor_url,
            "LAKECTL_SERVER_ENDPOINT_URL": self.lakefs_endpoint,
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": self.access_key_id,
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": self.secret_access_key,
        }
        jars = self.stack_dir / "spark-jars"
        if any(jars.glob("*.jar")):  # fetched by `perago dev build` when pyspark is installed
            env["PERAGO_SPARK_JARS_DIR"] = str(jars)
            env["PERAGO_SPARK_JARS_ON_EXECUTORS"] = "true"  # its cluster runs on this machine
        return env


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    pid: int | None
    url: str
    healthy: bool


# -- credentials and ports ---------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """lakeFS's admin keys and its KV encryption secret, and the S3 server's root keys (the
    production profile's): fixed once the data exists."""

    access_key_id: str
    secret_access_key: str
    encrypt_secret: str
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""


def _random(n: int, alphabet: str) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by the owner only, replacing ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(partial, 0o600)
    os.replace(partial, path)


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise StackError(
            f"{path} is unreadable ({e}); fix or delete it (deleting credentials.json needs "
            "`perago dev down --wipe` too, the lakeFS data is bound to its keys)"
        ) from e
    return data if isinstance(data, dict) else {}


def load_credentials(path: Path) -> Credentials:
    """The stack's credentials, generated on first use and kept in ``path`` (mode 0600)."""
    saved = {k: str(v) for k, v in _read_json(path).items()}
    upper = string.ascii_uppercase + string.digits
    alnum = string.ascii_letters + string.digits
    fresh = {
        "access_key_id": lambda: "AKIA" + _random(16, upper),
        "secret_access_key": lambda: _random(40, alnum),
        "encrypt_secret": lambda: _random(48, alnum),
        "s3_access_key_id": lambda: "AKIA" + _random(16, upper),
        "s3_secret_access_key": lambda: _random(40, alnum),
    }
    missing = [k for k in fresh if not saved.get(k)]
    if missing:  # a new stack, or one made before the production profile had S3 keys
        saved.update({k: fresh[k]() for k in missing})
        _write_private(path, json.dumps(saved, indent=2) + "\n")
    return Credentials(**{k: saved[k] for k in fresh})


def parse_port(value: str, *, name: str) -> int:
    """A TCP port from an environment variable, or a StackError naming the variable."""
    try:
        port = int(value.strip())
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise StackError(f"{name}={value!r} is not a TCP port; set it to a number in 1-65535")
    return port


def _saved_ports(paths: StackPaths) -> dict[str, int]:
    saved = _read_json(paths.ports)
    if not saved:  # stacks made before ports.json kept them beside the credentials
        legacy = _read_json(paths.credentials)
        saved = {s: legacy[f"{s}_port"] for s in SERVICES if f"{s}_port" in legacy}
    ports = dict(DEFAULT_PORTS)
    for service in SERVICES:
        value = saved.get(service)
        if isinstance(value, int | str):
            ports[service] = parse_port(str(value), name=f"{service} in {paths.ports}")
    return ports


def resolve_ports(
    paths: StackPaths, env: Mapping[str, str], *, running: frozenset[str] = frozenset()
) -> dict[str, int]:
    """Ports: a running service keeps its saved port; else PERAGO_*_PORT, saved, default."""
    ports = _saved_ports(paths)
    for service in SERVICES:
        requested = env.get(PORT_ENV[service])
        if requested and service not in running:
            ports[service] = parse_port(requested, name=PORT_ENV[service])
    by_port: dict[int, str] = {}
    for service in SERVICES:
        other = by_port.setdefault(ports[service], service)
        if other != service:
            raise StackError(
                f"{TITLES[other]} and {TITLES[service]} cannot share port {ports[service]}; "
                f"set {PORT_ENV[other]} and {PORT_ENV[service]} to different ports"
            )
    return ports


def resolve_profile(requested: str | None, env: Mapping[str, str] | None = None) -> str:
    """The profile asked for: ``requested``, else ``PERAGO_STACK_PROFILE``, else embedded."""
    env = os.environ if env is None else env
    name = requested or env.get(PROFILE_ENV) or "embedded"
    if name not in PROFILES:
        where = "--profile" if requested else PROFILE_ENV
        raise StackError(f"{where}={name!r} is not a profile; use one of {', '.join(PROFILES)}")
    return name


def _saved_profile(paths: StackPaths) -> str:
    """The profile of the last ``up`` (what runs, if anything does)."""
    try:
        name = paths.profile_file.read_text().strip()
    except OSError:
        return "embedded"
    return name if name in PROFILES else "embedded"


def _data_dir(paths: StackPaths, profile: str, service: str) -> Path:
    if service == "postgres":
        return production.postgres_data(paths)
    # The embedded profile's folders predate profiles: data/<service>.
    return paths.data / service if profile == "embedded" else paths.data / profile / service


# -- what runs --------------------------------------------------------------------------------


def render_lakefs_config(
    *,
    data: Path,
    port: int,
    credentials: Credentials,
    blockstore: str | None = None,
    database: str | None = None,
    actions: bool = True,
) -> str:
    """lakeFS's config: loopback only, local KV and blockstore, no phoning home.

    ``blockstore`` and ``database`` replace the local blockstore and KV (YAML flow mappings,
    see :mod:`perago_dev.production`); ``actions=False`` makes lakeFS run no hooks."""
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar
    c = credentials
    local = f"{{ type: local, local: {{ path: {q(str(data / 'block'))} }} }}"
    kv = f"{{ type: local, local: {{ path: {q(str(data / 'metadata'))} }} }}"
    return (
        f"listen_address: {q(f'{HOST}:{port}')}\n"
        f"database: {database or kv}\n"
        f"blockstore: {blockstore or local}\n"
        f"committed: {{ local_cache: {{ dir: {q(str(data / 'cache'))} }} }}\n"
        f"auth: {{ encrypt: {{ secret_key: {q(c.encrypt_secret)} }} }}\n"
        f"installation: {{ user_name: perago, access_key_id: {q(c.access_key_id)}, "
        f"secret_access_key: {q(c.secret_access_key)} }}\n"
        "gateways: { s3: { region: us-east-1 } }\n"
        "stats: { enabled: false }\n"
        "security: { check_latest_version: false }\n"
        "email_subscription: { enabled: false }\n"
        + ("" if actions else "actions: { enabled: false }\n")
    )


def conductor_command(
    *, java: Path, jar: Path, data: Path, port: int, postgres_port: int | None = None
) -> list[str]:
    """Conductor on loopback with its embedded SQLite store (or all on PostgreSQL, given
    ``postgres_port``), tuned for a quick local start."""
    db = f"jdbc:sqlite:{data / 'conductor.db'}?busy_timeout=15000&journal_mode=WAL"
    if postgres_port is None:
        store = [
            f"--spring.datasource.url={db}",
            "--conductor.db.type=sqlite",
            "--conductor.queue.type=sqlite",
            "--conductor.indexing.type=sqlite",
            "--conductor.workflow-execution-lock.type=local_only",
        ]
    else:
        store = production.conductor_postgres_args(postgres_port, port)
    return [
        str(java),
        # A small single-user server: the serial GC starts it as fast with ~100 MB less memory.
        "-XX:+UseSerialGC",
        "-Xms256m",
        "-Xmx1g",
        "-jar",
        str(jar),
        f"--server.port={port}",
        f"--server.address={HOST}",
        *store,
        "--conductor.app.ownerEmailMandatory=false",
        "--conductor.integrations.ai.enabled=false",
        "--conductor.scheduler.enabled=false",
        # One sweeper thread polling twice a second instead of 2 x CPUs threads polling every
        # 100 ms: idle CPU drops from ~12 % to ~5 % of a core, sweeps start <= 1 s late.
        "--conductor.app.sweeperThreadCount=1",
        "--conductor.app.sweeper.queuePopTimeout=500",
    ]


def _endpoint(service: str, port: int) -> str:
    if service == "postgres":
        return f"postgresql://{HOST}:{port}"
    return f"http://{HOST}:{port}" + ("/api" if service == "conductor" else "")


def _health_url(service: str, port: int) -> str:
    path = "/api/v1/healthcheck" if service == "lakefs" else "/health"
    return f"http://{HOST}:{port}{path}"


def _answers(service: str, port: int) -> bool:
    if service == "postgres":
        return production.postgres_ready(postgres_bin(), port)
    return _healthy(_health_url(service, port))


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def _healthy(url: str) -> bool:
    try:
        with _opener.open(url, timeout=2) as r:
            return 200 <= int(r.status) < 300
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _cmdline(pid: int) -> list[str] | None:
    """The live process's argv, or None if it is gone (zombies count as gone)."""
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            raw = (proc / "cmdline").read_bytes()
        except OSError:
            return None
        return raw.decode(errors="replace").split("\0")[:-1] or None
    done = subprocess.run(  # no /proc (macOS): ps is the portable way
        ["ps", "-ww", "-o", "command=", "-p", str(pid)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.split() or None


def _ours(paths: StackPaths, service: str, pid: int) -> bool:
    """Is ``pid`` alive and still this stack's ``service`` (and not a recycled pid)?"""
    argv = _cmdline(pid)
    if not argv:
        return False
    if service == "lakefs":
        return argv[0] == str(paths.bin / "lakefs")
    if service == "s3":
        return argv[0] == str(paths.bin / "versitygw")
    if service == "postgres":  # the postmaster keeps its command line; backends retitle theirs
        return argv[0].endswith("/postgres") and str(production.postgres_data(paths)) in argv
    jars = str(paths.conductor_jars) + os.sep
    return any(a.startswith(jars) and a.endswith(".jar") for a in argv)


def _alive(paths: StackPaths, service: str, pid: int) -> bool:
    """Is the service process ``pid`` still running?"""
    proc = _children.get(pid)
    if proc is not None:  # ours for sure, and maybe not yet exec'd: its argv is still Python's
        return proc.poll() is None
    return _ours(paths, service, pid)


def _pid(paths: StackPaths, service: str) -> int | None:
    """The verified pid of a running service, from its pid file."""
    try:
        pid = int(paths.pid_file(service).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(paths, service, pid) else None


def _running(paths: StackPaths) -> dict[str, int]:
    return {s: pid for s in SERVICES if (pid := _pid(paths, s)) is not None}


def service_pids() -> dict[str, int]:
    """The running services of this stack and their verified pids (benchmarks read their
    CPU time)."""
    return _running(stack_paths())


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _locked(paths: StackPaths) -> contextlib.AbstractContextManager[None]:
    """One ``up``/``down`` at a time per stack folder."""
    return exclusive(paths.run / ".lock")


def _check_port_free(service: str, port: int) -> None:
    if not _port_free(port):
        raise StackError(
            f"port {port} is in use by another process; stop it or set {PORT_ENV[service]}"
        )


def _lakefs_config(
    paths: StackPaths, profile: str, ports: Mapping[str, int], creds: Credentials
) -> str:
    data = _data_dir(paths, profile, "lakefs")
    if profile == "embedded":
        return render_lakefs_config(data=data, port=ports["lakefs"], credentials=creds)
    blockstore = production.lakefs_blockstore(
        s3_port=ports["s3"], s3_key=creds.s3_access_key_id, s3_secret=creds.s3_secret_access_key
    )
    database = production.lakefs_database(ports["postgres"])
    return render_lakefs_config(
        data=data,
        port=ports["lakefs"],
        credentials=creds,
        blockstore=blockstore,
        database=database,
    )


def _command(
    paths: StackPaths, profile: str, service: str, ports: Mapping[str, int], creds: Credentials
) -> tuple[list[str], dict[str, str], str | None]:
    """What to run for ``service``: argv, environment, and the account to run it as."""
    data = _data_dir(paths, profile, service)
    port = ports[service]
    if service == "postgres":
        bin_dir = postgres_bin()
        production.init_postgres(bin_dir, data, paths.log_file(service))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        return production.postgres_command(bin_dir, data, port), env, production.postgres_user()
    data.mkdir(parents=True, exist_ok=True)
    if service == "s3":
        cmd = production.versitygw_command(
            paths.bin / "versitygw", data, port, paths.logs / "s3-access.log"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VGW_", "ROOT_"))}
        env["ROOT_ACCESS_KEY_ID"] = creds.s3_access_key_id
        env["ROOT_SECRET_ACCESS_KEY"] = creds.s3_secret_access_key
        return cmd, env, None
    if service == "lakefs":
        _write_private(paths.lakefs_config, _lakefs_config(paths, profile, ports, creds))
        cmd = [str(paths.bin / "lakefs"), "run", "-c", str(paths.lakefs_config)]
        # lakeFS reads LAKEFS_* over its config file: the stack's config must be all there is.
        return cmd, {k: v for k, v in os.environ.items() if not k.startswith("LAKEFS_")}, None
    jar = conductor_jar(paths)
    if jar is None:
        raise StackError("the Conductor server jar is missing: run `perago dev build`")
    pg_port = ports["postgres"] if profile == "production" else None
    cmd = conductor_command(java=find_java(), jar=jar, data=data, port=port, postgres_port=pg_port)
    # Spring maps SPRING_*/CONDUCTOR_* variables onto properties; keep the user's out.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPRING_", "CONDUCTOR_", "SERVER_"))
    }
    return cmd, env, None


def _start(
    paths: StackPaths, profile: str, service: str, ports: Mapping[str, int], creds: Credentials
) -> int:
    _check_port_free(service, ports[service])
    cmd, env, user = _command(paths, profile, service, ports, creds)
    data = _data_dir(paths, profile, service)
    log = paths.log_file(service)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} perago dev up: ".encode())
        out.write(" ".join(cmd).encode() + b"\n")
        out.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=data,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group, no SIGINT from the terminal
            user=user,
        )
    _children[proc.pid] = proc
    paths.pid_file(service).write_text(f"{proc.pid}\n")
    return proc.pid


def _wait_healthy(paths: StackPaths, service: str, pid: int, port: int, timeout: float) -> None:
    url = _endpoint(service, port) if service == "postgres" else _health_url(service, port)
    deadline = time.monotonic() + timeout
    while True:
        if _answers(service, port):
            return
        alive = _alive(paths, service, pid)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    log = paths.log_file(service)
    what = "exited" if not alive else f"did not answer {url} within {timeout:.0f}s"
    if alive:
        _stop_all(paths, [service])
    raise StackError(
        f"{TITLES[service]} {what}; last lines of {log}:\n{_tail(log)}\n"
        f"fix the cause (see the full log) and run `perago dev up` again"
    )


def _check_ports_unchanged(ports: Mapping[str, int], running: Mapping[str, int]) -> None:
    for service in running:
        requested = os.environ.get(PORT_ENV[service])
        if requested and parse_port(requested, name=PORT_ENV[service]) != ports[service]:
            raise StackError(
                f"{TITLES[service]} is running on port {ports[service]} but "
                f"{PORT_ENV[service]}={requested}; run `perago dev down` first to move it"
            )


def _save_ports(paths: StackPaths, ports: Mapping[str, int]) -> None:
    _write_private(paths.ports, json.dumps(dict(ports), indent=2) + "\n")


def _say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def _ready(paths: StackPaths, service: str, ports: Mapping[str, int], creds: Credentials) -> None:
    """What a service needs inside before the next layer starts: databases, the bucket."""
    if service == "postgres":
        production.ensure_databases(postgres_bin(), ports["postgres"])
    elif service == "s3":
        production.ensure_bucket(ports["s3"], creds.s3_access_key_id, creds.s3_secret_access_key)
    elif service == "lakefs":
        _setup_lakefs(ports["lakefs"], creds)


def _setup_lakefs(port: int, creds: Credentials) -> None:
    """Create the admin user with the stack's keys if lakeFS is not set up yet: its local KV
    does this from ``installation`` itself, its PostgreSQL KV waits for the setup call."""
    base = f"http://{HOST}:{port}/api/v1/setup_lakefs"
    with _opener.open(base, timeout=10) as r:
        if json.loads(r.read()).get("state") == "initialized":
            return
    body = {
        "username": "perago",
        "key": {"access_key_id": creds.access_key_id, "secret_access_key": creds.secret_access_key},
    }
    request = urllib.request.Request(
        base, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        _opener.open(request, timeout=30).close()
    except urllib.error.HTTPError as e:
        if e.code != 409:  # 409: another `up` set it up meanwhile
            raise StackError(
                f"setting up lakeFS's admin user failed with HTTP {e.code}: {e.read()[:300]!r}; "
                "see .stack/logs/lakefs.log"
            ) from e


def _check_profile(paths: StackPaths, profile: str, running: Mapping[str, int]) -> None:
    current = _saved_profile(paths)
    if running and current != profile:
        raise StackError(
            f"the {current} stack is running; run `perago dev down` before starting the "
            f"{profile} one (each keeps its own data)"
        )


def up(*, progress: bool = False, profile: str | None = None, webui: bool = True) -> StackInfo:
    """Build if needed, start what is not running, wait until all answer. Idempotent.

    ``profile``: ``embedded`` or ``production`` (default: ``PERAGO_STACK_PROFILE``, else the
    running stack's, else embedded); a running stack of another profile than the one asked
    for is an error, not replaced."""
    paths = stack_paths()
    if profile is None and not os.environ.get(PROFILE_ENV) and _running(paths):
        profile = _saved_profile(paths)  # plain `up` reuses whichever stack runs
    profile = resolve_profile(profile)
    wanted = PROFILES[profile]
    binaries = [paths.bin / "lakefs", paths.bin / "lakectl"]
    if profile == "production":
        binaries.append(paths.bin / "versitygw")
    if paths.root is not None or not all(b.exists() for b in binaries):
        build(progress=progress, production=profile == "production", webui=webui)
    paths.make()
    with _locked(paths):
        running = _running(paths)
        _check_profile(paths, profile, running)
        ports = resolve_ports(paths, os.environ, running=frozenset(running))
        _check_ports_unchanged(ports, running)
        _save_ports(paths, ports)
        paths.profile_file.write_text(profile + "\n")
        creds = load_credentials(paths.credentials)
        for service in wanted:  # before starting anything: fail without leftovers
            if service not in running:
                _check_port_free(service, ports[service])
        pids = dict(running)
        for layer in _LAYERS:
            services = [s for s in layer if s in wanted]
            for service in services:
                if service in running:
                    _say(f"{TITLES[service]} already running (pid {running[service]})", progress)
                else:
                    pids[service] = _start(paths, profile, service, ports, creds)
            for service in services:
                message = f"starting {TITLES[service]} on {_endpoint(service, ports[service])}"
                with step(message, progress=progress and service not in running):
                    _wait_healthy(
                        paths, service, pids[service], ports[service], HEALTH_TIMEOUTS[service]
                    )
                    _ready(paths, service, ports, creds)
    return info()


def _signal(service: str, pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if service == "postgres":  # the postmaster stops its backends: SIGINT is a fast shutdown
            os.kill(pid, signal.SIGINT if sig == signal.SIGTERM else sig)
        # start_new_session made each service a process group: stop helpers too
        elif os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    proc = _children.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            del _children[pid]
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _stop_all(paths: StackPaths, services: list[str]) -> list[str]:
    """SIGTERM, then SIGKILL after the grace period; return once every process is gone."""
    pids = {s: pid for s in services if (pid := _pid(paths, s)) is not None}
    for service, pid in pids.items():
        _signal(service, pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    killed = False
    while True:
        for pid in pids.values():
            _reap(pid)
        alive = [s for s, pid in pids.items() if _alive(paths, s, pid)]
        if not alive:
            break
        if not killed and time.monotonic() > deadline:
            for s in alive:
                _signal(s, pids[s], signal.SIGKILL)
            killed = True
        time.sleep(0.1)
    for service in services:
        paths.pid_file(service).unlink(missing_ok=True)
    return [s for s in SERVICES if s in pids]


def down(*, wipe: bool = False) -> list[str]:
    """Stop exactly the processes this stack started; ``wipe`` also deletes its data."""
    paths = stack_paths()
    with _locked(paths):
        stopped = _stop_all(paths, list(reversed(SERVICES)))
        if wipe:
            shutil.rmtree(paths.data, ignore_errors=True)
            shutil.rmtree(production.postgres_data(paths), ignore_errors=True)
            (paths.logs / "s3-access.log").unlink(missing_ok=True)
    return stopped


def restart(service: str) -> None:
    """Stop one service and start it again (tests take servers away mid-attempt)."""
    paths = stack_paths()
    with _locked(paths):
        ports = resolve_ports(paths, {}, running=frozenset(SERVICES))
        _stop_all(paths, [service])
        creds = load_credentials(paths.credentials)
        pid = _start(paths, _saved_profile(paths), service, ports, creds)
        _wait_healthy(paths, service, pid, ports[service], HEALTH_TIMEOUTS[service])


def status() -> dict[str, ServiceStatus]:
    """Each service: is our process running, its pid, its URL, does it answer its health check."""
    paths = stack_paths()
    running = _running(paths)
    ports = resolve_ports(paths, os.environ, running=frozenset(running))
    result = {}
    for service in PROFILES[_saved_profile(paths)]:
        pid = running.get(service)
        healthy = pid is not None and _answers(service, ports[service])
        url = _endpoint(service, ports[service])
        result[service] = ServiceStatus(service, pid is not None, pid, url, healthy)
    return result


def info() -> StackInfo:
    """Where the stack is (or will be) and its credentials; starts nothing."""
    paths = stack_paths()
    running = _running(paths)
    ports = resolve_ports(paths, os.environ, running=frozenset(running))
    creds = load_credentials(paths.credentials)
    return StackInfo(
        lakefs_endpoint=_endpoint("lakefs", ports["lakefs"]),
        conductor_url=_endpoint("conductor", ports["conductor"]),
        access_key_id=creds.access_key_id,
        secret_access_key=creds.secret_access_key,
        lakectl=paths.bin / "lakectl",
        stack_dir=paths.stack,
        profile=_saved_profile(paths),
    )
