"""docs/first-pipeline.md, run as written: Perago pip-installed into a project of its own.

Only the line that names the checkout (``PERAGO=...``) is replaced, by this checkout; the
stack folder is the one the tests already run (``PERAGO_STACK_DIR``), so `perago dev up` from
the installed package finds it up instead of building a second one.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from perago_dev.paths import stack_paths

from .harness import ROOT


def walkthrough() -> str:
    text = (ROOT / "docs" / "first-pipeline.md").read_text()
    found = re.search(r"```bash\n(.*?)```", text, re.S)
    assert found, "docs/first-pipeline.md lost its bash block"
    lines = found.group(1).splitlines()
    assert lines[0].startswith("PERAGO=")
    return "\n".join(lines[1:]) + "\n"


def test_the_first_pipeline_walkthrough_runs_as_written(
    stack_env: dict[str, str], store: Any, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERAGO_", "LAKECTL_"))}
    env.pop("CONDUCTOR_SERVER_URL", None)
    env |= {"PERAGO": str(ROOT), "PERAGO_STACK_DIR": str(stack_paths().stack)}
    # Tests beside this one keep orphan staging branches for their own janitor, and a
    # worker's start-up pass sweeps every repository: this worker runs none.
    env["PERAGO_JANITOR_ON_START"] = "false"
    done = subprocess.run(
        ["bash", "-e", "-c", walkthrough()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    project = tmp_path / "my-pipeline"
    site = next((project / ".venv").glob("lib/python3*/site-packages"))
    recipes = site / "perago_dev" / "recipes"  # a real install of perago-dev
    assert (recipes / "lakefs" / "go.mod").is_file()
    # the runtime carries no build recipes: only perago-dev does
    assert (site / "perago").is_dir() and not list((site / "perago").rglob("go.mod"))
    assert not list((site / "perago").rglob("pom.xml"))
    assert not list((project / ".venv").glob("lib/python3*/site-packages/__editable__*perago*"))
    # built out of tree (issue 39): the install wrote nothing into the checkout
    for source in (ROOT, ROOT / "perago-dev"):
        left = [p.name for p in source.iterdir() if p.name == "build" or p.suffix == ".egg-info"]
        assert not left, f"pip install wrote {left} into {source}"
    repo = next(r for r in store.list_repositories() if r.startswith("greetings-"))
    try:
        head = store.get_commit(repo, store.branch_head(repo, "main"))
        assert head.metadata["perago.task_ref"] == "publish"
        files = sorted(o.path for o in store.list_objects(repo, "main", "greetings/"))
        assert files == ["greetings/ada.txt", "greetings/alan.txt"]
        assert head.id[:12] in done.stdout  # perago log showed it
        assert not [b for b, _ in store.list_branches(repo, prefix="perago-wap-")]
    finally:
        store.delete_repository(repo)
