"""What was materialized, and what changed since: the manifest and the diff.

Change detection uses size and a content checksum, never modification times: a same-size
rewrite within the same second is a change (``lakectl local`` misses it). Hashing every
unchanged file is the cost, so a file is skipped only when the kernel proves it untouched:
same inode, size and *ctime* (which no user call can set back) as recorded at materialize,
and that ctime strictly older than a probe file the filesystem stamped after the last
download (``settled_ns``, racy-git's rule). A file changed in the same clock tick as the
probe is hashed, so the filesystem's timestamp granularity never hides a change.

Hadoop's local bookkeeping is never part of a diff (``is_bookkeeping``): the checksum
sidecars its local filesystem writes beside every file (``.part-0.parquet.crc``), a
committer's ``_temporary/`` folder and the ``_SUCCESS`` marker. On object storage the first
two never exist, and a publication is atomic (readers see every file of a step or none), so
a marker adds nothing; the sidecars' bytes also differ between JVMs for equal data, which
would make a re-run publish again. Neither written nor deleted: such files already on the
branch stay as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perago.errors import UnsafePathError
from perago.workspace.parquet import parquet_digest

__all__ = [
    "Diff",
    "Manifest",
    "ManifestEntry",
    "compute_diff",
    "file_md5",
    "filesystem_now",
    "is_bookkeeping",
    "only_renames",
    "scan",
    "without_renamed_folders",
]

_CHUNK = 1024 * 1024
_SETTLE_WAIT_S = 0.1  # a coarse filesystem clock ticks every 1-10 ms


def file_md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def filesystem_now(root: Path) -> int:
    """The ctime the filesystem under ``root`` gives a file now (racy-git's probe).

    A file whose ctime is strictly older is proven unchanged since, as long as its ctime
    stays the same: any later write stamps a ctime at least this one.
    """
    fd, probe = tempfile.mkstemp(dir=root, prefix=".perago-settled-")
    try:
        return os.fstat(fd).st_ctime_ns
    finally:
        os.close(fd)
        os.unlink(probe)


@dataclass(frozen=True)
class ManifestEntry:
    path: str  # relative to the workspace, '/'-separated
    size: int
    checksum: str  # MD5 hex of the content
    ctime_ns: int = 0  # as written by materialize (0: unknown, always hash)
    ino: int = 0


@dataclass
class Manifest:
    entries: dict[str, ManifestEntry] = field(default_factory=dict)
    #: The filesystem's own timestamp taken after the last download (0: unknown).
    settled_ns: int = 0
    #: Of ``total_bytes``, how many came from the content cache (not saved: a figure only).
    cached_bytes: int = field(default=0, compare=False)

    def add(self, entry: ManifestEntry) -> None:
        self.entries[entry.path] = entry

    def settle(self, root: Path) -> None:
        """Stamp the end of materialize with a probe file on the workspace's filesystem.

        Called before the body runs, so nothing wrote since the entries were recorded: the
        probe may wait for the filesystem's clock to tick past the newest entry (one tick at
        most, a few ms), so that no file is left unprovable (hashed by the diff, refused by
        the cache) for having been written in the probe's own tick.
        """
        newest = max((e.ctime_ns for e in self.entries.values()), default=0)
        deadline = time.monotonic() + _SETTLE_WAIT_S
        self.settled_ns = filesystem_now(root)
        while self.settled_ns <= newest and time.monotonic() < deadline:
            time.sleep(0.001)
            self.settled_ns = filesystem_now(root)

    def untouched(self, entry: ManifestEntry, now: LocalFile) -> bool:
        """True only if the kernel's ctime proves the file unchanged since materialize."""
        return (
            entry.ctime_ns != 0
            and entry.ctime_ns < self.settled_ns
            and (now.size, now.ino, now.ctime_ns) == (entry.size, entry.ino, entry.ctime_ns)
        )

    def save(self, path: Path) -> None:
        entries = [asdict(e) for e in self.entries.values()]
        path.write_text(json.dumps({"settled_ns": self.settled_ns, "entries": entries}))

    @classmethod
    def load(cls, path: Path) -> Manifest:
        body = json.loads(path.read_text())
        m = cls(settled_ns=body.get("settled_ns", 0))
        for raw in body["entries"]:
            m.add(ManifestEntry(**raw))
        return m

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries.values())


@dataclass(frozen=True)
class LocalFile:
    path: str
    size: int
    ctime_ns: int = 0
    ino: int = 0


@dataclass(frozen=True)
class Diff:
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (self.added or self.changed or self.deleted)

    @property
    def uploads(self) -> tuple[str, ...]:
        return self.added + self.changed

    def summary(self) -> dict[str, int]:
        return {
            "added": len(self.added),
            "changed": len(self.changed),
            "deleted": len(self.deleted),
        }


def _relative_name(root: Path, full: str) -> str:
    rel = os.path.relpath(full, root).replace(os.sep, "/")
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePathError(
            f"file name {os.fsencode(rel)!r} in the workspace is not valid UTF-8; lakeFS paths "
            "are UTF-8: rename it in the task body"
        ) from None
    return rel


