"""A worker-local cache of object bytes, so reading a ref again costs local renames only.

An entry is keyed by what lakeFS says identifies an object's bytes: its checksum and its
physical address (a merge or a branch shares the address; new bytes get a new address), and
its size. Entries live under ``<cache_dir>/proc-<pid>-<start time>-<random>/``, owned by this
process and shared by all its attempts; directories of processes that no longer run are
removed on start, because nothing vouches for their files (the start time tells a restarted
worker that got the same pid, PID 1 in a container, from the dead one), and on close. The
cache is bounded in bytes and evicts the least recently used entries.

An attempt reading an object the cache holds gets the entry's file itself, moved out of the
cache (:meth:`ContentCache.lend`): a rename per file, nothing copied while the task's clock
runs. Once the attempt is reported, the files it downloaded, borrowed or uploaded are copied
into the cache (:meth:`ContentCache.adopt`; a reflink where the filesystem has them) if they
are provably unchanged; the attempt directory, originals included, is then removed.

Safety, since a task body owns its attempt directory and may rewrite or append to any file
in place, keep files open, or link them elsewhere:

* no file is ever in the cache and in a workspace at once (never a shared hard link); while
  an attempt holds an entry, other attempts miss it and download;
* a file is adopted only if it still has the inode, size and ctime recorded when its bytes
  were known to be the object's (written by the download, borrowed, or read by the upload),
  that ctime is strictly older than a probe the filesystem stamped afterwards (racy-git's
  rule: ctime cannot be set back, and any later write stamps a newer one); the copy is kept
  only if the file's stat is the same after it. What a process still holding the file (a
  body's leaked writer, a hard link elsewhere) writes later changes the attempt's file, never
  the cache's copy;
* entries are read-only and their ``(size, mtime, ctime, inode)`` is recorded when they are
  added; an entry whose stat differs when read (truncated, rewritten, replaced) is dropped
  and the object downloaded instead;
* where a rename cannot work (the cache on another filesystem), an attempt gets a copy.
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
from perago.processes import is_running, process_start

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
class _Voucher:
    """What proves a workspace file still holds an object's bytes (see the module doc)."""

    key: str
    size: int
    ino: int
    ctime_ns: int
    settled_ns: int  # a ctime the filesystem stamped after ctime_ns was recorded


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


def _owner_runs(folder: str) -> bool:
    """True if the process that made the cache folder named ``folder`` still runs.

    ``proc-<pid>-<start time>-<random>``; an older name without the start time
    (``proc-<pid>-<random>``) counts as running unless its pid is gone or is this process's
    (which made no folder yet: so the pid was reused).
    """
    parts = folder.split("-")
    try:
        pid = int(parts[1])
    except (IndexError, ValueError):
        return True  # not ours to judge
    if len(parts) == 4:
        return is_running(pid, parts[2])
    return pid != os.getpid() and process_start(pid) is not None


class ContentCache:
    """Object bytes by (checksum, physical address, size), LRU-bounded by ``max_bytes``."""

    def __init__(self, directory: Path, *, max_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._sweep_dead(directory)
        pid = os.getpid()
        started = process_start(pid) or "0"
        self.root = directory / f"proc-{pid}-{started}-{uuid.uuid4().hex[:8]}"
        self.root.mkdir(mode=0o700)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._vouchers: dict[Path, dict[str, _Voucher]] = {}
        self._closed = False

    @staticmethod
    def _sweep_dead(directory: Path) -> None:
        for child in directory.glob("proc-*"):
            if not _owner_runs(child.name):
                log.info("cache_folder_swept", folder=child.name)
                shutil.rmtree(child, ignore_errors=True)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def close(self) -> None:
        """Drop every entry and the process's folder; later adoptions take nothing."""
        with self._lock:
            self._closed = True
            self._entries.clear()
            self._vouchers.clear()
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

    def can_lend(self, root: Path) -> bool:
        """True if entries can move into files under ``root`` by rename (same filesystem)."""
        return os.stat(root).st_dev == os.stat(self.root).st_dev

    def lend(self, key: str, dest: Path) -> os.stat_result | None:
        """Move the entry's file to ``dest`` (writable, as a download is); its stat, or None.

        The entry leaves the cache: the attempt owns the file, and :meth:`adopt` takes it
        back if it is unchanged. A damaged entry is dropped and counted as a miss. Across
        filesystems, the entry stays and ``dest`` gets a copy (:meth:`copy_to`).
        """
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.size
        if entry is None:
            _MISS.inc()
            return None
        try:
            intact = _stamp(os.stat(entry.path)) == entry.stamp
        except FileNotFoundError:
            intact = False
        if not intact:
            self._drop(key, entry, "changed or missing")
            _MISS.inc()
            return None
        try:
            os.rename(entry.path, dest)
        except OSError as e:
            self._keep(key, entry)
            if e.errno == errno.EXDEV:
                return self.copy_to(key, dest)
            raise
        os.chmod(dest, stat.S_IRUSR | stat.S_IWUSR)
        _HIT.inc()
        metrics.CACHE_BYTES_SAVED.inc(entry.size)
        return os.stat(dest)

    def _keep(self, key: str, entry: _Entry) -> None:
        evicted = None
        with self._lock:
            if key not in self._entries:
                self._entries[key] = entry
                self._bytes += entry.size
            else:
                evicted = entry
        if evicted is not None:
            with contextlib.suppress(FileNotFoundError):
                evicted.path.unlink()

    # -- adding --------------------------------------------------------------------------------

    def vouch(
        self,
        root: Path,
        relative: str,
        key: str | None,
        size: int,
        known: os.stat_result,
        settled_ns: int,
    ) -> None:
        """Note that ``root/relative`` held the object ``key``'s ``size`` bytes when it had the
        stat ``known``, and that the filesystem stamped ``settled_ns`` after that stat.

        Nothing moves until :meth:`adopt`; a later voucher for the same file replaces this one.
        """
        if key is None:
            return
        v = _Voucher(key, size, known.st_ino, known.st_ctime_ns, settled_ns)
        with self._lock:
            self._vouchers.setdefault(root, {})[relative] = v

    def adopt(self, root: Path) -> int:
        """Take the files vouched for under ``root`` into the cache, those the kernel proves
        unchanged (see the module doc); the rest stay for their owner to remove. Call once
        the attempt that owns ``root`` has ended. Returns how many were taken.
        """
        with self._lock:
            vouchers = self._vouchers.pop(root, {})
            if self._closed:
                return 0
        taken = 0
        for relative, v in vouchers.items():
            try:
                taken += self._adopt(root / relative, v)
            except OSError as e:
                log.warning("cache_adopt_failed", file=relative, error=str(e))
        return taken

    def _adopt(self, path: Path, v: _Voucher) -> bool:
        if v.size > self.max_bytes or not v.ctime_ns < v.settled_ns:
            return False
        with self._lock:
            if v.key in self._entries:
                self._entries.move_to_end(v.key)
                return False
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False  # the body deleted it (an ordinary overwrite): nothing to take
        proof = (stat.S_ISREG(st.st_mode), st.st_size, st.st_ino, st.st_ctime_ns)
        if proof != (True, v.size, v.ino, v.ctime_ns):
            return False
        return self.add_file(v.key, path, v.size, before=st)

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
                unchanged = _stamp(after) == _stamp(before)
                if not unchanged or copied != size or after.st_size != size:
                    Path(tmp).unlink(missing_ok=True)
                    return False
                return self._install(key, Path(tmp), size)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        finally:
            os.close(src)

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
