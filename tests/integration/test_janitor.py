"""A killed worker leaves a staging branch; the janitor removes it and never a live one."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from .harness import (
    one_step,
    perago_cli,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(PERAGO_TEST_RESPONSE_TIMEOUT="5")


def test_orphan_staging_branch_removed_live_one_kept(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = f"pt_wf_jan_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", {"files": {"j.txt": "j"}})
    wid = start(conductor, name, repo)
    quiet = {**env, "PERAGO_JANITOR_ON_START": "false"}
    with worker({**quiet, "PERAGO_FAILPOINTS": "after_stage=kill"}, tmp_path / "killed.log") as w:
        assert w.proc.wait(timeout=60) == -signal.SIGKILL
    [orphan] = staging_branches(store, repo)
    # hidden from users' branch lists (lakeFS UI, lakectl), found by the janitor all the same
    assert orphan not in {b.id for b in store.branches.list_branches(repo).results}

    # the retry pauses right after staging (30 s: two janitor CLI runs must fit in the pause
    # on a loaded 2-core machine): its branch belongs to a live attempt
    release = tmp_path / "release"  # ends the pause once the janitor runs are done
    with worker(
        {
            **quiet,
            "PERAGO_FAILPOINTS": "after_stage=pause:30",
            "PERAGO_FAILPOINTS_RELEASE": str(release),
        },
        tmp_path / "live.log",
    ) as live:
        live.wait_for("failpoint_hit", failpoint="after_stage", timeout=60)
        assert len(staging_branches(store, repo)) == 2
        live_branch = next(b for b in staging_branches(store, repo) if b != orphan)
        janitor = ["janitor", "--repository", repo, "--lease-watch", "0s"]
        dry = perago_cli([*janitor, "--dry-run"], env)
        assert dry.returncode == 0, dry.stderr
        assert f"would remove {repo}/{orphan}" in dry.stdout and live_branch not in dry.stdout
        # its log says what it would do, never that it removed anything
        assert "janitor_would_remove" in dry.stderr and "janitor_removed" not in dry.stderr
        # the live attempt holds its branch lease (the killed one's was taken over)
        assert f"kept lease branches/{repo}/main: held by" in dry.stdout
        assert orphan in staging_branches(store, repo)
        done = perago_cli(janitor, env)
        assert done.returncode == 0, done.stderr
        assert staging_branches(store, repo) == [live_branch]
        release.write_text("go")
        wf = wait_workflow(conductor, wid, timeout=120)
    assert wf["status"] == "COMPLETED"
    assert staging_branches(store, repo) == []


@pytest.mark.serial  # its start-up pass sweeps every repository, other tests' orphans too
def test_worker_start_runs_a_janitor_pass(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    name = f"pt_wf_jan2_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", {"files": {"k.txt": "k"}})
    wid = start(conductor, name, repo)
    with worker(
        {**env, "PERAGO_JANITOR_ON_START": "false", "PERAGO_FAILPOINTS": "after_stage=kill"},
        tmp_path / "k.log",
    ) as w:
        assert w.proc.wait(timeout=60) == -signal.SIGKILL
    assert len(staging_branches(store, repo)) == 1
    conductor.terminate_workflow(wid, "test over")  # the attempt is now terminal
    with worker({**env, "PERAGO_JANITOR_ON_START": "true"}, tmp_path / "fresh.log") as fresh:
        fresh.wait_for("janitor_removed", repository=repo, timeout=60)
    assert staging_branches(store, repo) == []


def test_clusters_sharing_one_lakefs_never_remove_each_others_staging_branches(
    env: dict[str, str], store: LakeFSStore, repo: str
) -> None:
    """Three clusters' leftovers, none of whose tasks this Conductor knows: each cluster's
    janitor (PERAGO_CLUSTER_ID) sees only its own; a branch pattern narrows further."""
    head = store.branch_head(repo, "main")
    unnamed, blue, green = (
        "perago-stg-00000000-aaaa-p1",
        "perago-blue-stg-00000000-bbbb-p1",
        "perago-green-stg-00000000-cccc-p2",
    )
    for branch in (unnamed, blue, green):
        store.create_branch(repo, branch, head)

    def janitor(cluster: str, *extra: str) -> str:
        done = perago_cli(
            ["janitor", "--repository", repo, "--lease-watch", "0s", *extra],
            {**env, "PERAGO_CLUSTER_ID": cluster},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = janitor("blue", "--branch-pattern", "*-p2")
    assert "removed 0 staging branch(es)" in out
    janitor("blue")
    assert set(staging_branches(store, repo)) == {unnamed}
    assert {b for b, _ in store.list_branches(repo, prefix="perago-green-stg-")} == {green}
    janitor("green", "--branch-pattern", "*-p2")
    janitor("")
    assert [b for b, _ in store.list_branches(repo) if b.startswith("perago-")] == []
