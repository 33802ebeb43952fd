"""One Spark session per worker process: created on first use, reused, rebuilt if dead.

The master comes from settings: ``local[*]`` by default, a ``spark://`` standalone master,
or Spark Connect (``sc://host:port``).
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import structlog

from perago.config import Settings
from perago.errors import ConfigError
from perago.failure_text import describe

__all__ = ["SparkSessions", "s3a_conf"]

log = structlog.get_logger("perago.spark")


def s3a_conf(settings: Settings) -> dict[str, str]:
    """Spark settings that route ``s3a://<repo>/<ref>/<path>`` to the lakeFS S3 gateway."""
    endpoint = settings.lakefs_endpoint
    return {
        "spark.jars.packages": settings.spark_s3a_package,
        "spark.jars.ivy": str(settings.spark_ivy_dir),
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https")).lower(),
        "spark.hadoop.fs.s3a.access.key": settings.lakefs_access_key_id,
        "spark.hadoop.fs.s3a.secret.key": settings.lakefs_secret_access_key.get_secret_value(),
        "spark.hadoop.fs.s3a.change.detection.mode": "none",
    }


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

        master = self._settings.spark_master
        builder = SparkSession.builder.appName("perago-worker")
        if master.startswith("sc://"):
            builder = builder.remote(master)
        else:
            builder = builder.master(master).config("spark.ui.enabled", "false")
            if master.startswith("local"):
                builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                    "spark.driver.host", "127.0.0.1"
                )
            if "spark.driver.extraJavaOptions" not in self._settings.spark_conf:
                # The driver JVM's own log: warnings, stack traces cut to a few lines.
                builder = builder.config(
                    "spark.driver.extraJavaOptions",
                    f"-Dlog4j2.configurationFile=file:{_log4j2_config()}",
                )
        if self._s3a:
            for key, value in s3a_conf(self._settings).items():
                builder = builder.config(key, value)
        for key, value in self._settings.spark_conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        log.info("spark_session_started", master=master, version=session.version)
        return session

    @staticmethod
    def _alive(session: Any) -> bool:
        # Cheap: asks the JVM whether the context was stopped (a killed driver raises).
        try:
            return not session.sparkContext._jsc.sc().isStopped()
        except AttributeError:
            return True  # Spark Connect: the server owns the session's life
        except Exception:  # noqa: BLE001 - a dead JVM gateway fails in many ways
            return False

    def cancel_all_jobs(self) -> None:
        """Cancel running Spark jobs so blocked task bodies return (used at drain's end)."""
        session = self._session
        if session is None:
            return
        try:
            session.sparkContext.cancelAllJobs()
        except Exception as e:  # noqa: BLE001 - best effort during shutdown
            log.warning("spark_cancel_failed", error=str(e))

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
