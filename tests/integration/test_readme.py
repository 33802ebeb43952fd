"""The README's "Using it" commands, run exactly as written against the local stack.

The block starts after `make demo`, from the repository the demo recorded in
`.stack/demo-repository`; the test loads a smaller batch of generated raw orders the way the
demo does, records that repository instead (the file's previous content is put back) and
runs the block with bash, unchanged.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perago.workspace import upload_all

from .harness import ROOT, publications

RECORD = ROOT / ".stack" / "demo-repository"


def using_it_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Using it\n", 1)[1]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found, "README's 'Using it' section lost its bash block"
    return found.group(1)


@pytest.fixture
def demo_repository(store: Any, repo: str) -> Iterator[str]:
    from workers.orders.data import generate_orders

    with tempfile.TemporaryDirectory() as tmp:
        generate_orders(Path(tmp), rows=2_000, files=2)
        files = [p.relative_to(tmp).as_posix() for p in sorted(Path(tmp).rglob("*.csv"))]
        upload_all(store, repo, "main", "orders/", Path(tmp), files, parallelism=4)
        store.commit(repo, "main", message="load raw orders", metadata={"source": "demo"})
    before = RECORD.read_text() if RECORD.exists() else None
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(repo + "\n")
    try:
        yield repo
    finally:
        if before is None:
            RECORD.unlink(missing_ok=True)
        else:
            RECORD.write_text(before)


def test_the_readme_using_it_block_runs_as_written(
    stack_env: dict[str, str], store: Any, demo_repository: str
) -> None:
    block = using_it_block()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERAGO_", "LAKECTL_"))}
    # The one setting the commands do not make: tests beside this one keep orphan staging
    # branches for their own janitor, and a worker's start-up pass sweeps every repository.
    env["PERAGO_JANITOR_ON_START"] = "false"
    done = subprocess.run(
        ["bash", "-e", "-c", block],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    assert "COMPLETED" in done.stderr
    published = publications(store, demo_repository)
    assert len(published) == 2  # clean and revenue write; report only reads
    assert published[0].id[:12] in done.stdout  # `perago log` showed the newest
