"""Names Perago makes in lakeFS come from one module, and keep the janitor's contract."""

from __future__ import annotations

import ast
from pathlib import Path

from perago.core import lakefs_names as names

PACKAGE = Path(__file__).resolve().parents[2] / "perago"
NAME_STARTS = ("perago-stg-", "perago-replaced-", "_perago/", "_perago_coord", "_lakefs_actions/")


def _docstrings(tree: ast.Module) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def test_only_lakefs_names_spells_lakefs_names() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "lakefs_names.py":
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and node.value.startswith(NAME_STARTS)
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}: {node.value!r}")
    assert offenders == []


def test_staging_names_are_unique_per_delivery_and_scoped_ones_share_the_prefix() -> None:
    a = names.staging_branch_name("task/1 x", 1)
    assert a == "perago-stg-task_1_x-p1"
    assert names.staging_branch_name("task/1 x", 2) != a
    assert names.staging_branch_name("t", 1, "eu1") == "perago-eu1-stg-t-p1"
    scoped = names.scoped_branch_name(a)
    assert scoped.startswith(names.staging_prefix()) and scoped.endswith("-p1")
    assert names.replaced_tag("c" * 64, 2) == f"perago-replaced-{'c' * 16}-r2"
