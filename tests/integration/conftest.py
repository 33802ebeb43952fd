"""Fixtures for tests that drive real workers: a per-test environment with its own task names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .harness import TASKS, perago_cli, register_tasks


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


@pytest.fixture(scope="session")
def spark_cluster(stack_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The stack's Spark cluster (`perago dev up --spark`): its exported URLs; stopped at
    the end of the session."""
    up = perago_cli(["dev", "up", "--spark"], stack_env, timeout=300)
    assert up.returncode == 0, up.stderr
    env = perago_cli(["dev", "env"], stack_env)
    exported = dict(
        line.removeprefix("export ").split("=", 1)
        for line in env.stdout.splitlines()
        if line.startswith("export SPARK_")
    )
    yield {k: v.strip("'") for k, v in exported.items()}
    down = perago_cli(["dev", "down", "--spark"], stack_env)
    assert down.returncode == 0 and "spark-master" in down.stdout, down.stdout
