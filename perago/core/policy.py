"""Where a worker may read and publish: least privilege for workflows that name anything.

Anyone who can start a workflow names the repository, branch, ref and inputs a task uses;
the worker's lakeFS credentials reach whatever they reach (lakeFS open source has no
per-repository permissions, and its branch protection does not stop merges). So the worker
itself refuses, before reading or writing anything, what its settings do not allow:

* ``PERAGO_ALLOWED_TARGETS``: ``repository/branch`` globs a writable task may publish to;
* ``PERAGO_ALLOWED_SOURCES``: ``repository/ref`` globs a task may read (its workspace, at
  its branch or a named ref, and its named inputs);
* ``PERAGO_PROTECTED_BRANCHES``: ``branch`` or ``repository/branch`` globs no ordinary
  task may publish to; only ``perago_wap_publish``, after its workflow's audit step, may.

Unset means anything, as before. A task may narrow them further
(``WorkspaceSpec(allowed_targets=..., allowed_sources=...)``). The isolated branch of a
write-audit-publish workflow (``perago-wap-...``) counts as allowed wherever its repository
has an allowed target. Refusals are terminal ``PolicyError`` s naming the setting and the
value, and are counted by the worker (``perago_policy_refusals_total``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from perago.core.lakefs_names import is_wap_branch
from perago.errors import PolicyError

__all__ = ["AccessPolicy", "patterns"]


def patterns(text: str) -> tuple[str, ...]:
    """Comma-separated globs (a setting's value) as a tuple; blanks dropped."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _matches(value: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, g) for g in globs)


@dataclass(frozen=True)
class AccessPolicy:
    """The worker's allowed targets and sources and its protected branches, each a tuple of
    globs (empty: no limit / nothing protected)."""

    allowed_targets: tuple[str, ...] = ()
    allowed_sources: tuple[str, ...] = ()
    protected_branches: tuple[str, ...] = ()

    def _wap_branch_allowed(self, repository: str, branch: str) -> bool:
        """An isolated write-audit-publish branch, in a repository some allowed target or
        source names: its begin step checked the target it will publish to."""
        if not is_wap_branch(branch):
            return False
        globs = (*self.allowed_targets, *self.allowed_sources)
        return any(fnmatch.fnmatchcase(repository, g.partition("/")[0]) for g in globs)

    def check_target(
        self,
        repository: str,
        branch: str,
        *,
        task: str,
        narrowed: tuple[str, ...] = (),
        audited: bool = False,
    ) -> None:
        """May ``task`` publish onto ``repository/branch``? ``audited``: the publication of a
        write-audit-publish workflow, the one way onto a protected branch."""
        where = f"{repository}/{branch}"
        for setting, globs in (
            ("PERAGO_ALLOWED_TARGETS", self.allowed_targets),
            ("the task's WorkspaceSpec(allowed_targets=...)", narrowed),
        ):
            if (
                globs
                and not _matches(where, globs)
                and not (
                    globs is self.allowed_targets and self._wap_branch_allowed(repository, branch)
                )
            ):
                raise PolicyError(
                    f"{task} may not publish to {where}: {setting} allows only "
                    f"{', '.join(globs)}; point the workflow at an allowed branch, or widen "
                    "the setting. Nothing was read or published",
                    refused="target",
                )
        protected = any(
            _matches(branch, [g]) if "/" not in g else _matches(where, [g])
            for g in self.protected_branches
        )
        if protected and not audited:
            raise PolicyError(
                f"{task} may not publish to {where}: the branch is protected "
                f"(PERAGO_PROTECTED_BRANCHES={','.join(self.protected_branches)}); only a "
                "write-audit-publish workflow's publish step may land there, after its audit "
                "(docs/protocol.md, write-audit-publish). Nothing was read or published",
                refused="protected",
            )

    def check_source(
        self,
        repository: str,
        ref: str,
        *,
        what: str,
        narrowed: tuple[str, ...] = (),
        any_ref: bool = False,
    ) -> None:
        """May ``what`` (the workspace, an input) be read from ``repository/ref``? With
        ``any_ref``: from some ref of ``repository`` at all (before its default branch is
        looked up)."""
        where = f"{repository}/{ref}"
        if any_ref:
            repos = [g.partition("/")[0] for g in self.allowed_sources]
            if repos and not _matches(repository, repos):
                raise PolicyError(
                    f"{what} may not be read from repository {repository}: "
                    f"PERAGO_ALLOWED_SOURCES allows only {', '.join(self.allowed_sources)}; "
                    "point the workflow at an allowed source, or widen the setting. Nothing "
                    "was read or published",
                    refused="source",
                )
            return
        for setting, globs in (
            ("PERAGO_ALLOWED_SOURCES", self.allowed_sources),
            ("the task's WorkspaceSpec(allowed_sources=...)", narrowed),
        ):
            if (
                globs
                and not _matches(where, globs)
                and not (
                    globs is self.allowed_sources and self._wap_branch_allowed(repository, ref)
                )
            ):
                raise PolicyError(
                    f"{what} may not be read from {where}: {setting} allows only "
                    f"{', '.join(globs)}; point the workflow at an allowed source, or widen "
                    "the setting. Nothing was read or published",
                    refused="source",
                )
