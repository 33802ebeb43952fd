"""Shared fixtures: a clean environment for every test, and the real local stack.

Integration tests use real lakeFS and Conductor servers (``perago dev up``). They skip with a
reason on a laptop without the stack, but fail when ``CI`` is set.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perago import config
from perago.config import Settings

_STACK_VARS = (
    "CONDUCTOR_SERVER_URL",
    "LAKECTL_SERVER_ENDPOINT_URL",
    "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
    "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees another test's failpoints or Perago settings (which stack the run uses
    stays: its folder and profile)."""
    for name in list(os.environ):
        if name.startswith("PERAGO_") and name not in ("PERAGO_STACK_DIR", "PERAGO_STACK_PROFILE"):
            monkeypatch.delenv(name, raising=False)


#: The chart against a real API server (tests/k8s) runs only under `make test-k8s`: it builds
#: and starts a Kubernetes control plane, which `make test` does not.
collect_ignore = [] if os.environ.get("PERAGO_TEST_K8S") else ["k8s"]

#: Names this test run (the controller's, inherited by pytest-xdist's worker processes).
_RUN = os.environ.setdefault("PERAGO_TEST_RUN", uuid.uuid4().hex)

#: The tests' own JVMs (Spark drivers, executors, clusters; DynamoDB Local) run short jobs:
#: without the optimizing JIT and with the serial collector they cost about 30% less CPU,
#: which a 2-core machine running tests side by side needs. Not the stack's servers, which
#: run for the whole session (``stack_env`` starts them without it).
_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("JAVA_TOOL_OPTIONS", _TEST_JVM_OPTIONS)


def _started_marker() -> Path:
    from perago_dev.paths import stack_paths

    return stack_paths().run / "started-by-tests"


@pytest.fixture(scope="session")
def stack_env() -> Iterator[dict[str, str]]:
    """Environment variables that point at the running stack (started if needed).

    Under pytest-xdist every worker process asks for the stack; the first starts it (``up`` is
    idempotent and locked). A stack this run started is stopped when the run ends (the
    controller's ``pytest_sessionfinish``), so a CI run leaves no process behind, unless
    ``PERAGO_TEST_KEEP_STACK`` is set (``make test`` runs two phases on one stack); a stack
    that was already running (``perago dev up``) is left alone.
    """
    if os.environ.get("PERAGO_TEST_STACK_FROM_ENV"):
        yield {k: os.environ[k] for k in _STACK_VARS}
        return
    try:
        from perago_dev import stack

        was_running = all(s.running for s in stack.status().values())
        jvm_options = os.environ.pop("JAVA_TOOL_OPTIONS", None)
        try:
            info = stack.up()
        finally:
            if jvm_options is not None:
                os.environ["JAVA_TOOL_OPTIONS"] = jvm_options
    except Exception as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"the local stack is not available ({e}); run `perago dev up`")
    if not was_running:
        _started_marker().write_text(_RUN)
    yield info.env()


#: Test modules whose workers poll task types with fixed names (the example pipeline's
#: ``orders_*``, write-audit-publish's ``perago_wap_*``): run side by side, one test's worker
#: would take another's tasks. They run one at a time, in one pytest-xdist process.
_SHARED_TASK_NAMES = frozenset(
    {"test_orders_pipeline.py", "test_readme.py", "test_first_pipeline.py", "test_wap.py"}
)
#: Modules whose tests start Spark applications, one at a time in one process as well (with
#: the group above, at most two Spark applications start at once on a small machine).
_SPARK = frozenset({"test_spark_runtime.py"})


#: Single tests that poll a shared task name too (the unsuffixed ``perago_wap_*`` tasks):
#: beside test_wap.py they would take each other's tasks.
_SHARED_TASK_TESTS = frozenset({"test_policy.py::test_targets_and_protected_branches"})


def _group(nodeid: str) -> str:
    """The scheduling unit of a test: its group's name, or the test itself."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    test = nodeid.rsplit("/", 1)[-1].split("[", 1)[0]
    if name in _SHARED_TASK_NAMES or test in _SHARED_TASK_TESTS:
        return "shared-task-names"
    if name in _SPARK:
        return "spark"
    return nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` as this suite needs it: pytest-xdist's own (``xdist_group``
    markers) does not group with pytest 9 here, so the groups come from the file names, and
    every other test is its own unit, as with ``--dist load``."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return Groups(config, log)


#: Below this much free disk the suite is likely to fail for want of it: each Spark executor
#: of the cluster tests copies the 686 MB S3A jars, and lakeFS, the attempts and the clean
#: clones of CI runs all write to the same disk.
LOW_DISK_GIB = 8.0


def _free_gib(where: Path) -> float:
    import shutil

    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free / 2**30


def _disk_note() -> str:
    import tempfile

    places = {"stack": Path(__file__).resolve().parents[1] / ".stack"}
    places["tmp"] = Path(tempfile.gettempdir())
    free = {name: _free_gib(path) for name, path in places.items()}
    text = ", ".join(f"{name} {gib:.1f} GiB" for name, gib in free.items())
    if min(free.values()) < LOW_DISK_GIB:
        return (
            f"free disk: {text}: LOW (under {LOW_DISK_GIB:.0f} GiB); tests may fail with 'No "
            "space left on device' (Spark executors, lakeFS): remove old clones and "
            "`perago dev down --wipe` stale stack data"
        )
    return f"free disk: {text}"


def pytest_report_header(config: pytest.Config) -> str:
    return _disk_note()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """After a failed run, the free disk again: a full disk fails tests in unrelated ways."""
    if exitstatus != 0 and not hasattr(config, "workerinput"):
        terminalreporter.write_line(_disk_note())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the stack this run started, once every worker process is done."""
    if hasattr(session.config, "workerinput") or os.environ.get("PERAGO_TEST_KEEP_STACK"):
        return
    try:
        marker = _started_marker()
        if not marker.exists() or marker.read_text() != _RUN:
            return
        from perago_dev import spark_cluster, stack

        spark_cluster.down()  # one a test started and could not stop (test_spark_cluster)
        stack.down()
        marker.unlink(missing_ok=True)
    except Exception as e:  # noqa: BLE001 - reported, never masks the run's result
        print(f"\ncould not stop the local stack this test run started: {e}")


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("attempts")


@pytest.fixture(scope="session")
def settings(stack_env: dict[str, str], work_dir: Path) -> Settings:
    return config.load(env={**stack_env, "PERAGO_WORK_DIR": str(work_dir)})


@pytest.fixture(scope="session")
def store(settings: Settings) -> Iterator[object]:
    from perago.adapters.lakefs import LakeFSStore

    s = LakeFSStore(settings)
    yield s
    s.close()


@pytest.fixture(scope="session")
def conductor(settings: Settings) -> object:
    from perago.adapters.conductor import ConductorClient

    return ConductorClient(settings)


@pytest.fixture
def unique() -> str:
    """A suffix for names that must not collide with other tests (tasks, workflows, repos)."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def repo(store: object, unique: str) -> Iterator[str]:
    """A fresh lakeFS repository with branch main, deleted afterwards."""
    name = f"t-{unique}"
    store.create_repository(name)  # type: ignore[attr-defined]
    yield name
    try:
        store.delete_repository(name)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - cleanup only
        pass
