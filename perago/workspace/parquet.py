"""Are two Parquet files the same table, byte for byte, but for the order of a set?

parquet-mr (Spark's writer) lists each column chunk's encodings from a ``HashSet`` of an
enum, whose iteration order follows the JVM's identity hash codes: the same rows written by
another JVM (a restarted worker) come out with ``[PLAIN, BIT_PACKED]`` where the first had
``[BIT_PACKED, PLAIN]``, and nothing else differs. The format defines both lists as sets
(``ColumnMetaData.encodings``: "Set of all encodings used for this column";
``encoding_stats``: "Set of all encodings used for pages in this column chunk"), so their
order carries no meaning. :func:`parquet_digest` hashes every byte of the data pages and
every field of the footer (decoded from Thrift's compact protocol), with exactly those two
lists sorted: equal digests mean equal files up to that order. Anything that does not parse
as Parquet has no digest, and is compared by its bytes as before.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

__all__ = ["parquet_digest"]

_MAGIC = b"PAR1"
#: Field ids on the way from FileMetaData to the lists that are sets (parquet.thrift):
#: FileMetaData.row_groups (4) -> RowGroup.columns (1) -> ColumnChunk.meta_data (3) ->
#: ColumnMetaData.encodings (2) and ColumnMetaData.encoding_stats (13).
_ROW_GROUPS, _COLUMNS, _META_DATA = 4, 1, 3
_SETS = (2, 13)
_MAX_FOOTER = 64 * 1024 * 1024


class _Malformed(ValueError):
    pass


class _Reader:
    """Thrift compact protocol, decoding only, into plain tuples, lists and dicts."""

    def __init__(self, data: bytes) -> None:
        self.data, self.i = data, 0

    def byte(self) -> int:
        if self.i >= len(self.data):
            raise _Malformed("truncated")
        b = self.data[self.i]
        self.i += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise _Malformed("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or self.i + n > len(self.data):
            raise _Malformed("truncated")
        out = self.data[self.i : self.i + n]
        self.i += n
        return out

    def value(self, kind: int) -> Any:
        if kind in (1, 2):  # a bool inside a list or map: one byte
            return self.byte() == 1
        if kind == 3:
            return struct.unpack("b", self.take(1))[0]
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            return struct.unpack("<d", self.take(8))[0]
        if kind == 8:
            return self.take(self.varint())
        if kind in (9, 10):  # list, set
            header = self.byte()
            size, element = header >> 4, header & 0x0F
            if size == 15:
                size = self.varint()
            return ["list", [self.value(element) for _ in range(size)]]
        if kind == 11:
            size = self.varint()
            if not size:
                return ["map", []]
            types = self.byte()
            return [
                "map",
                [(self.value(types >> 4), self.value(types & 0x0F)) for _ in range(size)],
            ]
        if kind == 12:
            return self.struct()
        raise _Malformed(f"unknown Thrift type {kind}")

    def struct(self) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            header = self.byte()
            if header == 0:
                return fields
            kind, delta = header & 0x0F, header >> 4
            field = last + delta if delta else self.zigzag()
            fields[field] = kind == 1 if kind in (1, 2) else self.value(kind)
            last = field


def _sort_sets(footer: dict[int, Any]) -> None:
    """Sort, in place, the two lists the format defines as sets (see the module doc)."""
    for row_group in footer.get(_ROW_GROUPS, ["list", []])[1]:
        for column in (
            row_group.get(_COLUMNS, ["list", []])[1] if isinstance(row_group, dict) else []
        ):
            meta = column.get(_META_DATA) if isinstance(column, dict) else None
            if not isinstance(meta, dict):
                continue
            for field in _SETS:
                if isinstance(meta.get(field), list):
                    meta[field][1].sort(key=repr)


def parquet_digest(path: Path) -> str | None:
    """SHA-256 of the file's data pages and its footer with its set-valued lists sorted;
    None if ``path`` is not a well-formed Parquet file."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            if size < 12:
                return None
            f.seek(size - 8)
            tail = f.read(8)
            (footer_length,) = struct.unpack("<I", tail[:4])
            if tail[4:] != _MAGIC or footer_length > min(size - 12, _MAX_FOOTER):
                return None
            f.seek(0)
            if f.read(4) != _MAGIC:
                return None
            digest = hashlib.sha256()
            remaining = size - 8 - footer_length - 4
            digest.update(_MAGIC)
            while remaining > 0:
                chunk = f.read(min(remaining, 1 << 20))
                if not chunk:
                    return None
                digest.update(chunk)
                remaining -= len(chunk)
            reader = _Reader(f.read(footer_length))
            footer = reader.struct()
            if reader.i != footer_length:
                return None
    except (OSError, _Malformed, struct.error, RecursionError):
        return None
    _sort_sets(footer)
    digest.update(b"\0footer\0" + repr(footer).encode())
    return digest.hexdigest()
