"""lakeFS and Conductor killed and restarted while an attempt is in flight.

Transient errors are retried with backoff; the attempt re-reads state afterwards and the
workflow completes with exactly one publication.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore
from perago_dev import stack

from .harness import (
    attempts,
    one_step,
    publications,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial]


@pytest.mark.parametrize("service", ["lakefs", "conductor"])
def test_server_restart_mid_attempt(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    service: str,
) -> None:
    if os.environ.get("PERAGO_TEST_STACK_FROM_ENV"):
        pytest.skip("restarting servers needs the stack from `perago dev up`")
    env = make_env(PERAGO_TEST_RESPONSE_TIMEOUT="120", PERAGO_JANITOR_ON_START="false")
    name = f"pt_wf_restart_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", {"files": {"r.txt": service}})
    input_ref = store.branch_head(repo, "main")
    wid = start(conductor, name, repo, ref=input_ref)
    with worker({**env, "PERAGO_FAILPOINTS": "after_stage=pause:1"}, tmp_path / "w.log") as w:
        w.wait_for("failpoint_hit", failpoint="after_stage")
        stack.restart(service)  # the attempt resumes against a server that went away
        wf = wait_workflow(conductor, wid, timeout=240)
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    assert [t["status"] for t in attempts(wf, "step")] == ["COMPLETED"]
    head = store.get_commit(repo, store.branch_head(repo, "main"))
    assert [c.id for c in publications(store, repo)] == [head.id]
    assert head.parents[0] == input_ref
    assert staging_branches(store, repo) == []
