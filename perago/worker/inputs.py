"""An attempt's named inputs: resolve each to one commit, then hand the body a view of it.

Resolution happens with the pre-guardrails, before the body runs: an input the workflow
points nowhere valid, or that holds nothing at its commit, is a terminal error and nothing
is published. Locally, every input is downloaded into ``<attempt>/inputs/<name>/`` (through
the worker's content cache, shared, not lent: a dimension read by every partition of a
fan-out is downloaded once per worker) and made read-only; in place, the body gets
``s3a://`` URIs at the commits.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from perago._api.inputs import Inputs, ResolvedInput, unknown_override
from perago._api.task import TaskDefinition
from perago._api.task_io import InputSourceOverride
from perago.core.policy import AccessPolicy
from perago.core.store import VersionStore
from perago.errors import GuardrailError, NotFoundError, WorkspaceError
from perago.publish.identity import WorkspaceTarget
from perago.telemetry import metrics
from perago.workspace import ContentCache, Manifest, compute_diff, materialize

__all__ = [
    "LocalInputs",
    "OneDownloadAtATime",
    "input_overrides",
    "local_inputs",
    "remote_inputs",
    "resolve_inputs",
]

log = structlog.get_logger("perago.worker.attempt")


def _overrides(
    defn: TaskDefinition[Any, Any], raw: object, declared: Mapping[str, str]
) -> dict[str, InputSourceOverride]:
    """The task input's ``inputs``: absent or null means every input takes its default."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise GuardrailError(
            f'the task input\'s "inputs" must be an object naming inputs of {defn.name}, e.g. '
            '{"customers": {"repository": "reference", "ref": "v2024"}}; got '
            f"{type(raw).__name__}"
        )
    unknown = sorted(str(k) for k in raw if k not in declared)
    if unknown:
        raise unknown_override(unknown, declared, defn.name)
    out = {}
    for name, value in raw.items():
        if value is None:
            continue
        try:
            out[name] = InputSourceOverride.model_validate(value)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or '(root)'}: {err['msg']}" for err in e.errors()
            )
            raise GuardrailError(
                f"input {name!r} of {defn.name}: invalid source ({problems}); give "
                '{"repository": "<repository>", "ref": "<branch, tag or commit>"} (both optional)'
            ) from e
    return out


def input_overrides(defn: TaskDefinition[Any, Any], raw: object) -> dict[str, InputSourceOverride]:
    """The task input's ``inputs``, checked before anything is read (``GuardrailError``)."""
    if not defn.workspace.inputs:
        if raw:
            named = sorted(map(str, raw)) if isinstance(raw, dict) else [repr(raw)]
            raise unknown_override(named, {}, defn.name)
        return {}
    return _overrides(defn, raw, defn.workspace.inputs)


def resolve_inputs(
    store: VersionStore,
    defn: TaskDefinition[Any, Any],
    overrides: dict[str, InputSourceOverride],
    target: WorkspaceTarget,
    params: Any,
    *,
    default_commit: str | None = None,
    policy: AccessPolicy | None = None,
) -> tuple[ResolvedInput, ...]:
    """Every declared input, resolved to the commit this attempt reads it at: an input the
    workflow does not point elsewhere (``overrides``, from :func:`input_overrides`) is read
    at ``default_commit`` (the target branch's head when the attempt started, or the pinned
    ref; default: the input ref)."""
    if not defn.workspace.inputs:
        return ()
    declared = defn.workspace.render_inputs(params)
    resolved = []
    for name, prefix in declared.items():
        source = overrides.get(name, InputSourceOverride())
        repository = source.repository or target.repository
        ref = source.ref or ""
        other = repository != target.repository
        if policy is not None and other and not ref:
            # which ref it is needs a look at the repository: only if it may be read at all
            policy.check_source(
                repository, "*", what=f"input {name!r} of {defn.name}", any_ref=True
            )
        if other and not store.repository_exists(repository):
            raise GuardrailError(
                f"input {name!r}: lakeFS repository {repository!r} does not exist; create it "
                "or fix the workflow's inputs"
            )
        if not ref and other:
            ref = store.default_branch(repository)
        if policy is not None and ref:  # the default source is the workspace's, checked already
            policy.check_source(
                repository,
                ref,
                what=f"input {name!r} of {defn.name}",
                narrowed=defn.workspace.allowed_sources,
            )
        if ref:
            try:
                commit = store.get_commit(repository, ref).id
            except NotFoundError as e:
                raise GuardrailError(
                    f"input {name!r}: ref {ref!r} does not exist in {repository!r}; name a "
                    "branch, tag or commit there (or drop the override to read the workspace's "
                    "input ref)"
                ) from e
        else:
            commit = default_commit or target.input_ref
        on_target = repository == target.repository and ref in ("", target.branch)
        if next(iter(store.list_objects(repository, commit, prefix)), None) is None:
            raise GuardrailError(
                f"input {name!r}: nothing under {prefix!r} in {repository}@{commit[:12]}"
                + (f" ({ref})" if ref else "")
                + "; write that folder first (an earlier step), point the input elsewhere in "
                'the workflow ("inputs"), or fix the task\'s WorkspaceSpec'
            )
        resolved.append(ResolvedInput(name, repository, ref, commit, prefix, on_target))
    log.info("inputs_resolved", inputs={r.name: r.location for r in resolved})
    return tuple(resolved)


