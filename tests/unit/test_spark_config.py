"""Spark beyond one machine, without a JVM: whose master wins, the S3A settings, the mode rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perago.config import load
from perago.errors import ConfigError
from perago.worker.spark import SparkTarget, s3a_conf, spark_tag, spark_target


def test_perago_s_setting_wins_then_the_user_s_spark_configuration_then_local(
    tmp_path: Path,
) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("# ours\nspark.master   spark://m:7077\n")
    env = {"SPARK_CONF_DIR": str(conf_dir)}
    assert spark_target(load(env={}), env={}) == SparkTarget("local[*]", "Perago's default")
    assert spark_target(load(env={}), env=env).url == "spark://m:7077"
    assert "spark-defaults.conf" in spark_target(load(env={}), env=env).source
    assert spark_target(load(env={}), env={**env, "MASTER": "yarn"}) == SparkTarget(
        "yarn", "MASTER"
    )
    remote = spark_target(load(env={}), env={**env, "SPARK_REMOTE": "sc://c:15002"})
    assert remote == SparkTarget("sc://c:15002", "SPARK_REMOTE") and remote.connect
    conf = load(env={"PERAGO_SPARK_CONF": '{"spark.master": "local[3]"}'})
    assert spark_target(conf, env=env).url == "local[3]"
    mine = load(env={"PERAGO_SPARK_MASTER": "local[2]"})
    assert spark_target(mine, env={**env, "SPARK_REMOTE": "sc://c"}) == SparkTarget(
        "local[2]", "PERAGO_SPARK_MASTER"
    )
    assert not SparkTarget("k8s://https://api", "MASTER").local


def test_s3a_jars_come_from_the_build_not_from_ivy(tmp_path: Path) -> None:
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("hadoop-aws-3.5.0.jar", "bundle-2.35.4.jar"):
        (jars / name).write_bytes(b"PK")
    settings = load(env={"PERAGO_SPARK_JARS_DIR": str(jars)})
    conf = s3a_conf(settings)
    assert conf["spark.jars"].split(",") == [
        str(jars / "bundle-2.35.4.jar"),
        str(jars / "hadoop-aws-3.5.0.jar"),
    ]
    assert "spark.jars.packages" not in conf
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    # A local master runs the executors in the driver JVM: the jars go on its class path
    # where they lie (spark.jars would copy 660 MB into /tmp at every session start).
    local = s3a_conf(settings, local=True)
    assert "spark.jars" not in local
    assert local["spark.driver.extraClassPath"].split(":") == conf["spark.jars"].split(",")
    assert "spark.executor.extraClassPath" not in local  # no executors of their own
    # Executors on hosts that have the jars at the same path load them there, uncopied.
    shared = s3a_conf(load(env={"PERAGO_SPARK_JARS_DIR": str(jars),
                                "PERAGO_SPARK_JARS_ON_EXECUTORS": "true"}))  # fmt: skip
    assert "spark.jars" not in shared
    assert shared["spark.executor.extraClassPath"] == local["spark.driver.extraClassPath"]
    assert shared["spark.driver.extraClassPath"] == local["spark.driver.extraClassPath"]
    assert "spark.jars.packages" in s3a_conf(load(env={}))  # nothing fetched: Ivy, warned
    connect = s3a_conf(settings, connect=True)  # the server carries the jars
    assert "spark.jars" not in connect and connect["fs.s3a.path.style.access"] == "true"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no jars"):
        s3a_conf(load(env={"PERAGO_SPARK_JARS_DIR": str(tmp_path / "empty")}))


def test_tags_name_one_attempt() -> None:
    assert spark_tag("abc") == "perago-abc" and "," not in spark_tag("a,b")


class FakeSession:
    """Records tags and interrupts (a real classic/Connect session does the same calls)."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.interrupted: list[str] = []

    def addTag(self, tag: str) -> None:
        self.tags.append(tag)

    def removeTag(self, tag: str) -> None:
        self.tags.remove(tag)

    def interruptTag(self, tag: str) -> list[str]:
        self.interrupted.append(tag)
        return []


def test_interrupt_touches_only_the_named_attempts() -> None:
    from perago.worker.spark import SparkSessions

    sessions = SparkSessions(load(env={}))
    fake: Any = FakeSession()
    sessions._session = fake
    sessions.interrupt(["t1", "t3"])
    assert fake.interrupted == ["perago-t1", "perago-t3"]


def test_a_classic_session_is_never_asked_connect_only_questions() -> None:
    """Classic PySpark raises (not AttributeError) on Connect-only attributes like
    ``client``; liveness must tell the two apart by class (a bug CI caught)."""
    from perago.worker.spark import SparkSessions

    class ClassicLike:
        @property
        def client(self) -> Any:
            raise RuntimeError("[ONLY_SUPPORTED_WITH_SPARK_CONNECT]")

        @property
        def sparkContext(self) -> Any:
            raise AttributeError  # no JVM here: treated as alive, like Connect

    assert SparkSessions._alive(ClassicLike()) is True
