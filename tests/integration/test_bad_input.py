"""Bad inputs a demanding user will produce: each gets a clear error and loses nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from .harness import (
    attempts,
    one_step,
    publications,
    staging_branches,
    start,
    wait_workflow,
    worker,
)

pytestmark = pytest.mark.integration
MANY = int(os.environ.get("PERAGO_MANY_FILES", "10000"))


@pytest.fixture
def env(make_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return make_env(PERAGO_TEST_RETRIES="0", PERAGO_TEST_RESPONSE_TIMEOUT="30")


def _run(
    conductor: ConductorClient,
    env: dict[str, str],
    tmp_path: Path,
    unique: str,
    repo: str,
    params: dict[str, Any],
) -> dict[str, Any]:
    name = f"pt_wf_bad_{unique}"
    one_step(conductor, name, f"pt_write_{unique}", params)
    with worker({**env, "PERAGO_TRANSFER_PARALLELISM": "16"}, tmp_path / "w.log"):
        return wait_workflow(
            conductor,
            start(conductor, name, repo),
            timeout=900,
        )


def test_non_utf8_file_name_fails_before_any_upload(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    head = store.branch_head(repo, "main")
    wf = _run(
        conductor, env, tmp_path, unique, repo, {"files": {"ok.txt": "fine"}, "bad_name": True}
    )
    assert wf["status"] == "FAILED"
    assert "not valid UTF-8" in attempts(wf, "step")[0]["reasonForIncompletion"]
    assert store.branch_head(repo, "main") == head
    assert staging_branches(store, repo) == [] and publications(store, repo) == []


def test_symlink_to_a_directory_outside_is_refused(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("do not upload")
    head = store.branch_head(repo, "main")
    wf = _run(
        conductor,
        env,
        tmp_path,
        unique,
        repo,
        {"files": {"a.txt": "a"}, "symlink": {"dir": str(secret)}},
    )
    assert wf["status"] == "FAILED"
    assert "symlink 'dir'" in attempts(wf, "step")[0]["reasonForIncompletion"]
    assert store.branch_head(repo, "main") == head
    assert not [o for o in store.list_objects(repo, "main", "") if "key" in o.path]


def test_many_small_files_are_published_in_one_commit(
    env: dict[str, str],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    wf = _run(conductor, env, tmp_path, unique, repo, {"many": MANY})
    assert wf["status"] == "COMPLETED", attempts(wf, "step")[0].get("reasonForIncompletion")
    ref = wf["output"]["workspace"]["ref"]
    assert sum(1 for _ in store.list_objects(repo, ref, "data/many/")) == MANY
    assert len(publications(store, repo)) == 1
    assert staging_branches(store, repo) == []


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"files": {"a.txt": "1"}, "flies": {"typo.txt": "x"}}, "unknown params ['flies']"),
        ({"import_missing": True}, "module 'perago_no_such_module'"),
    ],
    ids=["unknown-param", "missing-module"],
)
def test_failures_no_retry_can_fix_are_terminal_and_spend_no_retry(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    params: dict[str, Any],
    needle: str,
) -> None:
    env = make_env(PERAGO_TEST_RETRIES="3")
    wf = _run(conductor, env, tmp_path, unique, repo, params)
    (only,) = attempts(wf, "step")
    assert only["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert needle in only["reasonForIncompletion"]
    assert publications(store, repo) == []
