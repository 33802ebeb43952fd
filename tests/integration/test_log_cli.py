"""`perago log`: the publications on a branch, read back from lakeFS, as short blocks that
fit a 100-column terminal (links with --links) and as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import one_step, perago_cli, start, wait_workflow, worker


def test_perago_log_lists_each_publication_with_its_identity_and_links(
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = make_env()
    store.upload_bytes(repo, "main", "foreign.txt", b"not by perago")
    store.commit(repo, "main", message="a foreign commit", metadata={})
    wf_name = one_step(conductor, f"log_{unique}", f"pt_write_{unique}", {"files": {"a.txt": "1"}})
    with worker(env, tmp_path / "w.log") as w:
        wid = start(conductor, wf_name, repo)
        assert wait_workflow(conductor, wid)["status"] == "COMPLETED"
        w.stop()
    head = store.branch_head(repo, "main")

    done = perago_cli(["log", f"{repo}/main", "--json"], env)
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    assert len(records) == 1  # the foreign commit and the repository's first are left out
    (r,) = records
    assert r["commit"] == head
    assert (r["kind"], r["workflow_id"], r["step"], r["retry_count"]) == (
        "publication",
        wid,
        "step",
        0,
    )
    assert r["scope"] == "data/"
    assert r["fencing_token"]  # the default backend takes a branch lease
    assert r["created"] > 0
    assert r["lakefs_url"].endswith(f"/repositories/{repo}/commits/{head}")
    assert r["conductor_url"] == f"{env['CONDUCTOR_SERVER_URL'].rstrip('/')}/workflow/{wid}"

    table = perago_cli(["log", repo], env)
    assert table.returncode == 0, table.stderr
    assert head[:12] in table.stdout and wid in table.stdout
    assert "scope      data/" in table.stdout and f"token {r['fencing_token']}" in table.stdout
    assert max(map(len, table.stdout.splitlines())) <= 100, table.stdout  # fits a terminal
    assert r["lakefs_url"] not in table.stdout
    linked = perago_cli(["log", repo, "--links"], env)
    assert f"  lakeFS     {r['lakefs_url']}" in linked.stdout
    assert f"  Conductor  {r['conductor_url']}" in linked.stdout

    missing = perago_cli(["log", f"no-such-repo-{unique}"], env)
    assert missing.returncode == 1
    assert "error:" in missing.stderr
