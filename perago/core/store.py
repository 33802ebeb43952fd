"""What the publication protocol needs from a versioned object store (lakeFS in production).

The protocol logic talks to this interface only; ``perago.adapters.lakefs`` implements it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

__all__ = [
    "Commit",
    "DownloadJob",
    "FileSink",
    "ObjectInfo",
    "Sink",
    "UploadJob",
    "VersionStore",
    "download_one",
]


@dataclass(frozen=True)
class Commit:
    id: str
    parents: tuple[str, ...] = ()
    message: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    #: Unix seconds (0: unknown); informational, never compared by the protocol.
    created: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ObjectInfo:
    path: str
    size: int
    checksum: str
    #: Where lakeFS keeps the bytes; with the checksum it identifies them (content cache).
    physical_address: str = ""
    #: A pre-signed URL the bytes can be read from without lakeFS ("": read through lakeFS).
    download_url: str = ""


class Sink(Protocol):
    """Where a download's bytes go; rewound and truncated before a retry."""

    def write(self, b: bytes, /) -> int: ...
    def seek(self, pos: int, /) -> int: ...
    def truncate(self) -> int: ...


@runtime_checkable
class FileSink(Sink, Protocol):
    """A sink over a file of its own, which can take an object kept in a local file by a
    kernel copy (a reflink where the filesystem has them) instead of through Python."""

    def copy_from(self, src_fd: int, size: int, /) -> int:
        """Copy ``size`` bytes of ``src_fd`` in; returns the sink's size after."""
        ...


class DownloadJob(Protocol):
    """One object of a batch download: its sink is opened when its transfer starts (a batch
    of thousands never holds thousands of open files) and closed once, when it ends."""

    obj: ObjectInfo

    def open(self) -> Sink: ...
    def close(self, ok: bool) -> None: ...


class UploadJob(Protocol):
    """One file of a batch upload: ``path`` in lakeFS, ``source`` on disk; ``done`` gets what
    lakeFS stored."""

    path: str
    source: Path

    def done(self, stored: ObjectInfo) -> None: ...


def download_one(store: VersionStore, repository: str, ref: str, job: DownloadJob) -> None:
    """Run one job through :meth:`VersionStore.download`."""
    sink = job.open()
    ok = False
    try:
        store.download(repository, ref, job.obj.path, sink, url=job.obj.download_url)  # type: ignore[arg-type]
        ok = True
    finally:
        job.close(ok)


class VersionStore(Protocol):
    def list_repositories(self) -> list[str]: ...
    def repository_exists(self, repository: str) -> bool: ...
    def default_branch(self, repository: str) -> str: ...
    def branch_head(self, repository: str, branch: str) -> str: ...
    def get_commit(self, repository: str, ref: str) -> Commit: ...
    def log(self, repository: str, ref: str, *, amount: int = 50) -> list[Commit]: ...
    def create_branch(
        self, repository: str, name: str, source: str, *, hidden: bool = False
    ) -> None: ...
    def delete_branch(self, repository: str, name: str) -> None: ...
    def list_branches(self, repository: str, *, prefix: str = "") -> list[tuple[str, str]]: ...
    def create_tag(self, repository: str, tag: str, ref: str) -> None: ...
    def get_tag(self, repository: str, tag: str) -> str:
        """The commit id ``tag`` names."""
        ...

    def commit(
        self, repository: str, branch: str, *, message: str, metadata: dict[str, str]
    ) -> Commit: ...
    def merge(
        self,
        repository: str,
        source: str,
        destination: str,
        *,
        message: str,
        metadata: dict[str, str],
        timeout: float | None = None,
    ) -> str: ...
    def hard_reset(
        self, repository: str, branch: str, ref: str, *, timeout: float | None = None
    ) -> None: ...
    def revert(self, repository: str, branch: str, commit: str, *, parent_number: int) -> str: ...
    def list_objects(
        self, repository: str, ref: str, prefix: str, *, direct: bool = False
    ) -> Iterator[ObjectInfo]: ...
    def download(
        self, repository: str, ref: str, path: str, dest: IO[bytes], *, url: str = ""
    ) -> None: ...
    def download_many(
        self, repository: str, ref: str, jobs: Iterable[DownloadJob], *, parallelism: int
    ) -> None:
        """Every job's object, ``parallelism`` at a time; the first lasting failure raises."""
        ...

    def upload(self, repository: str, branch: str, path: str, source: Path) -> ObjectInfo: ...
    def upload_many(
        self, repository: str, branch: str, jobs: Iterable[UploadJob], *, parallelism: int
    ) -> None:
        """Every job's file to ``branch``, ``parallelism`` at a time (plain uploads)."""
        ...

    def upload_bytes(
        self, repository: str, branch: str, path: str, data: bytes, *, if_absent: bool = False
    ) -> None: ...
    def delete_objects(self, repository: str, branch: str, paths: Sequence[str]) -> None: ...
    def diff_refs(
        self, repository: str, left: str, right: str, *, prefix: str = ""
    ) -> list[tuple[str, str]]:
        """``(kind, path)`` of every object under ``prefix`` that differs from ``left`` to
        ``right``; kind is ``added``, ``removed`` or ``changed``."""
        ...

    def copy_object(self, repository: str, source_ref: str, path: str, branch: str) -> None:
        """Stage ``path`` as it is on ``source_ref`` onto ``branch`` (uncommitted)."""
        ...

    def has_uncommitted(self, repository: str, branch: str) -> bool: ...
    def uncommitted_outside(self, repository: str, branch: str, prefix: str) -> list[str]:
        """Some uncommitted paths of ``branch`` outside ``prefix`` (none: all inside)."""
        ...
