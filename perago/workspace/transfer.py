"""Moving bytes between lakeFS and the attempt directory, in parallel and streaming."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from perago.core.parallel import run_parallel
from perago.core.store import ObjectInfo, VersionStore
from perago.errors import UnsafePathError, WorkspaceError
from perago.workspace.cache import ContentCache, clone_file
from perago.workspace.manifest import Manifest, ManifestEntry, file_md5, filesystem_now

__all__ = ["local_path_for", "materialize", "run_parallel", "upload_all"]


class _HashingWriter:
    """Writes to a file descriptor and hashes what passes through, so downloads are read once.

    No Python file object: a download of a small object is one ``write`` system call, and
    the rewind before the first try (:meth:`VersionStore.download` rewinds for its retries)
    costs none.
    """

    def __init__(self, fd: int, *, hash_it: bool = True) -> None:
        self._fd = fd
        self._hash = hash_it
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.size = 0
        self._written = False

    def write(self, b: bytes) -> int:
        if self._hash:
            self.md5.update(b)
        view = memoryview(b)
        while view:
            view = view[os.write(self._fd, view) :]
        self.size += len(b)
        self._written = self._written or bool(b)
        return len(b)

    def seek(self, pos: int) -> int:
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.size = 0
        return os.lseek(self._fd, pos, os.SEEK_SET) if self._written else pos

    def truncate(self) -> int:
        if self._written:
            os.ftruncate(self._fd, os.lseek(self._fd, 0, os.SEEK_CUR))
        return self.size

    def copy_from(self, src_fd: int, size: int) -> int:
        """Take a local file's bytes in the kernel (a reflink, or ``copy_file_range``), or
        through :meth:`write` when they must be hashed."""
        if self._hash:
            while chunk := os.read(src_fd, 1024 * 1024):
                self.write(chunk)
            return self.size
        clone_file(src_fd, self._fd, size)
        self._written = True
        self.size = os.fstat(self._fd).st_size
        os.lseek(self._fd, self.size, os.SEEK_SET)
        return self.size


def local_path_for(root: Path, relative: str) -> Path:
    """Map a lakeFS relative path into ``root``, refusing anything that would leave it."""
    parts = relative.split("/")
    if (
        not relative
        or relative.startswith("/")
        or "\x00" in relative
        or "\\" in relative
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise UnsafePathError(
            f"lakeFS object path {relative!r} cannot be materialized safely (empty, absolute, "
            "'.', '..' or backslash segments); rename the object in lakeFS"
        )
    return root.joinpath(*parts)


_MD5_HEX = re.compile(r"[0-9a-f]{32}")
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _md5_hex(checksum: str) -> bool:
    """lakeFS's checksum is the content MD5 for plain uploads (not for multipart or links)."""
    return _MD5_HEX.fullmatch(checksum) is not None


def materialize(
    store: VersionStore,
    repository: str,
    ref: str,
    prefix: str,
    root: Path,
    *,
    parallelism: int,
    cache: ContentCache | None = None,
    share: bool = False,
) -> Manifest:
    """Download ``prefix`` at ``ref`` into ``root`` and return what was written.

    With a ``cache``, objects it holds are moved out of it instead (or copied, see
    :mod:`perago.workspace.cache`; always copied with ``share``, for read-only inputs that
    other attempts of this worker read at the same time), and every file written is vouched
    for, so the cache can adopt it once the attempt ends. The manifest takes lakeFS's
    checksum where it is the content MD5, so bytes are not hashed on the way in; sizes are
    always checked.
    """
    manifest = Manifest()
    # Zero-byte "folder/" markers (made by S3 consoles and tools) are directories, not files.
    objects = [
        o
        for o in store.list_objects(repository, ref, prefix, direct=True)
        if not (o.path.endswith("/") and o.size == 0)
    ]
    try:
        targets = [(o, local_path_for(root, o.path[len(prefix) :])) for o in objects]
    except UnsafePathError as e:
        raise UnsafePathError(e.message, non_retryable=True) from e  # a retry sees the same

    root.mkdir(parents=True, exist_ok=True)
    made: set[Path] = {root}
    written: list[tuple[ObjectInfo, os.stat_result]] = []

    def folder(dest: Path) -> None:
        if dest.parent not in made:
            dest.parent.mkdir(parents=True, exist_ok=True)
            made.add(dest.parent)

    def record(obj: ObjectInfo, checksum: str, st: os.stat_result) -> None:
        rel = obj.path[len(prefix) :]
        manifest.add(ManifestEntry(rel, obj.size, checksum, ctime_ns=st.st_ctime_ns, ino=st.st_ino))
        written.append((obj, st))

    def settle_and_vouch() -> None:
        manifest.settle(root)
        if cache is not None:
            for obj, st in written:
                key = ContentCache.key(obj.checksum, obj.physical_address, obj.size)
                cache.vouch(root, obj.path[len(prefix) :], key, obj.size, st, manifest.settled_ns)

    try:
        # Cache hits first, on this thread: a rename is cheaper than handing it to a pool.
        misses: list[tuple[ObjectInfo, Path]] = []
        take = (
            None
            if cache is None
            else cache.lend
            if cache.can_lend(root) and not share
            else cache.copy_to
        )
        for obj, dest in targets:
            key = ContentCache.key(obj.checksum, obj.physical_address, obj.size)
            if take is None or key is None:
                misses.append((obj, dest))
                continue
            folder(dest)
            st = take(key, dest)
            if st is None:
                misses.append((obj, dest))
            else:
                record(obj, obj.checksum if _md5_hex(obj.checksum) else file_md5(dest), st)
                manifest.cached_bytes += obj.size
        # pre-signed, lakeFS's own files on this machine, or through lakeFS: the store decides
        jobs = (_FileJob(o, d, record, folder) for o, d in misses)
        store.download_many(repository, ref, jobs, parallelism=parallelism)
    except BaseException:
        with contextlib.suppress(OSError):  # what was borrowed can still go back
            settle_and_vouch()
        raise
    settle_and_vouch()
    return manifest


