"""The declared dependencies match the code and the lock.

Every third-party import of the package is declared (core or an extra); the optional
ones (pyspark, boto3) are never imported by ``import perago`` or the CLI; and the lock
(requirements/constraints.txt, `make lock`) pins every declared requirement within its range.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DIST = PYPROJECT["project"]["name"]
OPTIONAL = {
    "spark": {"pyspark"},
    "aws": {"boto3", "botocore"},
    "otel": {"opentelemetry"},
    "lineage": {"openlineage"},
}


def _requirements(extra: str | None) -> list[Requirement]:
    project = PYPROJECT["project"]
    raw = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(r) for r in raw]


def _imports(folder: Path) -> set[str]:
    names: set[str] = set()
    for py in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def _lock() -> dict[str, list[str]]:
    pins: dict[str, list[str]] = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            spec = line.split(";")[0].strip()
            name, _, version = spec.partition("==")
            pins.setdefault(canonicalize_name(name), []).append(version)
    return pins


def test_every_import_of_the_package_is_declared() -> None:
    stdlib = sys.stdlib_module_names
    third_party = {m for m in _imports(ROOT / "perago") if m not in stdlib and m != "perago"}
    to_dist = packages_distributions()
    core = {canonicalize_name(r.name) for r in _requirements(None)}
    optional = {canonicalize_name(r.name) for x in OPTIONAL for r in _requirements(x)}
    undeclared = {}
    for module in sorted(third_party):
        dists = {canonicalize_name(d) for d in to_dist.get(module, [module])}
        if module in {m for ms in OPTIONAL.values() for m in ms}:
            # botocore comes with boto3
            if not dists & optional and module != "botocore":
                undeclared[module] = dists
        elif not dists & core:
            undeclared[module] = dists
    assert not undeclared, f"imported by perago/ but not declared in pyproject.toml: {undeclared}"


def test_optional_dependencies_stay_optional() -> None:
    # What a worker without Spark tasks, AWS backends, traces or lineage loads must not need
    # the extras.
    code = (
        "import sys, perago, perago.cli, perago.worker, perago.coord.factory\n"
        "bad = sorted(m for m in ('pyspark', 'boto3', 'botocore', 'yaml', 'opentelemetry',"
        " 'openlineage') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_lock_pins_every_declared_requirement_in_range() -> None:
    pins = _lock()
    extras = list(PYPROJECT["project"]["optional-dependencies"])
    problems = []
    for extra in [None, *extras]:
        for req in _requirements(extra):
            name = canonicalize_name(req.name)
            if name == canonicalize_name(DIST):
                continue
            versions = pins.get(name)
            if not versions:
                problems.append(f"{req.name} is not in the lock")
            elif not any(req.specifier.contains(v, prereleases=True) for v in versions):
                problems.append(f"{req.name}: lock has {versions}, pyproject says {req.specifier}")
    assert not problems, "run `make lock`: " + "; ".join(problems)


def test_the_unused_are_gone() -> None:
    declared = {
        canonicalize_name(r.name)
        for extra in [None, *PYPROJECT["project"]["optional-dependencies"]]
        for r in _requirements(extra)
    }
    assert not declared & {"testcontainers", "pyarrow"} - _allowed_by_connect()
    core = {canonicalize_name(r.name) for r in _requirements(None)}
    assert not core & {"pyspark", "boto3"}, "these are extras (spark, aws)"


def _allowed_by_connect() -> set[str]:
    # Spark Connect's client needs pyarrow: allowed in that extra only.
    connect = PYPROJECT["project"]["optional-dependencies"].get("connect", [])
    return {canonicalize_name(Requirement(r).name) for r in connect}
