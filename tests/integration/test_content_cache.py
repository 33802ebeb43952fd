"""The content cache on real lakeFS: a published file is read back without a download."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from perago.adapters.lakefs import LakeFSStore
from perago.core.store import DownloadJob
from perago.workspace import ContentCache, materialize, upload_all
from tests.clock import tick_past


class _Counting:
    """Forwards to the real store and counts downloads."""

    def __init__(self, store: LakeFSStore) -> None:
        self._store = store
        self.downloads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def download(
        self, repository: str, ref: str, path: str, dest: IO[bytes], *, url: str = ""
    ) -> None:
        self.downloads += 1
        self._store.download(repository, ref, path, dest, url=url)

    def download_many(
        self, repository: str, ref: str, jobs: Iterable[DownloadJob], *, parallelism: int
    ) -> None:
        def counted() -> Iterator[DownloadJob]:
            for job in jobs:
                self.downloads += 1
                yield job

        self._store.download_many(repository, ref, counted(), parallelism=parallelism)


def test_a_published_file_is_read_back_from_the_cache_after_a_merge(
    store: LakeFSStore, repo: str, tmp_path: Path
) -> None:
    cache = ContentCache(tmp_path / "cache", max_bytes=1 << 23)
    counting = _Counting(store)
    src = tmp_path / "src"
    # small files go in one libcurl batch, the 1.5 MiB one on a thread (LakeFSStore.upload_many)
    files = {"a.bin": os.urandom(3000), "d/b.bin": os.urandom(10), "big": os.urandom(1_500_000)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    store.create_branch(repo, "stage", "main", hidden=True)
    tick_past(src)  # a file written in the upload's clock tick is never adopted
    upload_all(store, repo, "stage", "out/", src, list(files), parallelism=2, cache=cache)
    assert len(cache) == 0  # vouched for: the cache adopts them once the attempt ends
    assert cache.adopt(src) == 3
    store.commit(repo, "stage", message="stage", metadata={})
    merged = store.merge(repo, "stage", "main", message="publish", metadata={})

    # the next step on this worker reads what was just published: lakeFS lists the same
    # checksum and physical address on main, so nothing is downloaded
    first = tmp_path / "first"
    first.mkdir()
    manifest = materialize(counting, repo, merged, "out/", first, parallelism=2, cache=cache)  # type: ignore[arg-type]
    assert counting.downloads == 0
    assert {p: (first / p).read_bytes() for p in files} == files
    # the manifest takes lakeFS's checksum, the content MD5 (what compute_diff compares)
    assert manifest.entries["a.bin"].checksum == hashlib.md5(files["a.bin"]).hexdigest()

    # another worker (its own cache) downloads
    other = ContentCache(tmp_path / "other", max_bytes=1 << 23)
    second = tmp_path / "second"
    second.mkdir()
    materialize(counting, repo, merged, "out/", second, parallelism=2, cache=other)  # type: ignore[arg-type]
    assert counting.downloads == 3
    assert {p: (second / p).read_bytes() for p in files} == files
    cache.close()
    other.close()
