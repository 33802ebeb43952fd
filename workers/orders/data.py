"""Deterministic raw orders with a known number of bad rows, for the demo and the tests."""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

__all__ = ["REGIONS", "SEGMENTS", "GeneratedOrders", "generate_customers", "generate_orders"]

SEGMENTS = ("consumer", "smb", "enterprise", "public")
REGIONS = ("north", "south", "east", "west")
#: Orders name customers c00000..c04999; the customers table knows all but the last 100.
CUSTOMERS = 5000
UNKNOWN_CUSTOMERS = 100
HEADER = ("order_id", "customer_id", "segment", "order_date", "amount", "currency")
BAD_KINDS = ("missing_customer", "bad_amount", "negative_amount", "bad_date", "bad_currency")


@dataclass(frozen=True)
class GeneratedOrders:
    rows: int
    bad_rows: int
    bad_by_kind: dict[str, int] = field(default_factory=dict)
    files: tuple[str, ...] = ()


def generate_orders(
    dest_dir: Path, *, rows: int = 100_000, seed: int = 7, files: int = 4, days: int = 30
) -> GeneratedOrders:
    """Write ``raw/orders-NNN.csv`` under ``dest_dir``; about 2% of the rows are bad."""
    rng = random.Random(seed)
    start = date(2026, 10, 1)
    raw = dest_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    bad = dict.fromkeys(BAD_KINDS, 0)
    names = []
    per_file = -(-rows // files)
    n = 0
    for f in range(files):
        name = f"raw/orders-{f:03d}.csv"
        names.append(name)
        with (dest_dir / name).open("w", newline="") as out:
            w = csv.writer(out)
            w.writerow(HEADER)
            for _ in range(min(per_file, rows - n)):
                n += 1
                row = [
                    f"o{n:07d}",
                    f"c{rng.randrange(5000):05d}",
                    rng.choice(SEGMENTS),
                    (start + timedelta(days=rng.randrange(days))).isoformat(),
                    f"{rng.uniform(1, 500):.2f}",
                    "EUR",
                ]
                if rng.random() < 0.02:
                    kind = rng.choice(BAD_KINDS)
                    bad[kind] += 1
                    if kind == "missing_customer":
                        row[1] = ""
                    elif kind == "bad_amount":
                        row[4] = "n/a"
                    elif kind == "negative_amount":
                        row[4] = f"-{row[4]}"
                    elif kind == "bad_date":
                        row[3] = "2026-13-45"
                    else:
                        row[5] = "USD"
                w.writerow(row)
    return GeneratedOrders(rows=n, bad_rows=sum(bad.values()), bad_by_kind=bad, files=tuple(names))


def generate_customers(dest_dir: Path, *, seed: int = 11) -> Path:
    """Write the customers dimension, ``customers.csv`` (customer_id, region), under
    ``dest_dir``: the table every day's summary joins (``WorkspaceSpec(inputs=...)``). The
    last ``UNKNOWN_CUSTOMERS`` ids are missing, as in any real dimension that lags."""
    rng = random.Random(seed)
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / "customers.csv"
    with path.open("w", newline="") as out:
        w = csv.writer(out)
        w.writerow(("customer_id", "region"))
        for n in range(CUSTOMERS - UNKNOWN_CUSTOMERS):
            w.writerow((f"c{n:05d}", rng.choice(REGIONS)))
    return path


def late_orders(day: str, *, rows: int = 25, tag: str = "late") -> bytes:
    """A raw CSV of ``rows`` valid orders of ``day`` that arrived late (the demo's and the
    incremental benchmark's correction of one day)."""
    lines = [
        ",".join((f"{tag}{i:03d}", f"c{i:05d}", "smb", day, f"{10 + i}.50", "EUR"))
        for i in range(rows)
    ]
    return ("\n".join([",".join(HEADER), *lines]) + "\n").encode()
