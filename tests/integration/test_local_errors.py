"""A local fault is no network fault: it fails at once instead of being retried for a minute."""

from __future__ import annotations

from pathlib import Path

import pytest

from perago.adapters.lakefs import LakeFSStore
from perago.errors import WorkspaceError

pytestmark = pytest.mark.integration


def test_a_missing_upload_source_fails_as_a_workspace_error(
    store: LakeFSStore, repo: str, tmp_path: Path
) -> None:
    # Before: FileNotFoundError, an OSError, counted as transient and retried for 60 s.
    with pytest.raises(WorkspaceError, match="the workspace changed after the diff"):
        store.upload(repo, "main", "data/gone.txt", tmp_path / "gone.txt")
