from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from perago.errors import UnsafePathError
from perago.workspace import Manifest, ManifestEntry, compute_diff, local_path_for
from perago.workspace.manifest import file_md5


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
