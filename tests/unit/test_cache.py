"""The worker-local content cache on real files: what a task body does can never reach it."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
import structlog.testing

from perago.testing import MemoryStore
from perago.workspace import ContentCache, materialize, upload_all
from perago.workspace import cache as cache_module
from perago.workspace.cache import _owner_runs, clone_file
from tests.clock import tick_past

REPO = "r"


class CountingStore(MemoryStore):
    """The in-memory store, counting downloads (what the cache saves)."""

    def __init__(self) -> None:
        super().__init__()
        self.downloads = 0
        self._count = threading.Lock()

    def download(self, repository: str, ref: str, path: str, dest, *, url: str = ""):  # type: ignore[no-untyped-def]
        with self._count:
            self.downloads += 1
        return super().download(repository, ref, path, dest, url=url)


@pytest.fixture
def store() -> CountingStore:
    s = CountingStore()
    s.create_repository(REPO)
    return s


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[ContentCache]:
    c = ContentCache(tmp_path / "cache", max_bytes=1 << 20)
    yield c
    c.close()


def _publish(store: CountingStore, files: dict[str, bytes], tmp: Path, cache: ContentCache) -> str:
    """Upload ``files`` through ``upload_all``, commit them on main, and let the cache adopt
    them, as the worker does once the writing attempt is reported."""
    src = _write(tmp / "src", files)
    upload_all(store, REPO, "main", "d/", src, list(files), parallelism=4, cache=cache)
    cache.adopt(src)
    return store.commit(REPO, "main", message="m", metadata={}).id


def _write(root: Path, files: dict[str, bytes]) -> Path:
    """Write ``files`` under ``root`` and wait for the filesystem's clock to tick past them:
    a file changed in the same tick as an upload starts is never adopted (racy-git's rule)."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    tick_past(root)
    return root


def _read(store: CountingStore, ref: str, root: Path, cache: ContentCache | None) -> None:
    """Materialize ``ref`` into ``root``: the cache adopts nothing until ``cache.adopt``."""
    root.mkdir(parents=True)
    materialize(store, REPO, ref, "d/", root, parallelism=4, cache=cache)


def _entries(cache: ContentCache) -> list[Path]:
    return sorted(p for p in cache.root.iterdir() if not p.name.startswith("."))


def test_what_a_worker_published_is_read_back_from_the_cache(
    store: CountingStore, cache: ContentCache, tmp_path: Path
) -> None:
    ref = _publish(store, {"a.bin": b"a" * 1000, "sub/b.bin": b"b" * 10}, tmp_path, cache)
    assert len(cache) == 2
    entry = next(p for p in cache.root.iterdir() if p.read_bytes() == b"a" * 1000)
    assert os.stat(entry).st_ino != os.stat(tmp_path / "src" / "a.bin").st_ino  # a copy
    _read(store, ref, tmp_path / "attempt", cache)
    assert store.downloads == 0
    assert len(cache) == 0  # lent to the attempt, which owns the files now
    assert (tmp_path / "attempt" / "a.bin").read_bytes() == b"a" * 1000
    assert (tmp_path / "attempt" / "sub" / "b.bin").read_bytes() == b"b" * 10
    assert os.stat(tmp_path / "attempt" / "a.bin").st_mode & 0o200  # writable, as downloaded
    assert cache.adopt(tmp_path / "attempt") == 2  # unchanged: back in the cache
    _read(store, ref, tmp_path / "again", cache)
    assert store.downloads == 0
    assert (tmp_path / "again" / "a.bin").read_bytes() == b"a" * 1000


def test_a_body_rewriting_or_appending_in_place_never_changes_the_cache(
    store: CountingStore, cache: ContentCache, tmp_path: Path
) -> None:
    ref = _publish(store, {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000}, tmp_path, cache)
    first = tmp_path / "first"
    _read(store, ref, first, cache)
    assert os.stat(first / "a.bin").st_nlink == 1  # its own inode: never a shared hard link
    with (first / "a.bin").open("r+b") as f:  # in-place rewrite, same size
        f.write(b"Y" * 1000)
    with (first / "b.bin").open("ab") as f:  # append
        f.write(b"Z" * 100)
    assert cache.adopt(first) == 0  # neither goes back
    second = tmp_path / "second"
    _read(store, ref, second, cache)
    assert (second / "a.bin").read_bytes() == b"a" * 1000
    assert (second / "b.bin").read_bytes() == b"b" * 1000
    assert store.downloads == 2


def test_a_file_the_body_deleted_is_not_adopted_and_not_warned_about(
    store: CountingStore, cache: ContentCache, tmp_path: Path
) -> None:
    """Spark's overwrite of a materialized folder deletes its files: an ordinary write,
    nothing to adopt and nothing to warn about (issue 39)."""
    ref = _publish(store, {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000}, tmp_path, cache)
    first = tmp_path / "first"
    _read(store, ref, first, cache)
    (first / "a.bin").unlink()
    with structlog.testing.capture_logs() as logs:
        cache.adopt(first)
    assert not [e for e in logs if e["event"] == "cache_adopt_failed"], logs


def test_a_file_changed_after_its_upload_is_not_adopted(
    store: CountingStore, cache: ContentCache, tmp_path: Path
) -> None:
    src = _write(tmp_path / "src", {"a.bin": b"a" * 1000})
    upload_all(store, REPO, "main", "d/", src, ["a.bin"], parallelism=1, cache=cache)
    with (src / "a.bin").open("r+b") as f:  # a body's background writer, after the upload
        f.write(b"X" * 10)
    assert cache.adopt(src) == 0
    assert len(cache) == 0 and (src / "a.bin").exists()  # left for its owner to remove


def test_a_file_still_open_for_writing_is_adopted_as_a_copy_a_linked_one_not(
    store: CountingStore, cache: ContentCache, tmp_path: Path
) -> None:
    """The cache copies what it adopts: a body's leaked writer changes the attempt's file
    afterwards, never what the cache serves. A hard link made by the body changes the
    file's ctime, so nothing proves its bytes any more: it is not adopted."""
    ref = _publish(store, {"open.bin": b"o" * 1000, "linked.bin": b"l" * 1000}, tmp_path, cache)
    attempt = tmp_path / "attempt"
    _read(store, ref, attempt, cache)
    os.link(attempt / "linked.bin", tmp_path / "elsewhere")  # a body's hard link
    writer = open(attempt / "open.bin", "r+b")  # noqa: SIM115 - a body's leaked writer
    try:
        assert cache.adopt(attempt) == 1
        writer.write(b"late")
    finally:
        writer.close()
    _read(store, ref, tmp_path / "again", cache)
    assert (tmp_path / "again" / "open.bin").read_bytes() == b"o" * 1000
    assert (tmp_path / "again" / "linked.bin").read_bytes() == b"l" * 1000
    assert store.downloads == 1  # linked.bin, downloaded again


def test_a_file_changed_in_the_same_clock_tick_as_the_probe_is_not_adopted(
    cache: ContentCache, tmp_path: Path
) -> None:
    root = _write(tmp_path / "w", {"f": b"x" * 10})
    st = os.stat(root / "f")
    key = ContentCache.key("c", "addr", 10)
    cache.vouch(root, "f", key, 10, st, settled_ns=st.st_ctime_ns)  # not strictly older
    assert cache.adopt(root) == 0
    cache.vouch(root, "f", key, 10, st, settled_ns=st.st_ctime_ns + 1)
    assert cache.adopt(root) == 1


def test_a_truncated_or_rewritten_entry_is_dropped_and_downloaded_instead(
    store: CountingStore, cache: ContentCache, tmp_path: Path
) -> None:
    ref = _publish(store, {"a.bin": b"a" * 1000, "b.bin": b"b" * 1000}, tmp_path, cache)
    entries = _entries(cache)
    assert len(entries) == 2
    for entry, damage in zip(entries, ("truncate", "rewrite"), strict=True):
        os.chmod(entry, 0o600)
        if damage == "truncate":
            os.truncate(entry, 10)
        else:
            entry.write_bytes(b"?" * 1000)  # same size, other bytes
    _read(store, ref, tmp_path / "attempt", cache)
    assert store.downloads == 2
    assert (tmp_path / "attempt" / "a.bin").read_bytes() == b"a" * 1000
    assert (tmp_path / "attempt" / "b.bin").read_bytes() == b"b" * 1000
    assert _entries(cache) == []  # the damaged files are gone
    # the downloads are adopted, intact
    assert cache.adopt(tmp_path / "attempt") == 2
    _read(store, ref, tmp_path / "again", cache)
    assert store.downloads == 2
    assert (tmp_path / "again" / "a.bin").read_bytes() == b"a" * 1000


def test_concurrent_attempts_read_the_same_objects(store: CountingStore, tmp_path: Path) -> None:
    cache = ContentCache(tmp_path / "cache", max_bytes=1 << 22)
    files = {f"p{i % 3}/f{i}.bin": os.urandom(2000 + i) for i in range(40)}
    src = _write(tmp_path / "src", files)
    upload_all(store, REPO, "main", "d/", src, list(files), parallelism=4)  # cache stays cold
    ref = store.commit(REPO, "main", message="m", metadata={}).id
    errors: list[BaseException] = []

    def attempt(n: int) -> None:
        try:
            root = tmp_path / f"attempt-{n}"
            _read(store, ref, root, cache)
            for rel, data in files.items():
                assert (root / rel).read_bytes() == data
            cache.adopt(root)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def together(numbers: range) -> None:
        threads = [threading.Thread(target=attempt, args=(n,)) for n in numbers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        # every object once, however the attempts raced to borrow and give back
        assert len(cache) == len(files) == len(_entries(cache))
        assert cache.total_bytes == sum(len(d) for d in files.values())

    together(range(3))  # cold: they race to download, then to give back the same objects
    together(range(3, 9))  # warm: one borrows each entry, the others download it
    cache.close()


def test_eviction_keeps_the_cache_under_its_byte_limit_least_recently_used_first(
    tmp_path: Path,
) -> None:
    cache = ContentCache(tmp_path / "cache", max_bytes=3000)
    src = tmp_path / "f"
    keys = []
    for i in range(3):
        src.write_bytes(bytes([i]) * 1000)
        key = ContentCache.key(f"c{i}", f"addr{i}", 1000)
        assert key is not None
        assert cache.add_file(key, src, 1000, before=os.stat(src))
        keys.append(key)
    assert cache.copy_to(keys[0], tmp_path / "out")  # key 0 is now the most recently used
    src.write_bytes(b"\x09" * 1500)
    key3 = ContentCache.key("c3", "addr3", 1500)
    assert key3 is not None and cache.add_file(key3, src, 1500, before=os.stat(src))
    assert cache.total_bytes <= 3000
    assert sum(p.stat().st_size for p in cache.root.iterdir()) == cache.total_bytes
    assert not cache.copy_to(keys[1], tmp_path / "out")  # evicted: least recently used
    assert not cache.copy_to(keys[2], tmp_path / "out")
    assert cache.copy_to(keys[0], tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"\x00" * 1000
    # larger than the whole cache: never added
    src.write_bytes(b"x" * 4000)
    big = ContentCache.key("c4", "addr4", 4000)
    assert big is not None and not cache.add_file(big, src, 4000, before=os.stat(src))
    cache.close()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm (tmpfs)")
def test_a_cache_on_another_filesystem_than_the_attempt_directory(
    store: CountingStore, tmp_path: Path
) -> None:
    shm = Path("/dev/shm") / f"perago-test-cache-{os.getpid()}"
    cache = ContentCache(shm, max_bytes=1 << 20)
    try:
        assert os.stat(shm).st_dev != os.stat(tmp_path).st_dev
        assert not cache.can_lend(tmp_path)
        ref = _publish(store, {"a.bin": b"a" * 5000}, tmp_path, cache)
        assert len(cache) == 1 and (tmp_path / "src" / "a.bin").exists()  # adopted by copy
        _read(store, ref, tmp_path / "attempt", cache)
        assert store.downloads == 0 and len(cache) == 1  # a copy: the entry stays
        out = tmp_path / "attempt" / "a.bin"
        assert out.read_bytes() == b"a" * 5000
        with out.open("ab") as f:
            f.write(b"!")
        assert cache.adopt(tmp_path / "attempt") == 0
        _read(store, ref, tmp_path / "again", cache)
        assert (tmp_path / "again" / "a.bin").read_bytes() == b"a" * 5000
        assert store.downloads == 0
    finally:
        cache.close()
        shm.rmdir()


def test_clone_file_copies_into_a_separate_inode(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 3_000_000)
    src, dst = os.open(a, os.O_RDONLY), os.open(b, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        how = clone_file(src, dst, 3_000_000)
    finally:
        os.close(src)
        os.close(dst)
    assert how in ("reflink", "copy")
    assert b.read_bytes() == a.read_bytes() and os.stat(a).st_ino != os.stat(b).st_ino


def test_folders_of_processes_that_no_longer_run_are_removed_at_start(tmp_path: Path) -> None:
    """A folder is kept only while its own process runs: a pid alone is not enough, since a
    worker restarted in a container is PID 1 again and its volume keeps the old folder."""
    from perago.workspace.processes import process_start

    folder = tmp_path / "cache"
    other = subprocess.Popen(["sleep", "60"])
    try:
        started = process_start(other.pid)
        assert started
        names = {
            "running": f"proc-{other.pid}-{started}-aaaaaaaa",
            "reused pid": f"proc-{other.pid}-{int(started) - 1}-bbbbbbbb",
            "dead": "proc-999999999-1-cccccccc",
            "older name, running": f"proc-{other.pid}-dddddddd",
            "older name, own pid": f"proc-{os.getpid()}-eeeeeeee",
            "older name, dead": "proc-999999999-ffffffff",
        }
        for name in names.values():
            (folder / name).mkdir(parents=True)
            (folder / name / "x").write_bytes(b"stale")
        cache = ContentCache(folder, max_bytes=10)
        kept = {what for what, name in names.items() if (folder / name).exists()}
        assert kept == {"running", "older name, running"}
        assert cache.root.parent == folder and cache.root.exists()
        # The next process to start finds this one's folder running, with its start time.
        assert _owner_runs(cache.root.name)
    finally:
        other.kill()
        other.wait()
    cache.close()
    assert not cache.root.exists()


def test_a_read_during_the_last_attempts_adoption_copies_what_it_has_not_reached(
    store: CountingStore, tmp_path: Path, cache: ContentCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: a place frees when its body ends, so a re-read can start while the last
    attempt's files are still being adopted. It then downloads nothing: it copies the
    files the adoption has not reached (each a new inode, proven unchanged as adopting
    proves it) and waits for the one being copied; the adoption skips what it claimed."""
    files = {f"f{i}.bin": bytes([i]) * 100 for i in range(40)}
    ref = _publish(store, files, tmp_path, cache)
    _read(store, ref, tmp_path / "a1", cache)  # the first reader borrows every entry
    assert len(cache) == 0
    store.downloads = 0
    started, overtaken = threading.Event(), threading.Event()
    real_add, real_copy, adopted, claimed = cache.add_file, cache._copy_claimed, [], []

    def add_held(*args, **kwargs):  # type: ignore[no-untyped-def]
        """The adoption's first copy waits until the re-read has claimed every other file."""
        adopted.append(args[0])
        started.set()
        overtaken.wait(10)
        return real_add(*args, **kwargs)

    def copy_counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        claimed.append(args)
        if len(claimed) == len(files) - 1:
            overtaken.set()
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(cache, "add_file", add_held)
    monkeypatch.setattr(cache, "_copy_claimed", copy_counted)
    adoption = threading.Thread(target=cache.adopt, args=(tmp_path / "a1",))
    adoption.start()
    assert started.wait(5)
    _read(store, ref, tmp_path / "a2", cache)  # the re-read, while the adoption runs
    adoption.join(10)
    assert store.downloads == 0, "the re-read downloaded what the adoption was taking"
    for rel, data in files.items():
        assert (tmp_path / "a2" / rel).read_bytes() == data
        assert os.stat(tmp_path / "a2" / rel).st_ino != os.stat(tmp_path / "a1" / rel).st_ino
    # The adoption copied some (the reader waited for those and borrowed them); the reader
    # copied the rest itself.
    assert 1 <= len(adopted) < len(files)


def test_a_queued_file_changed_after_its_body_is_not_copied_by_a_read(
    store: CountingStore, tmp_path: Path, cache: ContentCache
) -> None:
    """A claim proves the file as adopting does: one the body rewrote is downloaded instead."""
    files = {"a.bin": b"a" * 100, "b.bin": b"b" * 100}
    ref = _publish(store, files, tmp_path, cache)
    _read(store, ref, tmp_path / "a1", cache)
    (tmp_path / "a1" / "a.bin").write_bytes(b"X" * 100)  # same size, new bytes
    with cache._lock:  # queue the adoption as adopt() does, without running it yet
        vouchers = cache._vouchers.pop(tmp_path / "a1")
        for rel, v in vouchers.items():
            cache._queued.setdefault(v.key, []).append(
                cache_module._Source(tmp_path / "a1" / rel, v)
            )
            cache._pending[v.key] += 1
    store.downloads = 0
    _read(store, ref, tmp_path / "a2", cache)
    assert store.downloads == 1  # a.bin: downloaded; b.bin: copied from the queued file
    assert (tmp_path / "a2" / "a.bin").read_bytes() == b"a" * 100
    assert (tmp_path / "a2" / "b.bin").read_bytes() == b"b" * 100
    assert not cache._pending and not cache._queued
