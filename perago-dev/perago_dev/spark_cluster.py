"""A Spark cluster beside the local stack: a standalone master, two workers and a Spark
Connect server, all from the installed pyspark distribution, on 127.0.0.1.

``perago dev up --spark`` starts it (after lakeFS and Conductor), ``perago dev down`` stops
it with the rest (``--spark`` only it), ``perago dev env`` exports ``SPARK_MASTER_URL`` and
``SPARK_CONNECT_URL`` (not ``MASTER``/``SPARK_REMOTE``: a worker uses the cluster only when
told, ``PERAGO_SPARK_MASTER=$SPARK_CONNECT_URL``). The Connect server runs its jobs on the
standalone cluster and carries the S3A connector's jars (``<stack>/spark-jars``), so in-place
tasks work through it. Pids and logs live in the stack folder like the servers'.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from perago.errors import StackError
from perago_dev.paths import StackPaths, stack_paths

__all__ = ["PROCESSES", "SparkCluster", "cluster", "down", "up"]

HOST = "127.0.0.1"
DEFAULT_PORTS = {"master": 18077, "connect": 18015}
PORT_ENV = {"master": "PERAGO_SPARK_MASTER_PORT", "connect": "PERAGO_SPARK_CONNECT_PORT"}
#: Start order (``down`` stops in reverse); each is one JVM.
PROCESSES = ("spark-master", "spark-worker-1", "spark-worker-2", "spark-connect")
_CLASSES = {
    "spark-master": "org.apache.spark.deploy.master.Master",
    "spark-worker-1": "org.apache.spark.deploy.worker.Worker",
    "spark-worker-2": "org.apache.spark.deploy.worker.Worker",
    "spark-connect": "org.apache.spark.sql.connect.service.SparkConnectServer",
}
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class SparkCluster:
    master_url: str
    connect_url: str

    def env(self) -> dict[str, str]:
        return {"SPARK_MASTER_URL": self.master_url, "SPARK_CONNECT_URL": self.connect_url}


def _spark_home() -> Path:
    try:
        import pyspark
    except ImportError as e:
        raise StackError(
            "perago dev up --spark needs pyspark: install perago-runtime[spark]"
        ) from e
    return Path(pyspark.__file__).resolve().parent


def _ports(env: Mapping[str, str], paths: StackPaths | None = None) -> dict[str, int]:
    """The ports: those the running cluster saved, else PERAGO_SPARK_*_PORT, else defaults."""
    if paths is not None:
        with contextlib.suppress(OSError, ValueError):
            saved = json.loads((paths.run / "spark.json").read_text())
            return {name: int(saved[name]) for name in DEFAULT_PORTS}
    ports = {}
    for name, default in DEFAULT_PORTS.items():
        raw = env.get(PORT_ENV[name])
        try:
            ports[name] = int(raw) if raw else default
        except ValueError as e:
            raise StackError(f"{PORT_ENV[name]}={raw!r} is not a port number") from e
    return ports


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((HOST, port)) == 0


def _pid(paths: StackPaths, name: str) -> int | None:
    """The pid of a running cluster process of this stack (checked by its argv)."""
    try:
        pid = int(paths.pid_file(name).read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if _CLASSES[name].encode() in argv else None


def _command(home: Path, name: str, ports: Mapping[str, int], paths: StackPaths) -> list[str]:
    master = f"spark://{HOST}:{ports['master']}"
    if name == "spark-master":
        return [
            str(home / "bin" / "spark-class"),
            _CLASSES[name],
            "--host",
            HOST,
            "--port",
            str(ports["master"]),
            "--webui-port",
            "0",
        ]
    if name.startswith("spark-worker"):
        work = paths.data / "spark" / name
        work.mkdir(parents=True, exist_ok=True)
        return [
            str(home / "bin" / "spark-class"),
            _CLASSES[name],
            master,
            "--host",
            HOST,
            # Two slots and 2 GiB each: the Connect server's executors take one slot and
            # 768 MiB per worker (spark.cores.max below), leaving room for a second
            # application (a worker's own driver on spark://) beside it.
            "--cores",
            "2",
            "--memory",
            "2g",
            "--webui-port",
            "0",
            "--work-dir",
            str(work),
        ]
    jars = sorted(paths.spark_jars.glob("*.jar"))
    return [
        str(home / "bin" / "spark-submit"),
        "--class",
        _CLASSES[name],
        "--master",
        master,
        *(["--jars", ",".join(str(j) for j in jars)] if jars else []),
        "--conf",
        f"spark.connect.grpc.binding.port={ports['connect']}",
        "--conf",
        f"spark.connect.grpc.binding.address={HOST}",
        "--conf",
        f"spark.driver.bindAddress={HOST}",
        "--conf",
        f"spark.driver.host={HOST}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.executor.memory=768m",
        "--conf",
        "spark.cores.max=2",
    ]


def _wait(name: str, port: int | None, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``port`` answers (None: until the process has stayed up for 3 s)."""
    deadline = time.monotonic() + (START_TIMEOUT if port is not None else 3)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise StackError(f"{name} exited with {proc.returncode}:\n{tail}\nfull log: {log}")
        if port is not None and _answers(port):
            return
        time.sleep(0.5)
    if port is not None:
        raise StackError(
            f"{name} did not answer on port {port} within {START_TIMEOUT:.0f}s; see {log}"
        )


