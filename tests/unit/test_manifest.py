from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from perago.errors import UnsafePathError
from perago.workspace import Manifest, ManifestEntry, compute_diff, local_path_for
from perago.workspace.manifest import file_md5, is_bookkeeping


def _manifest_of(root: Path) -> Manifest:
    m = Manifest()
    for p in root.rglob("*"):
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            m.add(ManifestEntry(rel, p.stat().st_size, file_md5(p)))
    return m


def test_diff_finds_added_changed_deleted(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("same")
    (tmp_path / "change.txt").write_text("old")
    (tmp_path / "gone.txt").write_text("bye")
    m = _manifest_of(tmp_path)
    (tmp_path / "change.txt").write_text("newer")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new.txt").write_text("hi")
    d = compute_diff(m, tmp_path)
    assert d.added == ("sub/new.txt",)
    assert d.changed == ("change.txt",)
    assert d.deleted == ("gone.txt",)


def test_same_size_rewrite_in_the_same_second_is_a_change(tmp_path: Path) -> None:
    f = tmp_path / "a.bin"
    f.write_bytes(b"AAAA")
    st = f.stat()
    m = _manifest_of(tmp_path)
    f.write_bytes(b"BBBB")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime
    assert compute_diff(m, tmp_path).changed == ("a.bin",)


def test_unchanged_tree_is_an_empty_diff(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("x")
    assert compute_diff(_manifest_of(tmp_path), tmp_path).is_empty


def test_symlinks_are_refused_and_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "link").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="symlink 'link'"):
        compute_diff(Manifest(), ws)


def test_fifo_and_socket_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        compute_diff(Manifest(), tmp_path)
    (tmp_path / "pipe").unlink()
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(UnsafePathError, match="not a regular file"):
            compute_diff(Manifest(), tmp_path)
    finally:
        s.close()


def test_non_utf8_names_are_refused(tmp_path: Path) -> None:
    (Path(os.fsdecode(bytes(tmp_path) + b"/bad-\xff.txt"))).write_text("x")
    with pytest.raises(UnsafePathError, match="not valid UTF-8"):
        compute_diff(Manifest(), tmp_path)


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a\\b", "./a"])
def test_object_paths_that_would_escape_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UnsafePathError):
        local_path_for(tmp_path, bad)


def test_manifest_round_trip(tmp_path: Path) -> None:
    m = Manifest()
    m.add(ManifestEntry("a/b", 3, "abc"))
    m.save(tmp_path / "m.json")
    assert Manifest.load(tmp_path / "m.json").entries == m.entries


def _recorded(root: Path) -> Manifest:
    """A manifest as materialize writes it: stat identity, then the settle probe."""
    m = Manifest()
    for p in sorted(root.rglob("*")):
        st = p.stat()
        rel = p.relative_to(root).as_posix()
        m.add(ManifestEntry(rel, st.st_size, file_md5(p), st.st_ctime_ns, st.st_ino))
    m.settle(root)
    return m


def test_only_files_the_kernel_cannot_vouch_for_are_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from perago.workspace import manifest as manifest_module

    for i in range(20):
        (tmp_path / f"f{i}.bin").write_bytes(b"x" * 100)
    time.sleep(0.05)  # older than the probe's clock tick
    m = _recorded(tmp_path)
    assert m.settled_ns > 0 and not list(tmp_path.glob(".perago-settled-*"))
    hashed: list[str] = []
    real_md5 = manifest_module.file_md5

    def counting_md5(path: Path) -> str:
        hashed.append(path.name)
        return real_md5(path)

    monkeypatch.setattr(manifest_module, "file_md5", counting_md5)
    (tmp_path / "f3.bin").write_bytes(b"y" * 100)  # same size, right away
    os.utime(tmp_path / "f4.bin", ns=(0, 0))  # touched: ctime moves even if mtime goes back
    d = compute_diff(m, tmp_path)
    assert d.changed == ("f3.bin",)
    assert sorted(hashed) == ["f3.bin", "f4.bin"]  # the 18 others were never read


def test_a_file_written_in_the_probes_clock_tick_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.bin").write_bytes(b"AAAA")
    m = _recorded(tmp_path)
    entry = m.entries["a.bin"]
    m.settled_ns = entry.ctime_ns  # same tick as the probe: racy
    (tmp_path / "a.bin").write_bytes(b"BBBB")
    st = (tmp_path / "a.bin").stat()
    # Pretend the filesystem clock did not advance: only the checksum can tell.
    forged = ManifestEntry("a.bin", 4, entry.checksum, st.st_ctime_ns, st.st_ino)
    m.add(forged)
    m.settled_ns = st.st_ctime_ns
    assert compute_diff(m, tmp_path).changed == ("a.bin",)


def test_manifest_round_trip_keeps_the_settle_stamp(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a").write_text("a")
    m = _recorded(tmp_path / "ws")
    m.save(tmp_path / "m.json")
    loaded = Manifest.load(tmp_path / "m.json")
    assert loaded.entries == m.entries and loaded.settled_ns == m.settled_ns


def test_hadoop_bookkeeping_is_never_part_of_a_diff(tmp_path: Path) -> None:
    """Checksum sidecars, a committer's _temporary folder and _SUCCESS are neither published
    nor deleted (issue 39): on object storage they never exist, and the sidecars' bytes
    differ between JVMs for equal data."""
    manifest = Manifest()
    for rel in ("t/.part-0.parquet.crc", "t/_SUCCESS", "t/part-0.parquet"):
        manifest.add(ManifestEntry(rel, 1, "0" * 32))
    out = tmp_path / "t"
    (out / "_temporary" / "0").mkdir(parents=True)
    (out / "_temporary" / "0" / "part-9.parquet").write_bytes(b"x")
    (out / ".part-1.parquet.crc").write_bytes(b"c")
    (out / "_SUCCESS").write_bytes(b"")
    (out / "part-1.parquet").write_bytes(b"data")
    (tmp_path / "readme.crc").write_bytes(b"a user's own file")  # not Hadoop's sidecar name
    diff = compute_diff(manifest, tmp_path)
    assert diff.added == ("readme.crc", "t/part-1.parquet")
    assert diff.deleted == ("t/part-0.parquet",)  # the remote sidecar and marker stay
    assert is_bookkeeping("_temporary/x") and not is_bookkeeping("a_temporary/x")
