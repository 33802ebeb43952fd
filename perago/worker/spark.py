"""One Spark session per worker process: created on first use, reused, rebuilt if dead.

The master comes from settings: ``local[*]`` by default, a ``spark://`` standalone master,
or Spark Connect (``sc://host:port``).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from perago.config import Settings
from perago.errors import ConfigError
from perago.telemetry.failure_text import describe

__all__ = ["SparkSessions", "SparkTarget", "s3a_conf", "s3a_jars", "spark_tag", "spark_target"]

log = structlog.get_logger("perago.spark")


def s3a_jars(settings: Settings) -> list[Path]:
    """The S3A connector's jars fetched at build time (``perago dev build`` puts them in the
    stack folder, the worker image in ``/opt/perago/spark-jars``), or [] if not configured."""
    folder = settings.spark_jars_dir
    if folder is None:
        return []
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise ConfigError(
            f"PERAGO_SPARK_JARS_DIR={folder} holds no jars: run `perago dev build` (it fetches "
            "hadoop-aws and the AWS SDK bundle with Maven) or point it at a folder that has them"
        )
    return jars


def s3a_conf(settings: Settings, *, connect: bool = False, local: bool = False) -> dict[str, str]:
    """Spark settings that route ``s3a://<repo>/<ref>/<path>`` to the lakeFS S3 gateway.

    Classic sessions get the connector's jars from ``PERAGO_SPARK_JARS_DIR`` (no network at
    run time), else from Maven Central through Ivy on first use. With a ``local`` master the
    executors live in the driver JVM, so the jars go on its class path where they lie;
    ``spark.jars`` would copy their 660 MB into a temporary folder at every session start,
    left behind whenever the JVM is killed. A cluster master ships them with ``spark.jars``
    (each executor copies them), unless they lie at the same path on the executors' hosts
    (``PERAGO_SPARK_JARS_ON_EXECUTORS``): then both class paths name them.
    A Spark Connect server must carry the jars itself (``--jars``); the client sets the
    ``fs.s3a.*`` options as session settings, which Spark applies to the Hadoop
    configuration of each read and write.
    """
    endpoint = settings.lakefs_endpoint
    hadoop = {
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https")).lower(),
        "fs.s3a.access.key": settings.lakefs_access_key_id,
        "fs.s3a.secret.key": settings.lakefs_secret_access_key.get_secret_value(),
        "fs.s3a.change.detection.mode": "none",
    }
    if connect:
        return hadoop
    conf = {f"spark.hadoop.{k}": v for k, v in hadoop.items()}
    jars = s3a_jars(settings)
    if jars and (local or settings.spark_jars_on_executors):
        conf["spark.driver.extraClassPath"] = os.pathsep.join(str(j) for j in jars)
        if not local:  # executors on hosts that have them at the same path
            conf["spark.executor.extraClassPath"] = conf["spark.driver.extraClassPath"]
    elif jars:
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    else:
        log.warning(
            "spark_s3a_jars_from_ivy",
            package=settings.spark_s3a_package,
            hint="set PERAGO_SPARK_JARS_DIR to jars fetched at build time (perago dev build)",
        )
        conf["spark.jars.packages"] = settings.spark_s3a_package
        conf["spark.jars.ivy"] = str(settings.spark_ivy_dir)
    return conf


#: log4j2 configuration of the driver JVM Perago starts: Spark's own warnings and errors
#: with stack traces cut at 12 lines (a StackOverflowError's is thousands of lines long).
_LOG4J2 = """\
status = error
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex{12}
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


