"""Re-running a Spark step with identical output publishes nothing (`only_renames`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from perago.workspace import Manifest, compute_diff, only_renames
from perago.workspace.manifest import ManifestEntry


def _materialized(root: Path, files: dict[str, bytes]) -> Manifest:
    """A manifest as materialize leaves it (ctime 0: every file is hashed by the diff)."""
    manifest = Manifest()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        manifest.add(ManifestEntry(rel, len(data), hashlib.md5(data).hexdigest()))
    return manifest


def _rerun(root: Path, before: dict[str, bytes], after: dict[str, bytes]) -> bool:
    manifest = _materialized(root, before)
    for rel in before:
        (root / rel).unlink()
    for rel, data in after.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    diff = compute_diff(manifest, root)
    return only_renames(manifest, diff, root)


SPARK = {"out/part-00000-aaa.parquet": b"rows 1", "out/part-00001-aaa.parquet": b"rows 2"}


def test_new_random_part_names_over_the_same_bytes_are_a_noop(tmp_path: Path) -> None:
    after = {"out/part-00000-bbb.parquet": b"rows 1", "out/part-00001-bbb.parquet": b"rows 2"}
    assert _rerun(tmp_path, SPARK, after)


def test_anything_else_is_a_change(tmp_path: Path) -> None:
    cases = {
        "changed bytes": {
            "out/part-00000-b.parquet": b"rows 1",
            "out/part-00001-b.parquet": b"rows X",
        },
        "moved folder": {
            "new/part-00000-b.parquet": b"rows 1",
            "new/part-00001-b.parquet": b"rows 2",
        },
        "one file fewer": {"out/part-00000-b.parquet": b"rows 1rows 2"},
        "one file more": {**{f"out/p{i}": b"rows 1" for i in range(2)}, "out/p9": b"rows 2"},
        "same count, bytes swapped across folders": {
            "out/a": b"rows 1",
            "other/b": b"rows 2",
        },
    }
    for i, (why, after) in enumerate(cases.items()):
        root = tmp_path / str(i)
        root.mkdir()
        assert not _rerun(root, SPARK, after), why


def test_a_real_change_beside_renames_is_a_change(tmp_path: Path) -> None:
    before = {**SPARK, "out/_meta.json": b"{}"}
    after = {"out/part-00000-b.parquet": b"rows 1", "out/part-00001-b.parquet": b"rows 2"}
    after["out/_meta.json"] = b'{"v": 2}'
    assert not _rerun(tmp_path, before, after)


def test_parquet_from_another_jvm_is_a_noop_and_other_bytes_are_not(tmp_path: Path) -> None:
    """A re-run on a restarted worker: the same rows, the footer's encodings in another
    order (parquet-mr's hash order). Equal but for that order: a no-op, the old files fetched
    to compare; one byte of row data different: published."""
    from tests.unit.test_parquet_digest import _encodings_swapped, _write

    original = _write(tmp_path / "table.parquet")
    cases = {
        "another JVM": (_encodings_swapped(original), True),
        "other rows": (original.replace(b"2026-10-02", b"2026-10-03"), False),
    }
    for name, (rewritten, noop) in cases.items():
        root = tmp_path / name.replace(" ", "-")
        root.mkdir()
        manifest = _materialized(root, {"out/part-00000-aaa.parquet": original})
        (root / "out/part-00000-aaa.parquet").unlink()
        (root / "out/part-00000-bbb.parquet").write_bytes(rewritten)
        diff = compute_diff(manifest, root)
        fetched: list[list[str]] = []

        def fetch(paths: list[str], root: Path = root, fetched: list[list[str]] = fetched) -> Path:
            fetched.append(paths)
            old = root.parent / f"{root.name}-old"
            (old / "out").mkdir(parents=True, exist_ok=True)
            (old / "out/part-00000-aaa.parquet").write_bytes(original)
            return old

        assert only_renames(manifest, diff, root) is False, name  # by bytes alone: no
        assert only_renames(manifest, diff, root, fetch_old=fetch) is noop, name
        assert fetched == [["out/part-00000-aaa.parquet"]]


def test_a_fetched_old_file_that_is_not_what_lakefs_recorded_is_not_trusted(
    tmp_path: Path,
) -> None:
    from tests.unit.test_parquet_digest import _encodings_swapped, _write

    original = _write(tmp_path / "table.parquet")
    manifest = _materialized(tmp_path / "ws", {"out/p-aaa.parquet": original})
    (tmp_path / "ws/out/p-aaa.parquet").unlink()
    (tmp_path / "ws/out/p-bbb.parquet").write_bytes(_encodings_swapped(original))
    diff = compute_diff(manifest, tmp_path / "ws")

    def fetch_other_bytes(paths: list[str]) -> Path:
        (tmp_path / "old/out").mkdir(parents=True)
        (tmp_path / "old/out/p-aaa.parquet").write_bytes(_encodings_swapped(original))
        return tmp_path / "old"

    assert not only_renames(manifest, diff, tmp_path / "ws", fetch_old=fetch_other_bytes)


def test_a_partitioned_rewrite_keeps_the_unchanged_partitions_files(tmp_path: Path) -> None:
    """Spark rewrites every `partitionBy` folder under new names: only the folder whose
    rows changed is published; the others keep their files (issue 40: an incremental step
    downstream then sees its partition unchanged)."""
    from perago.workspace import without_renamed_folders

    before = {
        "t/d=1/part-0-a.parquet": b"day 1",
        "t/d=2/part-0-a.parquet": b"day 2",
        "t/d=3/part-0-a.parquet": b"day 3",
    }
    after = {
        "t/d=1/part-0-b.parquet": b"day 1",
        "t/d=2/part-0-b.parquet": b"day 2, corrected",
        "t/d=3/part-0-b.parquet": b"day 3",
    }
    manifest = _materialized(tmp_path, before)
    for rel in before:
        (tmp_path / rel).unlink()
    for rel, data in after.items():
        (tmp_path / rel).write_bytes(data)
    diff = compute_diff(manifest, tmp_path)
    kept = without_renamed_folders(manifest, diff, tmp_path)
    assert kept.added == ("t/d=2/part-0-b.parquet",)
    assert kept.deleted == ("t/d=2/part-0-a.parquet",)
    assert not only_renames(manifest, diff, tmp_path)