def up(*, progress: bool = False, env: Mapping[str, str] | None = None) -> SparkCluster:
    """Start what is not running of the cluster (idempotent); needs the stack's folder."""
    env = os.environ if env is None else env
    paths = stack_paths()
    paths.make()
    home = _spark_home()
    running = cluster(env)
    ports = _ports(env, paths if running is not None else None)
    (paths.run / "spark.json").write_text(json.dumps(ports))
    child_env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": HOST,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOG_DIR": str(paths.logs),
        "SPARK_NO_DAEMONIZE": "1",
        # Every application copies the S3A jars (660 MB) into each worker's work folder:
        # drop a finished application's folder a minute after it ends.
        "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true "
        "-Dspark.worker.cleanup.interval=60 -Dspark.worker.cleanup.appDataTtl=60",
    }
    for name in PROCESSES:
        if _pid(paths, name) is not None:
            continue
        log = paths.logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                _command(home, name, ports, paths),
                env=child_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        paths.pid_file(name).write_text(str(proc.pid))
        if progress:
            print(f"starting {name} (pid {proc.pid})", file=sys.stderr, flush=True)
        port = {"spark-master": ports["master"], "spark-connect": ports["connect"]}.get(name)
        _wait(name, port, proc, log)
    running = cluster(env)
    if running is None:
        raise StackError(f"the Spark cluster did not come up; see {paths.logs}/spark-*.log")
    return running


def cluster(env: Mapping[str, str] | None = None) -> SparkCluster | None:
    """The running cluster's addresses, or None if it does not run."""
    paths = stack_paths()
    if any(_pid(paths, name) is None for name in PROCESSES):
        return None
    ports = _ports(os.environ if env is None else env, paths)
    return SparkCluster(f"spark://{HOST}:{ports['master']}", f"sc://{HOST}:{ports['connect']}")


def down() -> list[str]:
    """Stop the cluster's processes (Connect server first); the names of those stopped."""
    paths = stack_paths()
    stopped = []
    for name in reversed(PROCESSES):
        pid = _pid(paths, name)
        if pid is None:
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 20
        while _pid(paths, name) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid(paths, name) is not None:
            os.killpg(pid, signal.SIGKILL)
        paths.pid_file(name).unlink(missing_ok=True)
        stopped.append(name)
    for work in (paths.data / "spark").glob("spark-worker-*"):
        shutil.rmtree(work, ignore_errors=True)  # scratch: applications' jars and logs
    return stopped
