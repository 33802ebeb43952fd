"""The local stack is its own distribution (perago-dev/): the runtime wheel and the worker
image carry no build recipes, the runtime never imports it, and `perago dev` comes through
the `perago.cli` entry point it declares (or says how to install it)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from perago import cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_runtime_wheel_carries_no_stack_recipes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "hatchling.build"  # builds out of tree
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["perago"]
    assert (ROOT / "perago" / "py.typed").is_file()
    for pattern in ("go.mod", "pom.xml", "package.json"):
        assert not list((ROOT / "perago").rglob(pattern)), pattern
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert "COPY perago ./perago" in dockerfile and "COPY perago-dev " not in dockerfile


def test_the_runtime_never_imports_the_dev_distribution() -> None:
    for py in (ROOT / "perago").rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not [n for n in names if n.startswith("perago_dev")], py


def test_perago_dev_is_mounted_from_its_entry_point() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "perago", "dev", "--help"], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "up" in shown.stdout and "down" in shown.stdout


def test_without_perago_dev_the_command_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    def no_plugins(**_: Any) -> list[Any]:
        return []

    monkeypatch.setattr(cli, "app", typer.Typer())
    monkeypatch.setattr(importlib.metadata, "entry_points", no_plugins)
    cli._mount_subcommands()
    out = CliRunner().invoke(cli.app, ["dev", "up", "--spark"])
    assert out.exit_code == 2
    assert "pip install <your Perago checkout>/perago-dev" in out.output
