"""What the worker-level unit tests share: an in-memory lakeFS with one seeded repository
and a stub Conductor (modules that need another store define their own ``store``)."""

from __future__ import annotations

import pytest

from perago.testing import MemoryStore, StubOrchestrator


@pytest.fixture
def store() -> MemoryStore:
    """Repository ``repo`` whose ``main`` holds ``data/in.txt`` in one commit."""
    s = MemoryStore()
    s.create_repository("repo")
    s.upload_bytes("repo", "main", "data/in.txt", b"input")
    s.commit("repo", "main", message="seed", metadata={})
    return s


@pytest.fixture
def stub() -> StubOrchestrator:
    return StubOrchestrator(gate_timeout=20)