def _log4j2_config() -> Path:
    path = Path(tempfile.gettempdir()) / "perago-spark-log4j2.properties"
    if not path.is_file() or path.read_text() != _LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2)
        os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class SparkTarget:
    """Where the worker's Spark session runs, and who said so."""

    #: ``local[*]``-style master, ``spark://...``/``k8s://...``/``yarn`` master, or an
    #: ``sc://`` Spark Connect remote.
    url: str
    #: Where it came from: ``PERAGO_SPARK_MASTER``, ``PERAGO_SPARK_CONF``, ``SPARK_REMOTE``,
    #: ``MASTER``, ``spark-defaults.conf (<path>)`` or ``Perago's default``.
    source: str

    @property
    def connect(self) -> bool:
        return self.url.startswith("sc://")

    @property
    def local(self) -> bool:
        """Driver and executors in the worker's own process tree (they share its disk)."""
        return self.url.startswith("local")


def _defaults_conf(env: Mapping[str, str]) -> Path | None:
    folder = env.get("SPARK_CONF_DIR") or (
        str(Path(env["SPARK_HOME"]) / "conf") if env.get("SPARK_HOME") else None
    )
    path = Path(folder) / "spark-defaults.conf" if folder else None
    return path if path is not None and path.is_file() else None


def _from_defaults(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and not parts[0].startswith("#"):
            found[parts[0]] = parts[1].strip()
    return found


def spark_target(settings: Settings, env: Mapping[str, str] | None = None) -> SparkTarget:
    """The master or remote the session uses: Perago's own setting if given, else the
    user's Spark configuration (``PERAGO_SPARK_CONF``, ``SPARK_REMOTE``, ``MASTER``,
    ``spark-defaults.conf``), else ``local[*]``: Perago's default only fills a gap."""
    env = os.environ if env is None else env
    if settings.spark_master:
        return SparkTarget(settings.spark_master, "PERAGO_SPARK_MASTER")
    for key in ("spark.remote", "spark.master"):
        if settings.spark_conf.get(key):
            return SparkTarget(settings.spark_conf[key], f"PERAGO_SPARK_CONF ({key})")
    for name in ("SPARK_REMOTE", "MASTER"):
        if env.get(name):
            return SparkTarget(env[name], name)
    path = _defaults_conf(env)
    if path is not None:
        defaults = _from_defaults(path)
        for key in ("spark.remote", "spark.master"):
            if defaults.get(key):
                return SparkTarget(defaults[key], f"spark-defaults.conf ({path})")
    return SparkTarget("local[*]", "Perago's default")


def spark_tag(task_id: str) -> str:
    """The job tag of one attempt's Spark work (tags allow no commas)."""
    return "perago-" + task_id.replace(",", "_")


class SparkSessions:
    """Lazily builds the worker's session; call :meth:`stop` on shutdown."""

    def __init__(self, settings: Settings, *, s3a: bool = False) -> None:
        self._settings = settings
        self._s3a = s3a
        self._session: Any = None
        self._lock = threading.Lock()

    #: Why the last attempt to build a session failed (None: fine); readiness reports it.
    problem: str | None = None

    def __call__(self) -> Any:
        with self._lock:
            if self._session is not None and not self._alive(self._session):
                log.warning("spark_session_dead_rebuilding")
                self._stop_locked()
                _forget_dead_jvm()
            if self._session is None:
                try:
                    self._session = self._build()
                except Exception as e:
                    self.problem = f"cannot start a Spark session: {describe(e)}"
                    log.error("spark_session_unavailable", error=self.problem)
                    _forget_dead_jvm()  # the next attempt starts from scratch
                    raise
                self.problem = None
            return self._session

    def _build(self) -> Any:
        try:  # imported lazily: the JVM starts only if needed; pyspark is an extra
            from pyspark.sql import SparkSession
        except ImportError as e:
            raise ConfigError(
                "this worker runs Spark tasks but pyspark is not installed: install "
                "perago-runtime[spark]"
            ) from e

        target = self.target
        conf = dict(self._settings.spark_conf)
        builder = SparkSession.builder.appName("perago-worker")
        if target.source.startswith("PERAGO_"):
            # Perago's own setting: say it explicitly. Otherwise leave the master alone, so
            # spark-defaults.conf, MASTER and SPARK_REMOTE keep meaning what they mean.
            builder = builder.remote(target.url) if target.connect else builder.master(target.url)
        elif target.source == "Perago's default":
            builder = builder.master(target.url)
        if not target.connect:
            # Static settings of the driver JVM Perago starts (Connect's server has its own).
            conf.setdefault("spark.ui.enabled", "false")
            if target.local:
                conf.setdefault("spark.driver.bindAddress", "127.0.0.1")
                conf.setdefault("spark.driver.host", "127.0.0.1")
            # No _SUCCESS markers: a publication is atomic already (docs/tasks.md, Spark).
            conf.setdefault(
                "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs", "false"
            )
            # The driver JVM's own log: warnings, stack traces cut to a few lines.
            conf.setdefault(
                "spark.driver.extraJavaOptions",
                f"-Dlog4j2.configurationFile=file:{_log4j2_config()}",
            )
        if self._s3a:
            s3a = s3a_conf(self._settings, connect=target.connect, local=target.local)
            for key, value in s3a.items():
                if key == "spark.driver.extraClassPath" and conf.get(key):
                    value = f"{conf[key]}{os.pathsep}{value}"  # the user's entries first
                    conf[key] = value
                conf.setdefault(key, value)
        for key, value in conf.items():
            if key not in ("spark.master", "spark.remote"):
                builder = builder.config(key, value)
        session = builder.getOrCreate()
        log.info(
            "spark_session_started",
            master=target.url,
            master_from=target.source,
            connect=target.connect,
            version=session.version,
        )
        return session

    @property
    def target(self) -> SparkTarget:
        return spark_target(self._settings)

    @staticmethod
    def _alive(session: Any) -> bool:
        if type(session).__module__.startswith("pyspark.sql.connect"):
            # Spark Connect: the server owns the session's life. (Classic sessions raise on
            # Connect-only attributes such as ``client``: ask the class, not the object.)
            return not getattr(session, "is_stopped", False)
        # Cheap: asks the JVM whether the context was stopped (a killed driver raises).
        try:
            return not session.sparkContext._jsc.sc().isStopped()
        except AttributeError:
            return True  # Spark Connect: the server owns the session's life
        except Exception:  # noqa: BLE001 - a dead JVM gateway fails in many ways
            return False

    def interrupt(self, task_ids: list[str]) -> None:
        """Interrupt the Spark jobs of these attempts only (their tags), so blocked bodies
        return at the drain's end; other attempts' jobs go on (classic and Spark Connect)."""
        session = self._session
        if session is None:
            return
        for task_id in task_ids:
            try:
                session.interruptTag(spark_tag(task_id))
                log.info("spark_jobs_interrupted", task_id=task_id)
            except Exception as e:  # noqa: BLE001 - best effort during shutdown
                log.warning("spark_interrupt_failed", task_id=task_id, error=describe(e))

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        if self._session is not None:
            try:
                self._session.stop()
            except Exception as e:  # noqa: BLE001 - stopping a broken session may fail too
                log.warning("spark_stop_failed", error=str(e))
            self._session = None


def _forget_dead_jvm() -> None:
    """Make PySpark launch a new JVM next time. PySpark keeps its gateway, JVM view and
    sessions in class attributes and reuses them as long as they are set, so after its JVM
    died (a StackOverflowError, an OOM kill) every ``getOrCreate`` would hand back the dead
    session; ``SparkSession.stop`` cannot clear them because it needs the JVM to do it."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
        from pyspark.sql.context import SQLContext
    except ImportError:
        return
    with SparkContext._lock:
        gateway = SparkContext._gateway
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    SQLContext._instantiatedContext = None
    if gateway is None:
        return
    try:
        gateway.shutdown()
    except Exception as e:  # noqa: BLE001 - the other end is gone: nothing to shut down
        log.debug("spark_gateway_shutdown_failed", error=str(e))
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.poll() is None:
        proc.kill()  # a JVM that stopped answering but did not exit
        proc.wait(timeout=10)
    log.info("spark_jvm_forgotten", pid=getattr(proc, "pid", None))
