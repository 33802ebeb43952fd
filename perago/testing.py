"""Fakes for unit tests of code built on Perago: an in-memory version store and a ledger.

``MemoryStore`` follows the lakeFS semantics the protocol relies on (checked against the real
server by the integration suite): merges never fast-forward and fail with a conflict when
both sides changed a path since the merge base; hard reset is unconditional; tags and
branches are create-if-absent. It is not a lakeFS emulator: no hooks, no S3 gateway.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from perago.adapters.conductor import TaskSnapshot
from perago.errors import ConflictError, NotFoundError, StoreError
from perago.store import Commit, ObjectInfo

__all__ = ["MemoryStore", "StaticLedger"]


@dataclass
class _Repo:
    commits: dict[str, tuple[Commit, dict[str, bytes]]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    staged: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


class MemoryStore:
    """A :class:`perago.store.VersionStore` in memory, thread-safe."""

    def __init__(self) -> None:
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.RLock()
        self._ids = itertools.count(1)

    # -- helpers --------------------------------------------------------------------------

    def _repo(self, name: str) -> _Repo:
        try:
            return self._repos[name]
        except KeyError:
            raise NotFoundError(f"repository {name} not found", status=404) from None

    def _resolve(self, repo: _Repo, ref: str) -> str:
        if ref in repo.branches:
            return repo.branches[ref]
        if ref in repo.tags:
            return repo.tags[ref]
        if ref in repo.commits:
            return ref
        raise NotFoundError(f"ref {ref} not found", status=404)

    def _new_commit(
        self,
        repo: _Repo,
        parents: tuple[str, ...],
        tree: dict[str, bytes],
        message: str,
        metadata: dict[str, str],
    ) -> Commit:
        cid = hashlib.sha256(f"{next(self._ids)}".encode()).hexdigest()
        commit = Commit(cid, parents, message, dict(metadata))
        repo.commits[cid] = (commit, dict(tree))
        return commit

    def tree(self, repository: str, ref: str) -> dict[str, bytes]:
        with self._lock:
            repo = self._repo(repository)
            cid = self._resolve(repo, ref)
            tree = dict(repo.commits[cid][1])
            if ref in repo.branches:
                for path, data in repo.staged[ref].items():
                    if data is None:
                        tree.pop(path, None)
                    else:
                        tree[path] = data
            return tree

    # -- VersionStore ---------------------------------------------------------------------

    def create_repository(self, name: str, *, default_branch: str = "main") -> None:
        with self._lock:
            if name in self._repos:
                raise ConflictError(f"repository {name} exists", status=409)
            repo = _Repo()
            root = self._new_commit(repo, (), {}, "Repository created", {})
            repo.branches[default_branch] = root.id
            repo.staged[default_branch] = {}
            self._repos[name] = repo

    def list_repositories(self) -> list[str]:
        return sorted(self._repos)

    def repository_exists(self, repository: str) -> bool:
        return repository in self._repos

    def branch_head(self, repository: str, branch: str) -> str:
        with self._lock:
            repo = self._repo(repository)
            if branch not in repo.branches:
                raise NotFoundError(f"branch {branch} not found", status=404)
            return repo.branches[branch]

    def get_commit(self, repository: str, ref: str) -> Commit:
        with self._lock:
            repo = self._repo(repository)
            return repo.commits[self._resolve(repo, ref)][0]

    def log(self, repository: str, ref: str, *, amount: int = 50) -> list[Commit]:
        with self._lock:
            repo = self._repo(repository)
            out: list[Commit] = []
            cid: str | None = self._resolve(repo, ref)
            while cid and len(out) < amount:
                commit = repo.commits[cid][0]
                out.append(commit)
                cid = commit.parents[0] if commit.parents else None
            return out

    def create_branch(self, repository: str, name: str, source: str) -> None:
        with self._lock:
            repo = self._repo(repository)
            if name in repo.branches:
                raise ConflictError(f"branch {name} exists", status=409)
            repo.branches[name] = self._resolve(repo, source)
            repo.staged[name] = {}

    def delete_branch(self, repository: str, name: str) -> None:
        with self._lock:
            repo = self._repo(repository)
            repo.branches.pop(name, None)
            repo.staged.pop(name, None)

    def list_branches(self, repository: str, *, prefix: str = "") -> list[tuple[str, str]]:
        with self._lock:
            repo = self._repo(repository)
            return sorted((b, c) for b, c in repo.branches.items() if b.startswith(prefix))

    def create_tag(self, repository: str, tag: str, ref: str) -> None:
        with self._lock:
            repo = self._repo(repository)
            if tag in repo.tags:
                raise ConflictError(f"tag {tag} exists", status=409)
            repo.tags[tag] = self._resolve(repo, ref)

    def get_tag(self, repository: str, tag: str) -> str:
        with self._lock:
            return self._repo(repository).tags[tag]

    def commit(
        self, repository: str, branch: str, *, message: str, metadata: dict[str, str]
    ) -> Commit:
        with self._lock:
            repo = self._repo(repository)
            if not repo.staged.get(branch):
                raise StoreError("commit: no changes", status=400)
            tree = self.tree(repository, branch)
            commit = self._new_commit(repo, (repo.branches[branch],), tree, message, metadata)
            repo.branches[branch] = commit.id
            repo.staged[branch] = {}
            return commit

    def _ancestors(self, repo: _Repo, cid: str) -> set[str]:
        seen, todo = set(), [cid]
        while todo:
            c = todo.pop()
            if c not in seen:
                seen.add(c)
                todo.extend(repo.commits[c][0].parents)
        return seen

    def merge(
        self,
        repository: str,
        source: str,
        destination: str,
        *,
        message: str,
        metadata: dict[str, str],
        timeout: float | None = None,
    ) -> str:
        with self._lock:
            repo = self._repo(repository)
            src, dst = self._resolve(repo, source), repo.branches[destination]
            common = self._ancestors(repo, src) & self._ancestors(repo, dst)
            base = max(common, key=lambda c: len(self._ancestors(repo, c)))
            b, s, d = (repo.commits[c][1] for c in (base, src, dst))
            merged = dict(d)
            for path in set(b) | set(s):
                if s.get(path) == b.get(path):
                    continue
                if d.get(path) != b.get(path) and d.get(path) != s.get(path):
                    raise ConflictError(f"merge conflict on {path}", status=409)
                if s.get(path) is None:
                    merged.pop(path, None)
                else:
                    merged[path] = s[path]
            commit = self._new_commit(repo, (dst, src), merged, message, metadata)
            repo.branches[destination] = commit.id
            return commit.id

    def hard_reset(
        self, repository: str, branch: str, ref: str, *, timeout: float | None = None
    ) -> None:
        with self._lock:
            repo = self._repo(repository)
            repo.branches[branch] = self._resolve(repo, ref)
            repo.staged[branch] = {}

    def list_objects(self, repository: str, ref: str, prefix: str) -> Iterator[ObjectInfo]:
        for path, data in sorted(self.tree(repository, ref).items()):
            if path.startswith(prefix):
                yield ObjectInfo(
                    path, len(data), hashlib.md5(data, usedforsecurity=False).hexdigest()
                )

    def download(self, repository: str, ref: str, path: str, dest: IO[bytes]) -> None:
        tree = self.tree(repository, ref)
        if path not in tree:
            raise NotFoundError(f"{path} not found at {ref}", status=404)
        dest.seek(0)
        dest.truncate()
        dest.write(tree[path])

    def upload(
        self, repository: str, branch: str, path: str, source: Path, *, if_absent: bool = False
    ) -> str:
        data = source.read_bytes()
        self.upload_bytes(repository, branch, path, data, if_absent=if_absent)
        return hashlib.md5(data, usedforsecurity=False).hexdigest()

    def upload_bytes(
        self, repository: str, branch: str, path: str, data: bytes, *, if_absent: bool = False
    ) -> None:
        with self._lock:
            repo = self._repo(repository)
            if if_absent and path in self.tree(repository, branch):
                raise ConflictError(f"{path} exists", status=412)
            repo.staged[branch][path] = data

    def delete_objects(self, repository: str, branch: str, paths: Sequence[str]) -> None:
        with self._lock:
            staged = self._repo(repository).staged[branch]
            for p in paths:
                staged[p] = None

    def has_uncommitted(self, repository: str, branch: str) -> bool:
        with self._lock:
            return bool(self._repo(repository).staged.get(branch))

    def uncommitted_outside(self, repository: str, branch: str, prefix: str) -> list[str]:
        with self._lock:
            staged = self._repo(repository).staged.get(branch) or {}
            return sorted(p for p in staged if not p.startswith(prefix))


class StaticLedger:
    """An attempt ledger whose answers the test sets (``snapshots[task_id]``)."""

    def __init__(self, *snapshots: TaskSnapshot) -> None:
        self.snapshots = {s.task_id: s for s in snapshots}

    def get_task(self, task_id: str) -> TaskSnapshot | None:
        return self.snapshots.get(task_id)

    def set_status(self, task_id: str, status: str) -> None:
        self.snapshots[task_id] = replace(self.snapshots[task_id], status=status)
