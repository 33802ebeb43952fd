"""Kill the worker at every failpoint; a fresh worker finishes; the invariants hold.

Invariants (docs/protocol.md): the workflow completes; exactly one publication of the step
sits on the input ref in the target's first-parent history and it is the reported output;
no staging branch survives the janitor.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago.failpoints import POINTS

from .harness import (
    attempts,
    perago_cli,
    publications,
    put_workflow,
    simple_task,
    staging_branches,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(PERAGO_TEST_RESPONSE_TIMEOUT="4", PERAGO_JANITOR_ON_START="false")


@pytest.mark.parametrize("point", POINTS)
def test_kill_at_failpoint_then_recover(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    point: str,
) -> None:
    name = f"pt_wf_crash_{unique}"
    put_workflow(
        conductor,
        name,
        [
            simple_task(
                f"pt_write_{unique}",
                "step",
                "${workflow.input.workspace}",
                {"files": {"c.txt": point}},
            )
        ],
    )
    input_ref = store.branch_head(repo, "main")
    wid = conductor.start_workflow(
        name, {"workspace": {"repository": repo, "branch": "main", "ref": input_ref}}
    )
    with worker({**env, "PERAGO_FAILPOINTS": f"{point}=kill"}, tmp_path / "killed.log") as w:
        assert w.proc.wait(timeout=60) == -signal.SIGKILL
    with worker(env, tmp_path / "fresh.log"):
        wf = wait_workflow(conductor, wid, timeout=90)
    assert wf["status"] == "COMPLETED"
    steps = attempts(wf, "step")
    if point == "after_complete":
        assert [t["status"] for t in steps] == ["COMPLETED"]  # reported before dying
    else:
        assert [t["status"] for t in steps] == ["TIMED_OUT", "COMPLETED"]
    out = wf["output"]["workspace"]["ref"]
    pubs = publications(store, repo)
    assert [c.id for c in pubs] == [out] == [store.branch_head(repo, "main")]
    assert pubs[0].parents[0] == input_ref
    done = perago_cli(["janitor", "--repository", repo], env)
    assert done.returncode == 0, done.stderr
    assert staging_branches(store, repo) == []
