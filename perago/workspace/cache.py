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
are provably unchanged; the attempt directory, originals included, is then removed. A place
frees when its body ends, so the next attempt (a re-read of the same data) may start while
that adoption runs: it copies the files the adoption has not reached yet itself, with the
same proof, and waits for the one being copied, instead of downloading them again (the
adoption takes the files last read first, so the two meet in the middle).

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
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from perago.telemetry import metrics
from perago.workspace.processes import is_running, process_start

__all__ = ["ContentCache", "clone_file", "write_new"]

log = structlog.get_logger("perago.workspace.cache")

_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_NO_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF}
_CHUNK = 1024 * 1024
#: How long a read waits for an entry that an adoption is copying in right now (module doc).
ADOPTION_WAIT_S = 10.0


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


@dataclass(frozen=True, eq=False)
class _Source:
    """A vouched-for file an adoption will take (compared by identity: each is queued once)."""

    path: Path
    voucher: _Voucher


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


def _proven(path: Path, v: _Voucher) -> os.stat_result | None:
    """``path``'s stat if the kernel proves it still holds the bytes ``v`` vouches for
    (see the module doc), else None (changed, replaced or deleted by its owner)."""
    if not v.ctime_ns < v.settled_ns:
        return None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # the body deleted it (an ordinary overwrite): nothing to take
    proof = (stat.S_ISREG(st.st_mode), st.st_size, st.st_ino, st.st_ctime_ns)
    return st if proof == (True, v.size, v.ino, v.ctime_ns) else None


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
        #: Notified as each file of an adoption is taken (or refused).
        self._adopting = threading.Condition(self._lock)
        #: Keys an adoption running now is about to take, and how many times.
        self._pending: Counter[str] = Counter()
        #: The files of running adoptions not yet started on, by key: a read of such a key
        #: copies the file itself (:meth:`_claim`) instead of waiting for its turn.
        self._queued: dict[str, list[_Source]] = {}
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
            claimed = self._claim(key)
            entry = None if claimed else self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if claimed is not None:
            return self._copy_claimed(claimed, dest)
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

    def _claim(self, key: str) -> _Source | None:
        """(Under the lock.) For a key the cache does not hold: a file a running adoption has
        queued, taken off its queue for the reader to copy; else, if an adoption is copying
        the key in right now, wait until it is done (at most ADOPTION_WAIT_S): the read and
        the adoption share the copying (module doc)."""
        deadline = None
        while key not in self._entries:
            queued = self._queued.get(key)
            if queued:
                source = queued.pop(0)
                if not queued:
                    del self._queued[key]
                return source
            if not self._pending[key]:
                return None
            now = time.monotonic()
            deadline = deadline or now + ADOPTION_WAIT_S
            if now >= deadline or not self._adopting.wait(deadline - now):
                return None
        return None

    def _copy_claimed(self, source: _Source, dest: Path) -> os.stat_result | None:
        """Copy a claimed file into ``dest`` if the kernel proves it unchanged, as adopting
        it would (a new inode for the reader: what still holds the old file cannot reach
        this one); a hit, or a miss to download."""
        try:
            copied = self._copy_vouched(source.path, source.voucher, dest)
        except OSError as e:
            log.warning("cache_claim_failed", file=str(source.path), error=str(e))
            copied = None
        finally:
            with self._lock:
                self._settled(source.voucher.key)
        if copied is None:
            _MISS.inc()
            return None
        _HIT.inc()
        metrics.CACHE_BYTES_SAVED.inc(source.voucher.size)
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
            claimed = self._claim(key)
            entry = None if claimed else self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.size
        if claimed is not None:
            return self._copy_claimed(claimed, dest)
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
            sources = [_Source(root / relative, v) for relative, v in vouchers.items()]
            for source in sources:
                self._queued.setdefault(source.voucher.key, []).append(source)
                self._pending[source.voucher.key] += 1
        taken = 0
        try:  # last read first: a re-read (in reading order) copies from the other end
            for source in reversed(sources):
                with self._lock:
                    if not self._unqueue(source):
                        continue  # a read claimed it (and settled it)
                try:
                    taken += self._adopt(source.path, source.voucher)
                except OSError as e:
                    log.warning("cache_adopt_failed", file=str(source.path), error=str(e))
                finally:
                    with self._lock:
                        self._settled(source.voucher.key)
        finally:  # an interrupted adoption leaves no read waiting for what it will not take
            with self._lock:
                for source in sources:
                    if self._unqueue(source):
                        self._settled(source.voucher.key)
        return taken

    def _unqueue(self, source: _Source) -> bool:
        """(Under the lock.) Take ``source`` off its key's queue; False if a read claimed it."""
        queued = self._queued.get(source.voucher.key, [])
        for i, other in enumerate(queued):
            if other is source:
                del queued[i]
                if not queued:
                    del self._queued[source.voucher.key]
                return True
        return False

    def _settled(self, key: str) -> None:
        """(Under the lock.) One pending adoption of ``key`` is over: wake its readers."""
        self._pending[key] -= 1
        if self._pending[key] <= 0:
            del self._pending[key]
        self._adopting.notify_all()

    def _adopt(self, path: Path, v: _Voucher) -> bool:
        if v.size > self.max_bytes:
            return False
        with self._lock:
            if v.key in self._entries:
                self._entries.move_to_end(v.key)
                return False
        st = _proven(path, v)
        return st is not None and self.add_file(v.key, path, v.size, before=st)

    @staticmethod
    def _copy_vouched(path: Path, v: _Voucher, dest: Path) -> os.stat_result | None:
        """A new file ``dest`` with the bytes of ``path``, if its voucher proves them the
        object's and the file did not change while being copied; its stat, else None."""
        before = _proven(path, v)
        if before is None:
            return None
        src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            copied = write_new(dest, lambda fd: clone_file(src, fd, v.size), v.size)
            if copied is not None and _stamp(os.fstat(src)) != _stamp(before):
                dest.unlink(missing_ok=True)
                return None
            return copied
        finally:
            os.close(src)

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
        # Written at its final name, read-only from birth: nobody reads it before it is
        # installed, and every entry file has its own name, so a racing add of the same key,
        # or a reader dropping a damaged entry, never touches another entry's file.
        final = self.root / f"{key}-{uuid.uuid4().hex[:8]}"
        try:
            src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fd = os.open(final, _NEW, 0o400)
            try:
                try:
                    clone_file(src, fd, size)
                    written = os.fstat(fd)
                finally:
                    os.close(fd)
                after = os.fstat(src)
                unchanged = _stamp(after) == _stamp(before)
                if not unchanged or written.st_size != size or after.st_size != size:
                    final.unlink(missing_ok=True)
                    return False
                return self._install(key, _Entry(final, size, _stamp(written)))
            except BaseException:
                final.unlink(missing_ok=True)
                raise
        finally:
            os.close(src)

    def _install(self, key: str, entry: _Entry) -> bool:
        evicted: list[_Entry] = []
        with self._lock:
            if key in self._entries:  # another thread added it meanwhile: keep theirs
                evicted.append(entry)
            else:
                self._entries[key] = entry
                self._bytes += entry.size
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
