"""Spark task bodies for the runtime's Spark tests (local projection, in place, failing)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from perago import RemoteWorkspace, WorkspaceSpec, task

SUFFIX = os.environ.get("PERAGO_TEST_SUFFIX", "local")
OPTS: dict[str, Any] = {"retry_count": 1, "response_timeout": timedelta(seconds=20)}


class SparkParams(BaseModel):
    fail: bool = False
    typo: bool = False  # a NameError in the body, after a Spark job ran


class SparkResult(BaseModel):
    rows: int


@task(f"ps_local_{SUFFIX}", workspace=WorkspaceSpec(prefix="spark/"), **OPTS)
def local_projection(workspace: Path, params: SparkParams, spark: Any) -> SparkResult:
    df = spark.read.csv(str(workspace / "in"), header=True, inferSchema=True)
    if params.fail:
        from pyspark.sql.functions import assert_true, col

        df = df.select(assert_true(col("n") < 0, "n must be negative (failing on purpose)"))
    rows = df.count()
    if params.typo:
        rows = len(parms.fail)  # type: ignore[name-defined]  # noqa: F821 - on purpose
    df.write.mode("overwrite").parquet(str(workspace / "out"))  # plain: no tidying up
    return SparkResult(rows=rows)


@task(f"ps_formats_{SUFFIX}", workspace=WorkspaceSpec(prefix="spark/"), **OPTS)
def formats(workspace: Path, params: SparkParams, spark: Any) -> SparkResult:
    """Plain writes as a user makes them, over the folders an earlier run published: typed
    columns (ints, doubles, strings, a date, a timestamp, a decimal, nulls), Parquet with
    and without partitionBy, CSV and JSON, each overwriting its folder."""
    df = spark.read.csv(str(workspace / "in"), header=True, inferSchema=True).selectExpr(
        "n",
        "name",
        "n * 1.5 AS ratio",
        "date_add(DATE'2024-01-01', n) AS day",
        "timestamp_seconds(1700000000 + n * 3600) AS at",
        "CAST(n / 7 AS DECIMAL(12, 2)) AS amount",
        "IF(n % 5 = 0, NULL, name) AS maybe",
        "n % 3 AS bucket",
    )
    out = workspace / "formats"
    df.coalesce(2).write.mode("overwrite").parquet(str(out / "parquet"))
    df.write.mode("overwrite").partitionBy("bucket").parquet(str(out / "partitioned"))
    df.coalesce(2).write.mode("overwrite").option("header", True).csv(str(out / "csv"))
    df.coalesce(2).write.mode("overwrite").json(str(out / "json"))
    return SparkResult(rows=df.count())


@task(f"ps_inplace_{SUFFIX}", workspace=WorkspaceSpec(prefix="spark/", in_place=True), **OPTS)
def in_place(workspace: RemoteWorkspace, params: SparkParams, spark: Any) -> SparkResult:
    df = spark.read.csv(workspace.input_uri + "in/", header=True, inferSchema=True)
    rows = df.count()
    df.write.mode("overwrite").parquet(workspace.output_uri + "out/")
    if params.fail:
        raise RuntimeError("in-place body failed after writing (on purpose)")
    return SparkResult(rows=rows)


@task(
    f"ps_inplace_inc_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="spark/inc/", in_place=True, inputs={"src": "spark/in/"}),
    incremental=True,
    **OPTS,
)
def in_place_incremental(
    workspace: RemoteWorkspace, params: SparkParams, spark: Any
) -> SparkResult:
    """In place and incremental: its output is a function of spark/in/ (its one input)."""
    df = spark.read.csv(workspace.inputs["src"], header=True, inferSchema=True)
    df.write.mode("overwrite").parquet(workspace.output_uri + "out/")
    return SparkResult(rows=df.count())


class SlowParams(BaseModel):
    rows: int = 200  # each row sleeps 100 ms in an executor: rows / 2 * 0.1 s on two cores
    write: bool = False  # publish the rows (spark/slow/)


@task(f"ps_slow_{SUFFIX}", workspace=WorkspaceSpec(prefix="spark/", in_place=True), **OPTS)
def slow(workspace: RemoteWorkspace, params: SlowParams, spark: Any) -> SparkResult:
    """A Spark job that takes a while and writes nothing (drain and interrupt tests)."""
    df = spark.range(0, params.rows, 1, 2).selectExpr(
        "id", "reflect('java.lang.Thread', 'sleep', cast(100 as bigint)) AS slept"
    )
    if params.write:
        df.write.mode("overwrite").parquet(workspace.output_uri + "slow/")
        return SparkResult(rows=params.rows)
    return SparkResult(rows=len(df.collect()))


class CappedParams(BaseModel):
    part: str
    seconds: float = 0.3


class CappedResult(BaseModel):
    part: str


@task(
    f"ps_capped_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="capped/", read_only=True),
    concurrency=1,
    **OPTS,
)
def capped(workspace: Path, params: CappedParams, spark: Any) -> CappedResult:
    """A Spark task type one worker runs one at a time (`concurrency=1`)."""
    spark.range(100_000).selectExpr("sum(id)").collect()
    time.sleep(params.seconds)
    return CappedResult(part=params.part)


@task(
    f"ps_light_{SUFFIX}",
    workspace=WorkspaceSpec(prefix="light/", read_only=True),
    concurrency=8,
    **OPTS,
)
def light(workspace: Path, params: CappedParams) -> CappedResult:
    """A light task type beside it, capped at 8 of the worker's 9 slots."""
    time.sleep(params.seconds)
    return CappedResult(part=params.part)


class Traced(BaseModel):
    description: str
    tags: list[str]


@task(f"ps_traced_{SUFFIX}", workspace=WorkspaceSpec(prefix="traced/", read_only=True), **OPTS)
def traced(workspace: Path, params: SparkParams, spark: Any) -> Traced:
    """What this attempt's Spark jobs are labelled with (the trace id, when tracing is on)."""
    spark.range(10).count()
    description = spark.sparkContext.getLocalProperty("spark.job.description") or ""
    return Traced(description=description, tags=sorted(spark.getTags()))
