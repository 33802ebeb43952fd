"""The orders pipeline in place: the same steps as ``workers.orders.tasks`` for Spark on a
cluster (a standalone or Kubernetes master, Spark Connect), where executors cannot see the
worker's disk. Each step reads ``s3a://<repo>/<input ref>/orders/`` and writes to its
staging branch through the lakeFS S3 gateway; nothing is downloaded to the worker and no
data is collected on the driver (only counts and the list of days), so the worker's memory
does not grow with the data. Fences, leases and Confirm are the same as for local steps.

``orders_generate_remote`` writes raw orders at any size with Spark alone (the benchmark's
1 M and 10 M rows), with the same kinds and share of bad rows as ``workers.orders.data``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from perago import Inputs, RemoteWorkspace, TaskError, WorkspaceSpec, task
from workers.orders.tasks import (
    RAW_SCHEMA,
    CleanParams,
    CleanResult,
    Day,
    DaySummary,
    ReportParams,
    ReportResult,
    RevenueParams,
    RevenueResult,
    clean_orders,
    daily_revenue,
    quality_checks,
)

ORDERS = WorkspaceSpec(prefix="orders/", in_place=True)


class GenerateParams(BaseModel):
    rows: int = Field(default=1_000_000, ge=1, le=1_000_000_000)
    files: int = Field(default=8, ge=1, le=1000)
    days: int = Field(default=30, ge=1, le=3650)


class GenerateResult(BaseModel):
    rows: int
    files: int


@task("orders_generate_remote", workspace=ORDERS)
def orders_generate_remote(
    workspace: RemoteWorkspace, params: GenerateParams, spark: Any
) -> GenerateResult:
    """Raw orders as CSV under ``orders/raw/``; about 2% bad rows of five kinds."""
    from pyspark.sql import functions as F

    def pick(salt: int, n: int) -> Any:
        return F.pmod(F.hash(F.col("id"), F.lit(salt)), F.lit(n))

    base = spark.range(0, params.rows, 1, params.files)
    amount = F.format_string("%.2f", (pick(4, 49_900) + 100) / 100.0)
    bad = pick(5, 10_000) < 200
    kind = pick(6, 5)
    rows = base.select(
        F.format_string("o%09d", F.col("id") + 1).alias("order_id"),
        F.when(bad & (kind == 0), F.lit(""))
        .otherwise(F.format_string("c%05d", pick(1, 5000)))
        .alias("customer_id"),
        F.element_at(
            F.array(*map(F.lit, ("consumer", "smb", "enterprise", "public"))), pick(2, 4) + 1
        ).alias("segment"),
        F.when(bad & (kind == 3), F.lit("2026-13-45"))
        .otherwise(
            F.date_format(
                F.date_add(F.lit("2026-10-01"), pick(3, params.days).cast("int")), "yyyy-MM-dd"
            )
        )
        .alias("order_date"),
        F.when(bad & (kind == 1), F.lit("n/a"))
        .when(bad & (kind == 2), F.concat(F.lit("-"), amount))
        .otherwise(amount)
        .alias("amount"),
        F.when(bad & (kind == 4), F.lit("USD")).otherwise(F.lit("EUR")).alias("currency"),
    )
    rows.write.mode("overwrite").option("header", True).csv(workspace.output_uri + "raw/")
    return GenerateResult(rows=params.rows, files=params.files)


@task("orders_clean_remote", workspace=ORDERS)
def orders_clean_remote(workspace: RemoteWorkspace, params: CleanParams, spark: Any) -> CleanResult:
    """``orders_clean`` in place: bad rows dropped, parquet by date under ``orders/clean/``."""

    try:
        df = spark.read.csv(workspace.input_uri + "raw/", header=True, schema=RAW_SCHEMA)
        rows_in = df.count()
    except Exception as e:
        if "PATH_NOT_FOUND" in str(e) or "Path does not exist" in str(e):
            raise TaskError(
                "no raw orders under orders/raw/: load data first", non_retryable=True
            ) from e
        raise
    clean = clean_orders(df, params.min_amount)
    out = workspace.output_uri + "clean/"
    clean.write.mode("overwrite").partitionBy("order_date").parquet(out)
    written = spark.read.parquet(out)
    rows_out = written.count()
    days = sorted(str(r[0]) for r in written.select("order_date").distinct().collect())
    return CleanResult(
        rows_in=rows_in,
        rows_out=rows_out,
        bad_rows=rows_in - rows_out,
        partitions=len(days),
        days=days,
    )


@task("orders_daily_revenue_remote", workspace=ORDERS)
def orders_daily_revenue_remote(
    workspace: RemoteWorkspace, params: RevenueParams, spark: Any
) -> RevenueResult:
    """``orders_daily_revenue`` in place: revenue and orders per day and segment."""

    clean = spark.read.parquet(workspace.input_uri + "clean/")
    daily = daily_revenue(clean)
    out = workspace.output_uri + "revenue/daily/"
    daily.coalesce(1).write.mode("overwrite").parquet(out)
    written = spark.read.parquet(out)
    return RevenueResult(
        rows_in=clean.count(),
        rows_out=written.count(),
        days=written.select("order_date").distinct().count(),
        segments=written.select("segment").distinct().count(),
    )


@task("orders_quality_report_remote", workspace=ORDERS)
def orders_quality_report_remote(
    workspace: RemoteWorkspace, params: ReportParams, spark: Any
) -> ReportResult:
    """``orders_quality_report`` in place: it writes nothing, so it publishes nothing (an
    empty staging branch is a no-op), and every check is an aggregate on the executors."""
    from pyspark.sql import functions as F

    src = workspace.input_uri
    clean = spark.read.parquet(src + "clean/")
    revenue = spark.read.parquet(src + "revenue/daily/")
    raw_rows = spark.read.csv(src + "raw/", header=True, schema=RAW_SCHEMA).count()
    totals = clean.agg(F.sum("amount"), F.count("*"), F.countDistinct("order_date")).collect()[0]
    clean_total, clean_rows, clean_days = float(totals[0] or 0), int(totals[1]), int(totals[2])
    rev = revenue.agg(F.sum("revenue"), F.countDistinct("order_date")).collect()[0]
    revenue_total, revenue_days = float(rev[0] or 0), int(rev[1])
    both = (
        clean.select("order_date")
        .distinct()
        .join(revenue.select("order_date").distinct(), "order_date")
        .count()
    )
    checks = quality_checks(
        params,
        totals=(clean_total, revenue_total),
        days=clean_days,
        every_day_has_revenue=both == clean_days == revenue_days,
        no_negative_amounts=clean.where(F.col("amount") < 0).count() == 0,
        rows=(raw_rows, clean_rows),
    )
    return ReportResult(
        clean_rows=clean_rows,
        revenue_rows=revenue.count(),
        total_revenue=round(revenue_total, 2),
        days=revenue_days,
        passed=all(checks.values()),
        checks=checks,
    )


@task(
    "orders_day_summary_remote",
    workspace=WorkspaceSpec(
        prefix="orders/summaries/day={day}/",
        in_place=True,
        inputs={"orders": "orders/clean/order_date={day}/", "customers": "dims/customers/"},
    ),
)
def orders_day_summary_remote(
    workspace: RemoteWorkspace, params: Day, inputs: Inputs[str], spark: Any
) -> DaySummary:
    """``orders_day_summary`` in place: the day's partition and the customers dimension are
    read by the executors at the commits the attempt resolved (``s3a://repo/<commit>/...``);
    only the per-region totals come back to the driver."""
    from pyspark.sql import functions as F

    orders = spark.read.parquet(inputs["orders"])
    customers = spark.read.option("header", True).csv(inputs["customers"])
    joined = orders.join(customers, "customer_id", "left").fillna({"region": "unknown"})
    by_region = joined.groupBy("region").agg(F.count("*"), F.sum("amount")).collect()
    summary = DaySummary(
        day=params.day,
        orders=sum(int(r[1]) for r in by_region),
        revenue=round(sum(float(r[2] or 0) for r in by_region), 2),
        revenue_by_region={r[0]: round(float(r[2] or 0), 2) for r in sorted(by_region)},
    )
    spark.createDataFrame([(summary.model_dump_json(),)], "value STRING").coalesce(1).write.mode(
        "overwrite"
    ).text(workspace.output_uri)
    return summary
