"""The one place that turns settings into connected parts: lakeFS, Conductor, leases, Spark.

Everything else takes its parts as arguments (the worker, the runner, the janitor and the
publisher only know the ``VersionStore`` and ``Orchestrator`` protocols), so tests can hand
them in-memory twins; the commands (``perago worker``, ``janitor``, ``repo init``, ...) build
the real ones here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perago.config import Settings

if TYPE_CHECKING:
    from perago._api.task import TaskDefinition
    from perago.adapters.conductor import ConductorClient
    from perago.adapters.lakefs import LakeFSStore
    from perago.coord.branch_leases import BranchLeases
    from perago.worker import Worker
    from perago.worker.spark import SparkSessions

__all__ = ["Services", "conductor_client", "lakefs_store", "services", "spark_sessions", "worker"]


def lakefs_store(settings: Settings) -> LakeFSStore:
    from perago.adapters.lakefs import LakeFSStore

    return LakeFSStore(settings)


def conductor_client(settings: Settings) -> ConductorClient:
    from perago.adapters.conductor import ConductorClient

    return ConductorClient(settings)


@dataclass
class Services:
    """lakeFS, Conductor and the branch leases of one process, built from one settings."""

    settings: Settings
    store: LakeFSStore
    conductor: ConductorClient
    leases: BranchLeases | None

    def close(self) -> None:
        self.store.close()
        self.conductor.close()


@contextmanager
def services(settings: Settings) -> Iterator[Services]:
    """Connected parts for a command; closed at the end."""
    from perago.coord.factory import branch_leases

    store = lakefs_store(settings)
    built = Services(settings, store, conductor_client(settings), branch_leases(settings, store))
    try:
        yield built
    finally:
        built.close()


def spark_sessions(
    settings: Settings, tasks: Sequence[TaskDefinition[Any, Any]]
) -> SparkSessions | None:
    """The worker's Spark sessions if any task wants Spark (S3A set up for in-place ones)."""
    if not any(t.wants_spark for t in tasks):
        return None
    from perago.worker.spark import SparkSessions

    return SparkSessions(settings, s3a=any(t.workspace.in_place for t in tasks))


def worker(
    settings: Settings,
    tasks: Sequence[TaskDefinition[Any, Any]],
    parts: Services,
    *,
    spark: SparkSessions | None = None,
    http_port: int | None = None,
) -> Worker:
    from perago.worker import Worker

    return Worker(
        tasks,
        settings=settings,
        store=parts.store,
        orchestrator=parts.conductor,
        leases=parts.leases,
        spark=spark,
        http_port=http_port,
    )
