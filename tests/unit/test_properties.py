"""Property tests (hypothesis) of the diff, the manifest and object-path safety.

The example-based tests in test_manifest.py pin known cases; these check the rules over
generated workspaces and names: the diff equals a model of what the task did, a manifest
survives its file, and no object path ever maps outside the attempt directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perago.errors import UnsafePathError
from perago.workspace import Manifest, ManifestEntry, compute_diff, local_path_for
from perago.workspace.manifest import file_md5

_FS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_segment = st.text("abcdef0123456789._-", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..") and not s.startswith(".perago")
)
_rel_path = st.lists(_segment, min_size=1, max_size=3).map("/".join)
_content = st.binary(max_size=64)


def _no_prefix_clash(paths: set[str]) -> bool:
    # A name cannot be both a file and a folder.
    return not any(q.startswith(p + "/") for p in paths for q in paths)


_tree = st.dictionaries(_rel_path, _content, max_size=8).filter(lambda t: _no_prefix_clash(set(t)))


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = root.joinpath(*rel.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _materialized(root: Path, files: dict[str, bytes]) -> Manifest:
    """As materialize leaves it: entries with inode and ctime, then the settle stamp."""
    _write(root, files)
    m = Manifest()
    for rel in files:
        p = root.joinpath(*rel.split("/"))
        st_ = p.stat()
        m.add(ManifestEntry(rel, st_.st_size, file_md5(p), st_.st_ctime_ns, st_.st_ino))
    m.settle(root)
    return m


@_FS
@given(before=_tree, after=_tree)
def test_the_diff_is_what_the_task_did(before: dict[str, bytes], after: dict[str, bytes]) -> None:
    if not _no_prefix_clash(set(before) | set(after)):
        return  # the task would have to remove a folder to make a file of its name
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        manifest = _materialized(root, before)
        for rel in set(before) - set(after):
            root.joinpath(*rel.split("/")).unlink()
        _write(root, {k: v for k, v in after.items() if before.get(k) != v})
        diff = compute_diff(manifest, root)
    assert diff.added == tuple(sorted(set(after) - set(before)))
    assert diff.deleted == tuple(sorted(set(before) - set(after)))
    assert diff.changed == tuple(sorted(k for k in after if k in before and before[k] != after[k]))


@_FS
@given(files=_tree, rewrite=st.data())
def test_a_same_size_rewrite_is_always_seen(
    files: dict[str, bytes], rewrite: st.DataObject
) -> None:
    if not files:
        return
    rel = rewrite.draw(st.sampled_from(sorted(files)))
    old = files[rel]
    new = rewrite.draw(st.binary(min_size=len(old), max_size=len(old)).filter(lambda b: b != old))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        manifest = _materialized(root, files)
        root.joinpath(*rel.split("/")).write_bytes(new)
        assert compute_diff(manifest, root).changed == (rel,)


_entry = st.builds(
    ManifestEntry,
    path=_rel_path,
    size=st.integers(0, 2**50),
    checksum=st.text("0123456789abcdef", min_size=32, max_size=32),
    ctime_ns=st.integers(0, 2**63 - 1),
    ino=st.integers(0, 2**63 - 1),
)


@_FS
@given(entries=st.lists(_entry, max_size=10), settled=st.integers(0, 2**63 - 1))
def test_a_manifest_survives_its_file(entries: list[ManifestEntry], settled: int) -> None:
    m = Manifest(settled_ns=settled)
    for e in entries:
        m.add(e)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "manifest.json"
        m.save(path)
        back = Manifest.load(path)
    assert back.entries == m.entries
    assert back.settled_ns == settled


_hostile = st.lists(
    st.one_of(
        st.sampled_from(["..", ".", "", "a", "b.c", "\x00", "\\", "..\\x", "~", "/"]),
        st.text(max_size=5),
    ),
    min_size=1,
    max_size=5,
).map("/".join)


@settings(max_examples=300, deadline=None)
@given(relative=st.one_of(_hostile, st.text(max_size=20), _rel_path))
def test_no_object_path_leaves_the_attempt_directory(relative: str) -> None:
    root = Path("/attempt/root")
    try:
        local = local_path_for(root, relative)
    except UnsafePathError:
        return
    # Accepted: a plain descendant of root, naming exactly the object's segments.
    rel = local.relative_to(root)
    assert rel.parts == tuple(relative.split("/"))
    assert all(part not in ("", ".", "..") for part in PurePosixPath(rel).parts)
    assert "\x00" not in str(local) and "\\" not in relative
