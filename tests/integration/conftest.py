"""Fixtures for tests that drive real workers: a per-test environment with its own task names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .harness import TASKS, register_tasks


@pytest.fixture
def make_env(
    stack_env: dict[str, str], unique: str, tmp_path: Path
) -> Callable[..., dict[str, str]]:
    """Build the worker environment for this test and register its (uniquely named) tasks."""

    def make(module: str = TASKS, **overrides: str) -> dict[str, str]:
        env = {
            **stack_env,
            "PERAGO_TEST_SUFFIX": unique,
            "PERAGO_WORK_DIR": str(tmp_path / "work"),
            # Branch leases (default backend) are taken over after ttl x 1.5 = 6 s.
            "PERAGO_LEASE_TTL": "4",
            **overrides,
        }
        register_tasks(env, module)
        return env

    return make