class _FileJob:
    """A download into a new file ``dest``, recorded once its size is checked.

    The attempt directory starts empty, so ``dest`` is created in place (no temporary file
    and rename per object); a file already there is replaced through a temporary file.
    """

    def __init__(
        self,
        obj: ObjectInfo,
        dest: Path,
        record: Callable[[ObjectInfo, str, os.stat_result], None],
        folder: Callable[[Path], None],
    ) -> None:
        self.obj, self._dest, self._record, self._folder = obj, dest, record, folder
        self._fd, self._tmp = -1, ""
        self._writer = _HashingWriter(-1)

    def open(self) -> _HashingWriter:
        self._folder(self._dest)
        try:
            self._fd, self._tmp = os.open(self._dest, _NEW, 0o600), ""
        except FileExistsError:
            self._fd, self._tmp = tempfile.mkstemp(dir=self._dest.parent, prefix=".perago-dl-")
        self._writer = _HashingWriter(self._fd, hash_it=not _md5_hex(self.obj.checksum))
        return self._writer

    def close(self, ok: bool) -> None:
        obj, written = self.obj, Path(self._tmp or self._dest)
        try:
            st = os.fstat(self._fd) if ok else None
        finally:
            os.close(self._fd)
        if st is None or self._writer.size != obj.size:
            written.unlink(missing_ok=True)
            if st is None:
                return
            raise WorkspaceError(
                f"download of {obj.path} returned {self._writer.size} bytes, lakeFS lists "
                f"{obj.size}; retry the task"
            )
        if self._tmp:
            os.replace(self._tmp, self._dest)
        trusted = _md5_hex(obj.checksum)
        self._record(obj, obj.checksum if trusted else self._writer.md5.hexdigest(), st)


def upload_all(
    store: VersionStore,
    repository: str,
    branch: str,
    prefix: str,
    root: Path,
    paths: Iterable[str],
    *,
    parallelism: int,
    cache: ContentCache | None = None,
) -> None:
    """Upload ``paths`` (relative to ``root``) under ``prefix``; vouch for them to ``cache``.

    Each file's stat is taken before it is read; the cache adopts it later only if that
    stat still holds and is older than the filesystem's time at the start (racy-git's rule).
    """
    settled_ns = filesystem_now(root) if cache is not None else 0

    class Upload:
        def __init__(self, rel: str) -> None:
            self.rel, self.path, self.source = rel, prefix + rel, root / rel
            self.before: os.stat_result | None = None
            if cache is not None:
                with contextlib.suppress(OSError):  # the upload reports an unreadable file
                    self.before = os.stat(self.source)

        def done(self, stored: ObjectInfo) -> None:
            if cache is not None and self.before is not None:
                key = cache.key(stored.checksum, stored.physical_address, stored.size)
                cache.vouch(root, self.rel, key, stored.size, self.before, settled_ns)

    store.upload_many(repository, branch, [Upload(rel) for rel in paths], parallelism=parallelism)
