"""Three Spark steps over ``orders/``: clean, daily revenue, and a read-only quality report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from perago import Inputs, TaskError, WorkspaceSpec, task

ORDERS = WorkspaceSpec(prefix="orders/")


#: The raw CSV columns, all read as text: parsing is part of cleaning.
RAW_SCHEMA = (
    "order_id STRING, customer_id STRING, segment STRING, order_date STRING, "
    "amount STRING, currency STRING"
)


def clean_orders(raw: Any, min_amount: float) -> Any:
    """Typed rows without the bad ones (no customer, bad or negative amount, bad date, not
    EUR): the cleaning rule, shared by the local and the in-place pipeline."""
    from pyspark.sql import functions as F

    typed = raw.select(
        "order_id",
        "customer_id",
        "segment",
        F.try_to_date("order_date", "yyyy-MM-dd").alias("order_date"),
        F.col("amount").try_cast("decimal(12,2)").alias("amount"),
        "currency",
    )
    return typed.where(
        (F.coalesce(F.length("customer_id"), F.lit(0)) > 0)
        & F.col("amount").isNotNull()
        & (F.col("amount") >= F.lit(max(min_amount, 0.0)))
        & F.col("order_date").isNotNull()
        & (F.col("currency") == "EUR")
    )


def daily_revenue(clean: Any) -> Any:
    """Revenue and order count per day and customer segment."""
    from pyspark.sql import functions as F

    return clean.groupBy("order_date", "segment").agg(
        F.round(F.sum("amount"), 2).alias("revenue"), F.count("*").alias("orders")
    )


class CleanParams(BaseModel):
    min_amount: float = 0.0


class CleanResult(BaseModel):
    rows_in: int
    rows_out: int
    bad_rows: int
    partitions: int
    days: list[str] = Field(default_factory=list)  # what the fan-out stage forks over


@task("orders_clean", workspace=ORDERS)
def orders_clean(workspace: Path, params: CleanParams, spark: Any) -> CleanResult:
    """Drop bad rows (no customer, bad or negative amount, bad date, not EUR); parquet by date."""

    raw = workspace / "raw"
    if not raw.is_dir() or not any(raw.glob("*.csv")):
        raise TaskError("no raw orders under orders/raw/: load data first", non_retryable=True)
    df = spark.read.csv(str(raw), header=True, schema=RAW_SCHEMA)
    clean = clean_orders(df, params.min_amount)
    rows_in = df.count()
    # One file per day, its rows in one order: a day whose raw rows did not change is
    # written with the same bytes, so a re-run publishes only the days that changed and the
    # incremental day summaries downstream run for those days alone.
    by_day = clean.repartition("order_date").sortWithinPartitions("order_id")
    by_day.write.mode("overwrite").partitionBy("order_date").parquet(str(workspace / "clean"))
    rows_out = spark.read.parquet(str(workspace / "clean")).count()
    days = sorted(
        p.name.removeprefix("order_date=")
        for p in (workspace / "clean").iterdir()
        if p.name.startswith("order_date=")
    )
    return CleanResult(
        rows_in=rows_in,
        rows_out=rows_out,
        bad_rows=rows_in - rows_out,
        partitions=len(days),
        days=days,
    )


class RevenueParams(BaseModel):
    currency: str = "EUR"


class RevenueResult(BaseModel):
    rows_in: int
    rows_out: int
    days: int
    segments: int


@task("orders_daily_revenue", workspace=ORDERS)
def orders_daily_revenue(workspace: Path, params: RevenueParams, spark: Any) -> RevenueResult:
    """Revenue and order count per day and customer segment."""

    clean = spark.read.parquet(str(workspace / "clean"))
    daily = daily_revenue(clean)
    daily.coalesce(1).write.mode("overwrite").parquet(str(workspace / "revenue" / "daily"))
    out = spark.read.parquet(str(workspace / "revenue" / "daily"))
    return RevenueResult(
        rows_in=clean.count(),
        rows_out=out.count(),
        days=out.select("order_date").distinct().count(),
        segments=out.select("segment").distinct().count(),
    )


class ReportParams(BaseModel):
    max_bad_ratio: float = 0.05

    @field_validator("max_bad_ratio", mode="before")
    @classmethod
    def _default_when_null(cls, value: object) -> object:
        # A workflow input left out arrives as null: the default limit applies.
        return 0.05 if value is None else value

    #: As an audit (write-audit-publish): a failed check fails the task, so nothing publishes.
    require_pass: bool = False


class ReportResult(BaseModel):
    clean_rows: int
    revenue_rows: int
    total_revenue: float
    days: int
    passed: bool
    checks: dict[str, bool]


def quality_checks(
    params: ReportParams,
    *,
    totals: tuple[float, float],
    days: int,
    every_day_has_revenue: bool,
    no_negative_amounts: bool,
    rows: tuple[int, int],
) -> dict[str, bool]:
    """The quality report's checks, from the clean and revenue ``totals``, the number of
    clean ``days`` and the raw and clean ``rows``; as an audit (``require_pass``) a failed
    check fails the task, non-retryable, so nothing is published."""
    (clean_total, revenue_total), (raw_rows, clean_rows) = totals, rows
    checks = {
        "revenue_matches_clean_total": abs(clean_total - revenue_total) <= 0.01 * days,
        "every_day_has_revenue": every_day_has_revenue,
        "no_negative_amounts": no_negative_amounts,
        "bad_ratio_within_limit": raw_rows > 0
        and (raw_rows - clean_rows) / raw_rows <= params.max_bad_ratio,
    }
    if params.require_pass and not all(checks.values()):
        failed = sorted(name for name, ok in checks.items() if not ok)
        raise TaskError(
            f"quality checks failed: {', '.join(failed)} ({raw_rows - clean_rows} of {raw_rows} "
            f"raw rows dropped, limit {params.max_bad_ratio:.2%}); nothing is published. Fix the "
            "data or the limit and re-run the workflow",
            non_retryable=True,
        )
    return checks


@task("orders_quality_report", workspace=WorkspaceSpec(prefix="orders/", read_only=True))
def orders_quality_report(workspace: Path, params: ReportParams, spark: Any) -> ReportResult:
    """Cross-check the published tables; returns metrics and publishes nothing."""
    from pyspark.sql import functions as F

    clean = spark.read.parquet(str(workspace / "clean"))
    revenue = spark.read.parquet(str(workspace / "revenue" / "daily"))
    clean_total = float(clean.agg(F.sum("amount")).collect()[0][0] or 0)
    revenue_total = float(revenue.agg(F.sum("revenue")).collect()[0][0] or 0)
    clean_days = {r[0] for r in clean.select("order_date").distinct().collect()}
    revenue_days = {r[0] for r in revenue.select("order_date").distinct().collect()}
    raw_rows = sum(sum(1 for _ in p.open()) - 1 for p in (workspace / "raw").glob("*.csv"))
    clean_rows = clean.count()
    checks = quality_checks(
        params,
        totals=(clean_total, revenue_total),
        days=len(clean_days),
        every_day_has_revenue=clean_days == revenue_days,
        no_negative_amounts=clean.where(F.col("amount") < 0).count() == 0,
        rows=(raw_rows, clean_rows),
    )
    return ReportResult(
        clean_rows=clean_rows,
        revenue_rows=revenue.count(),
        total_revenue=round(revenue_total, 2),
        days=len(revenue_days),
        passed=all(checks.values()),
        checks=checks,
    )


class Day(BaseModel):
    day: str  # one clean partition, e.g. "2024-01-05"


class DaySummary(BaseModel):
    day: str
    orders: int
    revenue: float
    #: Revenue by the customer's region (the customers dimension); "unknown": not in it.
    revenue_by_region: dict[str, float] = Field(default_factory=dict)


@task(
    "orders_day_summary",
    workspace=WorkspaceSpec(
        prefix="orders/summaries/day={day}/",
        inputs={"orders": "orders/clean/order_date={day}/", "customers": "dims/customers/"},
    ),
    # its summary is a function of its two inputs and its day: a re-run skips the days
    # whose clean orders and customers did not change (docs/tasks.md, incremental re-runs)
    incremental=True,
)
def orders_day_summary(
    workspace: Path, params: Day, inputs: Inputs[Path], spark: Any
) -> DaySummary:
    """Fan-out stage: one day's clean partition joined with the customers dimension, summarised
    into the day's own folder; the days run in parallel (a DYNAMIC_FORK), each reading its
    partition and the one shared dimension (downloaded once per worker)."""
    from pyspark.sql import functions as F

    orders = spark.read.parquet(str(inputs["orders"]))
    customers = spark.read.option("header", True).csv(str(inputs["customers"]))
    joined = orders.join(customers, "customer_id", "left").fillna({"region": "unknown"})
    by_region = joined.groupBy("region").agg(F.count("*"), F.sum("amount")).collect()
    summary = DaySummary(
        day=params.day,
        orders=sum(int(r[1]) for r in by_region),
        revenue=round(sum(float(r[2] or 0) for r in by_region), 2),
        revenue_by_region={r[0]: round(float(r[2] or 0), 2) for r in sorted(by_region)},
    )
    (workspace / "summary.json").write_text(summary.model_dump_json())
    return summary


class DaysReport(BaseModel):
    days: int
    orders: int
    revenue: float
    revenue_by_region: dict[str, float] = Field(default_factory=dict)


@task("orders_days_report", workspace=WorkspaceSpec(prefix="orders/summaries/", read_only=True))
def orders_days_report(workspace: Path, params: ReportParams) -> DaysReport:
    """The join step after the fan-out: reads every day's summary."""
    days = [
        DaySummary.model_validate_json(p.read_text())
        for p in sorted(workspace.glob("day=*/summary.json"))
    ]
    if not days:
        raise TaskError("no day summaries under orders/summaries/: did the fan-out run?")
    regions: dict[str, float] = {}
    for d in days:
        for region, revenue in d.revenue_by_region.items():
            regions[region] = round(regions.get(region, 0.0) + revenue, 2)
    return DaysReport(
        days=len(days),
        orders=sum(d.orders for d in days),
        revenue=round(sum(d.revenue for d in days), 2),
        revenue_by_region=dict(sorted(regions.items())),
    )
