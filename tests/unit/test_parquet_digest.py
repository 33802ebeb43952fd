"""Parquet files equal up to the order of their set-valued footer lists have one digest."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from perago.workspace.parquet import parquet_digest


def _write(path: Path) -> bytes:
    table = pa.table({"day": ["2026-10-01", "2026-10-02"] * 50, "n": list(range(100))})
    pq.write_table(table, path, use_dictionary=True, compression="snappy")
    return path.read_bytes()


def _encodings_swapped(data: bytes) -> bytes:
    """The file with its first column's encodings list in another order: what another JVM's
    parquet-mr writes (ColumnMetaData field 1 `type`, then field 2 `encodings`)."""
    (length,) = struct.unpack("<I", data[-8:-4])
    start = len(data) - 8 - length
    found = re.search(rb"\x15.\x19([\x25\x35\x45])(.)(.)", data[start:], re.S)
    assert found, "no encodings list found in the footer"
    a, b = found.start(2) + start, found.start(3) + start
    assert data[a] != data[b] and data[a] < 0x80 and data[b] < 0x80
    out = bytearray(data)
    out[a], out[b] = data[b], data[a]
    return bytes(out)


def test_the_order_of_a_set_is_ignored_and_nothing_else(tmp_path: Path) -> None:
    original = _write(tmp_path / "a.parquet")
    swapped = tmp_path / "b.parquet"
    swapped.write_bytes(_encodings_swapped(original))
    assert swapped.read_bytes() != original
    assert pq.read_table(swapped).equals(pq.read_table(tmp_path / "a.parquet"))
    digest = parquet_digest(tmp_path / "a.parquet")
    assert digest is not None and parquet_digest(swapped) == digest

    # one byte of row data changed: another digest
    data = bytearray(original)
    index = original.index(b"2026-10-02") + 9
    data[index] = ord("3")
    (tmp_path / "c.parquet").write_bytes(bytes(data))
    assert parquet_digest(tmp_path / "c.parquet") not in (None, digest)

    # another footer field changed (a value of the first column's statistics, the row count
    # of the file): another digest, or no digest at all
    for old, new in ((b"2026-10-01", b"2026-10-00"), (b"\xc8\x01", b"\xca\x01")):
        footer = original.rindex(old)
        changed = original[:footer] + new + original[footer + len(old) :]
        (tmp_path / "d.parquet").write_bytes(changed)
        assert parquet_digest(tmp_path / "d.parquet") != digest


def test_anything_else_has_no_digest(tmp_path: Path) -> None:
    (tmp_path / "text.parquet").write_text("not parquet at all")
    original = _write(tmp_path / "a.parquet")
    (tmp_path / "cut.parquet").write_bytes(original[:-20] + original[-8:])
    assert parquet_digest(tmp_path / "text.parquet") is None
    assert parquet_digest(tmp_path / "cut.parquet") is None
    assert parquet_digest(tmp_path / "missing.parquet") is None
