"""The attempt-local workspace: a private directory, its manifest, and the diff."""

from perago.workspace.cache import ContentCache
from perago.workspace.directory import AttemptDirectory
from perago.workspace.manifest import (
    Diff,
    Manifest,
    ManifestEntry,
    compute_diff,
    only_renames,
    scan,
    without_renamed_folders,
)
from perago.workspace.transfer import local_path_for, materialize, upload_all

__all__ = [
    "AttemptDirectory",
    "ContentCache",
    "Diff",
    "Manifest",
    "ManifestEntry",
    "compute_diff",
    "local_path_for",
    "materialize",
    "only_renames",
    "scan",
    "upload_all",
    "without_renamed_folders",
]