_READ = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_READ_LIST = _READ | stat.S_IXUSR | stat.S_IXGRP


def _read_only(manifest: Manifest, root: Path) -> Manifest:
    """Files 0444, then folders 0555: a body writing to an input fails at once (unless it
    runs as root: :meth:`LocalInputs.check_unchanged` catches that). Returns the manifest
    with the stats the files have now (a chmod stamps a new ctime), settled again, so the
    check after the body costs one stat per file."""
    fresh = Manifest()
    for entry in manifest.entries.values():
        path = root / entry.path
        os.chmod(path, _READ)
        st = os.stat(path)
        fresh.add(replace(entry, ctime_ns=st.st_ctime_ns, ino=st.st_ino))
    fresh.settle(root)  # writes a probe file: before the folders are read-only
    for folder, _dirs, _files in os.walk(root, topdown=False):
        os.chmod(folder, _READ_LIST)
    return fresh


class LocalInputs:
    """The inputs downloaded for one attempt: the body's view, and the check that the body
    left them as they were (file modes do not stop a body running as root)."""

    def __init__(self, reads: tuple[ResolvedInput, ...], views: dict[str, Path]) -> None:
        self.view: Inputs[Path] = Inputs(views, {r.name: r for r in reads})
        self.manifests: dict[str, Manifest] = {}

    def check_unchanged(self) -> None:
        """``WorkspaceError`` (terminal) if the body changed, added or removed an input file."""
        for name, manifest in self.manifests.items():
            diff = compute_diff(manifest, self.view[name])
            if not diff.is_empty:
                paths = [*diff.added, *diff.changed, *diff.deleted][:5]
                raise WorkspaceError(
                    f"the body changed its input {name!r} ({', '.join(paths)}); inputs are "
                    "read-only and nothing was published: write what the task produces into its "
                    "workspace",
                    non_retryable=True,
                )


class OneDownloadAtATime:
    """Per input location (``repository@commit/prefix``), one attempt of this worker
    downloads at a time: attempts of a fan-out starting together would otherwise all miss
    the cache and fetch the same dimension side by side; the later ones wait for the first,
    then copy from the cache."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def location(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._held.get(key, (threading.Lock(), 0))
            self._held[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._held[key]
                if users == 1:
                    del self._held[key]
                else:
                    self._held[key] = (lock, users - 1)


def local_inputs(
    store: VersionStore,
    reads: tuple[ResolvedInput, ...],
    root: Path,
    *,
    parallelism: int,
    cache: ContentCache | None,
    one_at_a_time: OneDownloadAtATime | None = None,
) -> LocalInputs:
    """Download every input into ``root/<name>/``, read-only; the body's ``inputs``."""
    local = LocalInputs(reads, {r.name: root / r.name for r in reads})
    for read in reads:
        dest = root / read.name
        with (
            one_at_a_time.location(read.location)
            if one_at_a_time is not None and cache is not None
            else nullcontext()
        ):
            manifest = _materialize_shared(store, read, dest, parallelism, cache)
        local.manifests[read.name] = _read_only(manifest, dest)
        log.info(
            "input_materialized",
            input=read.name,
            location=read.location,
            files=len(manifest.entries),
            bytes=manifest.total_bytes,
            downloaded_bytes=manifest.total_bytes - manifest.cached_bytes,
        )
        metrics.FILES.labels("download").inc(len(manifest.entries))
        metrics.BYTES.labels("download").inc(manifest.total_bytes)
    return local


def _materialize_shared(
    store: VersionStore,
    read: ResolvedInput,
    dest: Path,
    parallelism: int,
    cache: ContentCache | None,
) -> Manifest:
    manifest = materialize(
        store,
        read.repository,
        read.commit,
        read.prefix,
        dest,
        parallelism=parallelism,
        cache=cache,
        share=True,
    )
    if cache is not None:  # now, not after the report: the next attempt copies from it
        cache.adopt(dest)
    return manifest


def remote_inputs(reads: tuple[ResolvedInput, ...]) -> Inputs[str]:
    """Each input's ``s3a://repository/commit/prefix`` URI (the lakeFS S3 gateway)."""
    views = {r.name: f"s3a://{r.repository}/{r.commit}/{r.prefix}" for r in reads}
    return Inputs(views, {r.name: r for r in reads})
