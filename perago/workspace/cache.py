"""A worker-local cache of object bytes, so reading a ref again costs local copies only.

An entry is keyed by what lakeFS says identifies an object's bytes: its checksum and its
physical address (a merge or a branch shares the address; new bytes get a new address), and
its size. Entries live under ``<cache_dir>/proc-<pid>-<random>/``, owned by this process and
shared by all its attempts; directories of dead processes are removed on start, because
nothing vouches for their files. The cache is bounded in bytes and evicts the least recently
used entries.

Safety, since a task body owns its attempt directory and may rewrite or append to any file
in place:

* an attempt never gets the cache's file itself: a reflink (a copy-on-write clone, where
  the filesystem supports it) or a plain copy, never a hard link, so writes to the workspace
  never reach an entry;
* entries are read-only and their ``(size, mtime, ctime, inode)`` is recorded when they are
  added; an entry whose stat differs when read (truncated, rewritten, replaced) is dropped
  and the object downloaded instead, and the copy is checked by size again;
* the worker's own uploads seed the cache only if the file's stat did not change between
  before the upload and after the copy into the cache.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from perago import metrics

__all__ = ["ContentCache", "clone_file", "write_new"]

log = structlog.get_logger("perago.workspace.cache")

_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_NO_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF}
_CHUNK = 1024 * 1024


def clone_file(src_fd: int, dst_fd: int, size: int) -> str:
    """Copy ``size`` bytes between open files: a reflink if possible, else a kernel copy.

    Returns ``"reflink"`` or ``"copy"``. Never links: the destination is its own inode.
    """
    try:
        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
        return "reflink"
    except OSError as e:
        if e.errno not in _NO_CLONE:
            raise
    copied = 0
    try:
        while copied < size:
            n = os.copy_file_range(src_fd, dst_fd, size - copied, copied, copied)
            if n == 0:
                break
            copied += n
    except OSError as e:
        if e.errno not in _NO_CLONE:
            raise
        os.lseek(src_fd, copied, os.SEEK_SET)
        os.lseek(dst_fd, copied, os.SEEK_SET)
        while chunk := os.read(src_fd, _CHUNK):
            os.write(dst_fd, chunk)
    return "copy"


@dataclass(frozen=True)
class _Entry:
    path: Path
    size: int
    stamp: tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode as added


_HIT = metrics.CACHE.labels("hit")
_MISS = metrics.CACHE.labels("miss")
_ADD = metrics.CACHE.labels("add")
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def write_new(dest: Path, fill: Callable[[int], object], size: int) -> os.stat_result | None:
    """Create ``dest`` (it must not exist: attempts start empty), fill it, check its size.

    The file is removed again unless it ends up with exactly ``size`` bytes (None then).
    """
    try:
        fd = os.open(dest, _NEW, 0o600)
    except FileExistsError:  # replace it through a temporary file, as a download does
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".perago-cache-")
        try:
            st = _fill(fd, fill, size)
            if st is not None:
                os.replace(tmp, dest)
                return st
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        Path(tmp).unlink(missing_ok=True)
        return None
    try:
        st = _fill(fd, fill, size)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    if st is None:
        dest.unlink(missing_ok=True)
    return st


def _fill(fd: int, fill: Callable[[int], object], size: int) -> os.stat_result | None:
    try:
        fill(fd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st if st.st_size == size else None


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ContentCache:
    """Object bytes by (checksum, physical address, size), LRU-bounded by ``max_bytes``."""

    def __init__(self, directory: Path, *, max_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._sweep_dead(directory)
        self.root = directory / f"proc-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.root.mkdir(mode=0o700)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def _sweep_dead(directory: Path) -> None:
        for child in directory.glob("proc-*"):
            try:
                pid = int(child.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if not _pid_alive(pid):
                shutil.rmtree(child, ignore_errors=True)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def close(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def key(checksum: str, physical_address: str, size: int) -> str | None:
        """The entry key, or None if lakeFS did not say enough to identify the bytes."""
        if not checksum or not physical_address:
            return None
        raw = f"{checksum}\0{physical_address}\0{size}".encode()
        return hashlib.sha256(raw).hexdigest()

    # -- reading -------------------------------------------------------------------------------

    def copy_to(self, key: str, dest: Path) -> os.stat_result | None:
        """Write the entry's bytes to a new file ``dest``; its stat, or None on a miss.

        A hit is only a hit if the entry is exactly as added and the copy has its size; a
        damaged entry is dropped and counted as a miss.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            _MISS.inc()
            return None
        try:
            src = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._drop(key, entry, "missing")
            _MISS.inc()
            return None
        try:
            if _stamp(os.fstat(src)) != entry.stamp:
                self._drop(key, entry, "changed")
                _MISS.inc()
                return None
            copied = write_new(dest, lambda fd: clone_file(src, fd, entry.size), entry.size)
        finally:
            os.close(src)
        if copied is None:
            self._drop(key, entry, "short copy")
            _MISS.inc()
            return None
        _HIT.inc()
        metrics.CACHE_BYTES_SAVED.inc(entry.size)
        return copied

    # -- adding --------------------------------------------------------------------------------

    def add_file(self, key: str, source: Path, size: int, *, before: os.stat_result) -> bool:
        """Copy ``source`` (of ``size`` bytes, stat ``before`` taken earlier) into the cache.

        Nothing is added if the file changed since ``before`` or does not have ``size`` bytes:
        what was stored in lakeFS may then differ from what the file holds now.
        """
        if size > self.max_bytes:
            return False
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return True
        try:
            src = os.open(source, os.O_RDONLY)
        except OSError:
            return False
        try:
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".add-")
            try:
                try:
                    clone_file(src, fd, size)
                    copied = os.fstat(fd).st_size
                finally:
                    os.close(fd)
                after = os.fstat(src)
                unchanged = (
                    _stamp(after)[:3] == _stamp(before)[:3] and after.st_ino == before.st_ino
                )
                if not unchanged or copied != size or after.st_size != size:
                    Path(tmp).unlink(missing_ok=True)
                    return False
                return self._install(key, Path(tmp), size)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        finally:
            os.close(src)

    def add_downloaded(self, key: str, source: Path, size: int) -> bool:
        """Keep a copy of a file just downloaded (and checked by size) into an attempt."""
        try:
            before = os.stat(source)
        except OSError:
            return False
        return self.add_file(key, source, size, before=before)

    def _install(self, key: str, tmp: Path, size: int) -> bool:
        # Every entry file has its own name: a racing add of the same key, or a reader
        # dropping a damaged entry, never touches another entry's file.
        os.chmod(tmp, stat.S_IRUSR)
        final = self.root / f"{key}-{uuid.uuid4().hex[:8]}"
        os.rename(tmp, final)
        entry = _Entry(final, size, _stamp(os.stat(final)))
        evicted: list[_Entry] = []
        with self._lock:
            if key in self._entries:  # another thread added it meanwhile: keep theirs
                evicted.append(entry)
            else:
                self._entries[key] = entry
                self._bytes += size
            while self._bytes > self.max_bytes and self._entries:
                _, victim = self._entries.popitem(last=False)
                self._bytes -= victim.size
                evicted.append(victim)
        for victim in evicted:  # never the new entry: it is at most max_bytes
            with contextlib.suppress(FileNotFoundError):
                victim.path.unlink()
        if evicted and evicted[0] is entry:
            return True
        _ADD.inc()
        return True

    def _drop(self, key: str, entry: _Entry, why: str) -> None:
        with self._lock:
            if self._entries.get(key) is entry:
                del self._entries[key]
                self._bytes -= entry.size
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()
        metrics.CACHE.labels("dropped").inc()
        log.warning("cache_entry_dropped", entry=entry.path.name, reason=why)
