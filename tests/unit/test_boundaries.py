"""One adapter per outside system, checked by reading the source: only
``perago/adapters/conductor.py`` imports the Conductor SDK or spells Conductor's JSON, only
``perago/adapters/lakefs.py`` imports lakefs_sdk."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "perago"
CONDUCTOR_ADAPTER = "adapters/conductor.py"
LAKEFS_ADAPTER = "adapters/lakefs.py"

#: Conductor's JSON field names (task, task result, task and workflow definitions).
CONDUCTOR_KEYS = frozenset(
    {
        "taskId",
        "taskType",
        "taskDefName",
        "workflowInstanceId",
        "workflowId",
        "referenceTaskName",
        "taskReferenceName",
        "inputData",
        "outputData",
        "inputParameters",
        "reasonForIncompletion",
        "responseTimeoutSeconds",
        "timeoutSeconds",
        "retryCount",
        "retryDelaySeconds",
        "retryLogic",
        "timeoutPolicy",
        "pollCount",
        "workerId",
        "extendLease",
        "updateTime",
        "forkTasks",
        "loopOver",
        "loopCondition",
        "decisionCases",
        "defaultCase",
        "dynamicForkTasksParam",
        "dynamicForkTasksInputParamName",
        "schemaVersion",
        "ownerEmail",
        "subWorkflowParam",
    }
)

#: None left: `perago register`'s deep check reads `WorkflowStep`s the adapter makes.
KNOWN_EXCEPTIONS: set[str] = set()


@functools.cache
def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(PACKAGE)), ast.parse(p.read_text(), filename=str(p)))
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _strings(tree: ast.Module) -> set[str]:
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


@pytest.mark.parametrize(
    ("sdk", "adapter"),
    [
        ("conductor", CONDUCTOR_ADAPTER),
        ("lakefs_sdk", LAKEFS_ADAPTER),
        ("pycurl", "adapters/curl.py"),
    ],
)
def test_only_the_adapter_imports_its_sdk(sdk: str, adapter: str) -> None:
    offenders = [
        path
        for path, tree in _modules()
        if path != adapter and any(m == sdk or m.startswith(f"{sdk}.") for m in _imports(tree))
    ]
    assert offenders == [], f"import {sdk} only in perago/{adapter}"
    adapter_tree = dict(_modules())[adapter]
    assert any(m.startswith(sdk) for m in _imports(adapter_tree)), "the check reads imports"


def test_only_the_conductor_adapter_spells_conductor_json() -> None:
    offenders = {
        path: sorted(_strings(tree) & CONDUCTOR_KEYS)
        for path, tree in _modules()
        if path != CONDUCTOR_ADAPTER and path not in KNOWN_EXCEPTIONS
    }
    assert {p: keys for p, keys in offenders.items() if keys} == {}
    assert _strings(dict(_modules())[CONDUCTOR_ADAPTER]) & CONDUCTOR_KEYS, "the check reads keys"


def test_adapters_take_connection_values_and_nothing_leans_on_them() -> None:
    """Settings build adapters (perago/wiring.py), never the reverse, so the old import cycle
    adapters/lakefs -> config -> coord/factory -> coord/lakefs_objects -> adapters/lakefs
    cannot come back; coordination talks to lakeFS through the VersionStore protocol."""
    modules = dict(_modules())
    for adapter in (CONDUCTOR_ADAPTER, LAKEFS_ADAPTER):
        leaning = {m for m in _imports(modules[adapter]) if m.startswith("perago.")}
        assert not leaning & {"perago.config", "perago.wiring", "perago.cli"}, adapter
        assert not {m for m in leaning if m.startswith("perago.coord")}, adapter
    for path, tree in modules.items():
        if path.startswith("coord/"):
            assert not {m for m in _imports(tree) if m.startswith("perago.adapters")}, path
    assert "perago.adapters.lakefs" in _imports(
        modules["wiring.py"]
    ) or "perago.adapters.lakefs" in {
        n.module for n in ast.walk(modules["wiring.py"]) if isinstance(n, ast.ImportFrom)
    }


def _module_name(path: str) -> str:
    parts = ["perago", *path.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _perago_imports(path: str, tree: ast.Module) -> set[str]:
    """The perago modules a module imports anywhere: at load time, inside functions (a
    deferred import is still a dependency) and under ``if TYPE_CHECKING``."""
    known = {_module_name(p) for p, _ in _modules()}
    here = _module_name(path)
    package = here if path.endswith("__init__.py") else here.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for a in node.names:  # `from pkg import module` imports the module
                names.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {n for n in names if n in known and n != here}


def test_no_import_cycle_between_modules() -> None:
    """Lower layers never import upper ones back, not even in a function or for a type (a
    cycle works only by the accident of import order, and blurs which layer depends on
    which). A package importing its own submodules is not a cycle."""
    graph = {_module_name(p): _perago_imports(p, t) for p, t in _modules()}

    def owns(a: str, b: str) -> bool:  # a package importing its own submodule
        return b.startswith(a + ".")

    cycles = set()
    for start in graph:
        stack = [(start, (start,))]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if owns(node, nxt):
                    continue
                if nxt == start:
                    cycles.add(" -> ".join((*path, nxt)))
                elif nxt not in path and len(path) < 8:
                    stack.append((nxt, (*path, nxt)))
    assert sorted(cycles) == []
    assert "perago.publish" in graph["perago.worker.runtime"], "the check reads imports"


def test_import_perago_loads_only_the_task_api() -> None:
    """A task module's `import perago` costs the task API alone: no publisher, cache,
    coordination, logging or metrics stack (the worker loads those)."""
    import subprocess
    import sys

    code = "import sys, perago; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout.split()
    )
    ours = {m for m in loaded if m == "perago" or m.startswith("perago.")}
    assert ours == {
        "perago",
        "perago._api",
        "perago._api.context",
        "perago._api.inputs",
        "perago._api.prefix_templates",
        "perago._api.task",
        "perago.core",
        "perago.core.lakefs_names",
        "perago.errors",
    }
    assert not loaded & {"structlog", "prometheus_client", "boto3", "pyspark", "httpx"}


#: The layers, lowest first: a module imports only from its own layer and those below (at
#: load time, in a function, or for a type). docs/architecture.md draws the same picture.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"perago.errors"}),
    frozenset({"perago.core"}),
    frozenset({"perago.telemetry"}),
    frozenset({"perago._api", "perago.wap"}),
    frozenset({"perago.adapters", "perago.coord", "perago.workspace"}),
    frozenset({"perago.config"}),
    frozenset({"perago.publish", "perago.conductor"}),
    frozenset({"perago.worker"}),
    frozenset({"perago.wiring", "perago.testing"}),
    frozenset({"perago", "perago.cli", "perago.__main__"}),
)


def _layer(module: str) -> int:
    unit = ".".join(module.split(".")[:2])
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def test_no_import_runs_back_up_a_layer() -> None:
    upward = sorted(
        f"{_module_name(path)} -> {target}"
        for path, tree in _modules()
        for target in _perago_imports(path, tree)
        if _layer(target) > _layer(_module_name(path))
    )
    assert upward == []
    assert _layer("perago.worker.runtime") > _layer("perago.publish.transaction")


def test_the_top_of_the_package_is_small() -> None:
    """The façade, the commands, settings, errors, wiring, the test kit and the built-in
    write-audit-publish tasks (a module users name on the command line): the rest lives in
    the layers' packages."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