def scan(root: Path) -> Iterator[LocalFile]:
    """Every regular file under ``root``; anything else is an error found before any upload.

    Symlinks are never followed (``lstat``), so nothing outside ``root`` is ever read.
    """
    stack = [str(root)]
    while stack:
        current = stack.pop()
        with os.scandir(current) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                mode = st.st_mode
                if stat.S_ISLNK(mode):
                    raise UnsafePathError(
                        f"the workspace holds a symlink {_relative_name(root, entry.path)!r}; "
                        "Perago publishes regular files only: write a copy instead of a link"
                    )
                if stat.S_ISDIR(mode):
                    stack.append(entry.path)
                elif stat.S_ISREG(mode):
                    yield LocalFile(
                        _relative_name(root, entry.path), st.st_size, st.st_ctime_ns, st.st_ino
                    )
                else:
                    raise UnsafePathError(
                        f"the workspace holds {_relative_name(root, entry.path)!r}, which is not "
                        "a regular file (device, FIFO or socket); remove it before returning"
                    )


def only_renames(
    manifest: Manifest,
    diff: Diff,
    root: Path,
    *,
    fetch_old: Callable[[list[str]], Path] | None = None,
) -> bool:
    """True if ``diff`` only swaps files for files with the same bytes in the same folder:
    the published tree would differ by names alone (:func:`without_renamed_folders`)."""
    if diff.is_empty or diff.changed:
        return False
    return without_renamed_folders(manifest, diff, root, fetch_old=fetch_old).is_empty


def without_renamed_folders(
    manifest: Manifest,
    diff: Diff,
    root: Path,
    *,
    fetch_old: Callable[[list[str]], Path] | None = None,
) -> Diff:
    """``diff`` without the folders whose change only swaps files for files with the same
    bytes (same count, sizes and MD5 in that folder), as when Spark rewrites identical output
    under new random part names: those folders keep their published files. So a Spark job
    that rewrites every ``partitionBy`` folder publishes only the partitions whose rows
    changed. Hashes the added files only of folders whose counts and sizes already match; a
    multipart checksum never matches.

    With ``fetch_old`` (which downloads the given deleted paths and returns the folder they
    are in), Parquet files also count as the same when they are equal but for the order of
    their footer's set-valued lists (``perago.workspace.parquet``): what another JVM writes
    for the same rows. The old files are fetched only for folders whose counts and sizes
    match and whose MD5s do not, and used only if their MD5 is the one lakeFS recorded.
    """

    def folder(path: str) -> str:
        return path.rpartition("/")[0]

    added: dict[str, list[str]] = {}
    deleted: dict[str, list[str]] = {}
    for p in diff.added:
        added.setdefault(folder(p), []).append(p)
    for p in diff.deleted:
        deleted.setdefault(folder(p), []).append(p)
    touched = {folder(p) for p in diff.changed}
    entries = manifest.entries
    candidates = [
        f
        for f in added
        if f in deleted
        and f not in touched
        and Counter(entries[p].size for p in deleted[f])
        == Counter((root / p).stat().st_size for p in added[f])
    ]
    new_md5 = {p: file_md5(root / p) for f in candidates for p in added[f]}
    same = {
        f
        for f in candidates
        if Counter((entries[p].size, entries[p].checksum) for p in deleted[f])
        == Counter(((root / p).stat().st_size, new_md5[p]) for p in added[f])
    }
    parquet_folders = [
        f
        for f in candidates
        if f not in same
        and any(p.endswith(".parquet") for p in deleted[f])
        and any(p.endswith(".parquet") for p in added[f])
    ]
    if fetch_old is not None and parquet_folders:
        wanted = [p for f in parquet_folders for p in deleted[f] if p.endswith(".parquet")]
        old_root = fetch_old(wanted)

        def old_key(p: str) -> str:
            kept = old_root / p
            if p.endswith(".parquet") and kept.is_file() and file_md5(kept) == entries[p].checksum:
                return parquet_digest(kept) or f"md5:{entries[p].checksum}"
            return f"md5:{entries[p].checksum}"

        def new_key(p: str) -> str:
            digest = parquet_digest(root / p) if p.endswith(".parquet") else None
            return digest or f"md5:{new_md5[p]}"

        for f in parquet_folders:
            gone = Counter((entries[p].size, old_key(p)) for p in deleted[f])
            new = Counter(((root / p).stat().st_size, new_key(p)) for p in added[f])
            if gone == new:
                same.add(f)
    if not same:
        return diff
    return Diff(
        added=tuple(p for p in diff.added if folder(p) not in same),
        changed=diff.changed,
        deleted=tuple(p for p in diff.deleted if folder(p) not in same),
    )


def is_bookkeeping(path: str) -> bool:
    """A file Hadoop keeps for itself on a local filesystem (see the module's docstring)."""
    folders, _, name = path.rpartition("/")
    if name == "_SUCCESS" or (name.startswith(".") and name.endswith(".crc")):
        return True
    return "_temporary" in folders.split("/")


def compute_diff(manifest: Manifest, root: Path) -> Diff:
    """Compare the attempt directory with what was materialized (bookkeeping aside)."""
    added: list[str] = []
    changed: list[str] = []
    seen: set[str] = set()
    for f in scan(root):
        seen.add(f.path)
        if is_bookkeeping(f.path):
            continue
        before = manifest.entries.get(f.path)
        if before is None:
            added.append(f.path)
        elif manifest.untouched(before, f):
            continue
        elif before.size != f.size or before.checksum != file_md5(root / f.path):
            changed.append(f.path)
    deleted = [p for p in manifest.entries if p not in seen and not is_bookkeeping(p)]
    return Diff(tuple(sorted(added)), tuple(sorted(changed)), tuple(sorted(deleted)))
