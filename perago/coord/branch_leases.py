"""One lease per target branch, on the configured coordination store.

The default backend keeps the leases of a repository in that repository (lakeFS objects on
its ``_perago_coord`` branch), so nothing beyond lakeFS is needed and there is one store per
repository, built on first use. Other backends hold every repository's leases in one store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from perago.coord.lease import Grant, LeaseManager

__all__ = ["BranchLeases", "HeldLease", "lease_name"]

T = TypeVar("T")


def lease_name(repository: str, branch: str) -> str:
    return f"branches/{repository}/{branch}"


@dataclass
class HeldLease:
    """A granted branch lease and the manager that can renew, check and release it."""

    manager: LeaseManager
    grant: Grant

    @property
    def token(self) -> int:
        return self.grant.token

    def renew(self) -> None:
        """Extend the lease to a full ttl (LeaseLostError if it was taken over)."""
        self.grant = self.manager.renew(self.grant)

    def refresh(self) -> None:
        """Renew only if less than half the ttl is left (a guarded write checks anyway)."""
        if self.manager.time_left(self.grant) < self.manager.ttl / 2:
            self.renew()

    def guarded(self, write: Callable[[float], T]) -> T:
        return self.manager.guarded(self.grant, write)

    def release(self) -> None:
        self.manager.release(self.grant)

    def release_soon(self, on_error: Callable[[Exception], None]) -> None:
        """Release in the background (see :meth:`LeaseManager.release_soon`)."""
        self.manager.release_soon(self.grant, on_error)


class BranchLeases:
    """Hands out the lease of a target branch; thread-safe, one per worker process."""

    def __init__(self, managers: Callable[[str], LeaseManager], *, wait: timedelta) -> None:
        self._build = managers
        self._managers: dict[str, LeaseManager] = {}
        self._lock = threading.Lock()
        #: How long a publisher waits for a busy lease (longer than a takeover needs).
        self.wait = wait

    @classmethod
    def shared(cls, manager: LeaseManager, *, wait: timedelta) -> BranchLeases:
        """Every repository's leases in one store."""
        return cls(lambda _repository: manager, wait=wait)

    def manager(self, repository: str) -> LeaseManager:
        with self._lock:
            if repository not in self._managers:
                self._managers[repository] = self._build(repository)
            return self._managers[repository]

    def held(self, repository: str, branch: str) -> bool:
        """Whether someone holds the branch's lease right now (one read)."""
        return self.manager(repository).holder(lease_name(repository, branch)) is not None

    def pause(self, repository: str, seconds: float) -> None:
        """Wait on the clock of ``repository``'s leases between one-try acquires."""
        self.manager(repository).pause(seconds)

    def acquire(
        self, repository: str, branch: str, owner: str, *, wait: timedelta | None = None
    ) -> HeldLease:
        """Take the branch's lease, waiting up to ``wait`` (default :attr:`wait`;
        LeaseBusyError after that)."""
        manager = self.manager(repository)
        grant = manager.acquire(
            lease_name(repository, branch), owner, wait=self.wait if wait is None else wait
        )
        return HeldLease(manager, grant)
