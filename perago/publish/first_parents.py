"""A head's first-parent chain down to an input ref, read through a per-process cache.

Commits never change, so a chain read once need not be read again. In a fan-out every
publication's fence walks the chain from the head to the fan-out's input ref. Most of that
chain is the same for each of them: only the few commits that siblings added since are new.
Without the cache each fence would read the whole chain again, and the cost of a fan-out
would grow with the square of its width.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from cachetools import LRUCache

from perago.core.store import Commit, VersionStore
from perago.errors import StoreError

__all__ = ["CAPACITY", "FirstParents"]

#: Commits a process keeps (the least recently used go first): about 36 MiB when full
#: (commits with Perago's publication metadata, measured with tracemalloc), enough for the
#: chains of a 1,000-way fan-out in a dozen repositories at once.
CAPACITY = 20_000


class FirstParents:
    """Walks first-parent chains, reading from lakeFS only the commits it has not seen."""

    def __init__(self, store: VersionStore, *, page: int = 100, capacity: int = CAPACITY) -> None:
        self._store = store
        self._page = page
        self._lock = threading.Lock()  # LRUCache is not thread-safe
        self._commits: LRUCache[tuple[str, str], Commit] = LRUCache(maxsize=capacity)

    def chain(
        self, repository: str, head: Commit, *, stop_at: str, limit: int | None = None
    ) -> list[Commit]:
        """``head`` and its first parents, newest first, down to ``stop_at`` (included), the
        first commit of the branch, or ``limit`` commits (None: no limit), whichever comes
        first.

        ``head`` (read from lakeFS: never one the caller made up) is kept: it is the next
        fence's first parent (a fan-out sibling's merge moves the head by one commit), found
        here instead of in a page of lakeFS's log.
        """
        self.remember(repository, head)
        chain, commit = [head], head
        while commit.id != stop_at and commit.parents and (limit is None or len(chain) < limit):
            parent = commit.parents[0]
            left = self._page if limit is None else min(self._page, limit - len(chain))
            cached = self._get(repository, parent) or self._page_from(repository, parent, left)
            chain.append(cached)
            commit = cached
        return chain

    def walk(self, repository: str, ref: str, *, limit: int) -> Iterator[Commit]:
        """``ref``'s commit and its first parents, newest first, at most ``limit``, read
        lazily: a page of lakeFS's log only when the next commit is not in the cache."""
        commit: Commit | None = self._get(repository, ref)
        if commit is None:
            page = self._store.log(repository, ref, amount=min(self._page, limit))
            if not page:
                return
            self._put(repository, page)
            commit = page[0]
        for _ in range(limit):
            yield commit
            if not commit.parents:
                return
            parent = commit.parents[0]
            commit = self._get(repository, parent) or self._page_from(
                repository, parent, self._page
            )

    def _page_from(self, repository: str, commit_id: str, amount: int) -> Commit:
        """Read a page of the log starting at ``commit_id`` into the cache; that commit."""
        page = self._store.log(repository, commit_id, amount=amount)
        if not page or page[0].id != commit_id:
            raise StoreError(
                f"lakeFS's log of {repository}@{commit_id} does not start at that commit; "
                "check the lakeFS server"
            )
        self._put(repository, page)
        return page[0]

    def commit(self, repository: str, commit_id: str) -> Commit:
        """One commit, from the cache or read from lakeFS (and kept)."""
        cached = self._get(repository, commit_id)
        if cached is None:
            cached = self._store.get_commit(repository, commit_id)
            self.remember(repository, cached)
        return cached

    def remember(self, repository: str, commit: Commit) -> None:
        """Keep a commit read from lakeFS."""
        self._put(repository, [commit])

    def _get(self, repository: str, commit_id: str) -> Commit | None:
        with self._lock:
            return self._commits.get((repository, commit_id))

    def _put(self, repository: str, commits: list[Commit]) -> None:
        with self._lock:
            for commit in commits:
                self._commits[(repository, commit.id)] = commit
