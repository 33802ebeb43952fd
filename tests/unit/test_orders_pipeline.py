"""The orders task bodies called directly on generated data with a local Spark session."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from workers.orders.data import generate_orders
from workers.orders.tasks import (
    CleanParams,
    ReportParams,
    RevenueParams,
    orders_clean,
    orders_daily_revenue,
    orders_quality_report,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    yield session
    session.stop()


def _expected(ws: Path) -> tuple[int, dict[tuple[str, str], Decimal]]:
    good = 0
    revenue: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for f in sorted((ws / "raw").glob("*.csv")):
        for row in csv.DictReader(f.open()):
            try:
                amount = Decimal(row["amount"])
            except ArithmeticError:
                continue
            if not row["customer_id"] or amount < 0 or row["currency"] != "EUR":
                continue
            if row["order_date"] == "2026-13-45":
                continue
            good += 1
            revenue[(row["order_date"], row["segment"])] += amount
    return good, revenue


def test_pipeline_bodies(tmp_path: Path, spark: Any) -> None:
    ws = tmp_path / "ws"
    gen = generate_orders(ws, rows=5000, seed=7)
    assert gen.rows == 5000 and 0 < gen.bad_rows < 250
    good, revenue = _expected(ws)
    assert good == gen.rows - gen.bad_rows

    clean = orders_clean(ws, CleanParams(), spark=spark)
    assert (clean.rows_in, clean.rows_out, clean.bad_rows) == (5000, good, gen.bad_rows)
    dates = {d for d, _ in revenue}
    assert clean.partitions == len(dates)
    partitions = {p.name for p in (ws / "clean").iterdir() if p.is_dir()}
    assert partitions == {f"order_date={d}" for d in dates}

    rev = orders_daily_revenue(ws, RevenueParams(), spark=spark)
    assert (rev.rows_in, rev.rows_out) == (good, len(revenue))
    rows = spark.read.parquet(str(ws / "revenue" / "daily")).collect()
    got = {(str(r["order_date"]), r["segment"]): Decimal(str(r["revenue"])) for r in rows}
    assert got == {k: round(v, 2) for k, v in revenue.items()}

    report = orders_quality_report(ws, ReportParams(), spark=spark)
    assert report.passed, report.checks
    assert report.clean_rows == good and report.revenue_rows == len(revenue)
    # Spark's bookkeeping stays on the disk, out of what would be published
    from perago.workspace import Manifest, compute_diff

    assert any(p.name.endswith(".crc") for p in ws.rglob("*"))
    published = compute_diff(Manifest(), ws).added
    assert not [p for p in published if p.endswith((".crc", "_SUCCESS")) or "_temporary" in p]
    assert any(p.startswith("clean/order_date=") and p.endswith(".parquet") for p in published)


def test_clean_without_raw_data_is_terminal(tmp_path: Path, spark: Any) -> None:
    from perago import TaskError

    (tmp_path / "ws").mkdir()
    with pytest.raises(TaskError, match="load data first") as e:
        orders_clean(tmp_path / "ws", CleanParams(), spark=spark)
    assert e.value.non_retryable


def test_a_day_summary_joins_its_partition_with_the_customers_dimension(
    tmp_path: Path, spark: Any
) -> None:
    from perago.testing import run_task
    from workers.orders.data import UNKNOWN_CUSTOMERS, generate_customers
    from workers.orders.tasks import orders_day_summary

    ws = tmp_path / "ws"
    generate_orders(ws, rows=3000, seed=7, days=3)
    orders_clean(ws, CleanParams(), spark=spark)
    day = sorted(p.name for p in (ws / "clean").iterdir() if p.is_dir())[0]
    day = day.removeprefix("order_date=")
    customers = generate_customers(tmp_path / "dims").parent
    out = tmp_path / "out"
    out.mkdir()
    summary = run_task(
        orders_day_summary,
        out,
        {"day": day},
        spark=spark,
        inputs={"orders": ws / "clean" / f"order_date={day}", "customers": customers},
    )
    rows = spark.read.parquet(str(ws / "clean" / f"order_date={day}")).collect()
    assert summary.orders == len(rows) > 0
    assert summary.revenue == round(float(sum(r["amount"] for r in rows)), 2)
    assert set(summary.revenue_by_region) <= {"north", "south", "east", "west", "unknown"}
    unknown = [r for r in rows if int(r["customer_id"][1:]) >= 5000 - UNKNOWN_CUSTOMERS]
    assert ("unknown" in summary.revenue_by_region) == bool(unknown)
    assert abs(sum(summary.revenue_by_region.values()) - summary.revenue) < 0.05
    assert (out / "summary.json").read_text() == summary.model_dump_json()


def test_the_spark_extra_carries_what_pandas_conversions_need(tmp_path: Path, spark: Any) -> None:
    """`perago-runtime[spark]` installs pandas (below 3, which Spark 4 supports without a
    warning) and pyarrow: `DataFrame.to_parquet`, `createDataFrame(pandas)` and `toPandas`
    work and warn about nothing."""
    import tomllib
    import warnings

    import pandas as pd
    from packaging.requirements import Requirement

    extra = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    spark_extra = {
        Requirement(r).name: Requirement(r)
        for r in extra["project"]["optional-dependencies"]["spark"]
    }
    assert "sql" in spark_extra["pyspark"].extras  # pandas, pyarrow, numpy
    assert not spark_extra["pandas"].specifier.contains("3.0.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = pd.DataFrame({"day": ["2026-10-01", "2026-10-02"], "orders": [3, 4]})
        frame.to_parquet(tmp_path / "days.parquet")
        back = spark.createDataFrame(pd.read_parquet(tmp_path / "days.parquet")).toPandas()
    assert back.to_dict("list") == {"day": ["2026-10-01", "2026-10-02"], "orders": [3, 4]}
