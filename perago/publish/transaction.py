"""Try / Confirm / Cancel for one writable attempt (docs/protocol.md, steps 6-12).

Every decision is taken from the explicit staged reference, the workspace target and what
Conductor and lakeFS say now; nothing is remembered between attempts.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from perago.coord.branch_leases import BranchLeases
from perago.core.lakefs_names import replaced_tag, scoped_branch_name
from perago.core.retry_policy import MERGE_TRIES, merge_throttle_wait
from perago.core.store import Commit, VersionStore
from perago.errors import (
    ConflictError,
    CoordStoreError,
    HeadMovedError,
    PublishFenceError,
    StoreError,
    WorkspaceError,
)
from perago.publish.deliveries import LocalDeliveries
from perago.publish.fences import (
    AttemptLedger,
    HeadDecision,
    check_attempt,
    decide_publication,
    earlier_publications,
)
from perago.publish.first_parents import FirstParents
from perago.publish.group_commit import GroupMember, LeaseGroups
from perago.publish.identity import (
    AttemptIdentity,
    StagedReference,
    WorkspaceTarget,
    staging_branch_name,
)
from perago.publish.reads import check_reads
from perago.publish.scope import scope_markers
from perago.telemetry import metrics, steps, tracing
from perago.telemetry.steps import Boundary
from perago.workspace import ContentCache, Diff, upload_all

__all__ = ["Publication", "Publisher", "release_lease"]

#: Events carry the attempt's context (workflow id, task id, refs) from structlog's
#: contextvars, bound once by the runner (perago.worker.attempt.RunningAttempt.logging).
log = structlog.get_logger("perago.publish")


@dataclass(frozen=True)
class Publication:
    """What a publication left: the ref the target branch holds for this attempt and, when
    branch leases are configured, the lease that guarded it, still held.

    The caller reports COMPLETED as a guarded write under ``lease`` and then releases it
    (``docs/model-check.md``, re-delivery): a delivery that lost the lease meanwhile (a
    re-delivered task id took it) reports FAILED instead of a COMPLETED the branch may
    contradict. Callers that report nothing call :meth:`release`.
    """

    ref: str
    lease: GroupMember | None = None

    def release(self, *, wait: bool = False) -> None:
        if self.lease is not None:
            release_lease(self.lease, wait=wait)


def _turn(lease: GroupMember | None) -> contextlib.AbstractContextManager[None]:
    """A group member's turn from the publish fence to the merge or reset (see
    ``perago.publish.group_commit``); a lone grant needs none."""
    return lease.turn() if lease is not None else contextlib.nullcontext()


def _timings(merges: list[float], lease: GroupMember | None) -> dict[str, float]:
    """The ``published`` event's view of the branch's serial section: the merge's answer
    and the member's wait for its turn and time in it (milliseconds)."""
    out = {"merge_ms": round(1000 * merges[-1], 1)} if merges else {}
    if lease is not None and lease.turn_waited is not None:
        out["turn_wait_ms"] = round(1000 * lease.turn_waited, 1)
    if lease is not None and lease.turn_held is not None:
        out["turn_held_ms"] = round(1000 * lease.turn_held, 1)
    return out


def release_lease(lease: GroupMember, *, wait: bool = False) -> None:
    """Release a branch lease; a failure is only logged (it expires by itself).

    By default in the background: the publication is decided already, and this process's
    next use of the lease waits for the release (measured in docs/benchmarks.md). ``wait``
    releases before returning, as a worker does after its report: the task's duration has
    ended with the report, and a worker that dies right after it leaves no lease behind.
    """

    def failed(e: Exception) -> None:
        log.warning("lease_release_failed", fencing_token=lease.token, error=str(e))

    if not wait:
        lease.release_soon(failed)
        log.info("branch_lease_releasing", fencing_token=lease.token)
        return
    try:
        lease.release()
        log.info("branch_lease_released", fencing_token=lease.token)
    except Exception as e:  # noqa: BLE001 - it expires by itself; never mask the result
        failed(e)


#: A diff at most this large starts acquiring the branch lease while it uploads (see
#: :meth:`Publisher._acquire_during_upload`): its upload holds the lease for tens of ms at most.
EARLY_LEASE_MAX_FILES = 64
EARLY_LEASE_MAX_BYTES = 4 * 1024 * 1024


class _BackgroundAcquire:
    """The branch lease being acquired on a thread of its own while the caller uploads.

    Exactly one of :meth:`take` (the caller now owns the lease) and :meth:`drop` (released
    once granted) gives it a home, so a lease taken for nothing is never left held.
    """

    def __init__(self, take: Callable[[], GroupMember]) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="perago-lease-take")
        self._future = self._pool.submit(contextvars.copy_context().run, take)
        self._pool.shutdown(wait=False)
        self._taken = False

    def take(self) -> GroupMember:
        self._taken = True
        return self._future.result()

    def drop(self) -> None:
        """Release the lease once granted, unless taken; the caller does not wait for it."""
        if not self._taken:
            self._future.add_done_callback(_release_if_granted)


def _release_if_granted(future: Future[GroupMember]) -> None:
    if not future.cancelled() and future.exception() is None:
        release_lease(future.result())


class Publisher:
    """Runs the writable path of the protocol against a store and a ledger."""

    def __init__(
        self,
        store: VersionStore,
        ledger: AttemptLedger,
        *,
        worker_id: str,
        parallelism: int = 25,
        leases: BranchLeases | None = None,
        cache: ContentCache | None = None,
        deliveries: LocalDeliveries | None = None,
    ) -> None:
        self._store = store
        self._cache = cache
        self._ledger = ledger
        self._worker_id = worker_id
        self._parallelism = parallelism
        self._leases = leases
        self._groups = None if leases is None else LeaseGroups(leases, deliveries=deliveries)
        self._first_parents = FirstParents(store)

    @property
    def first_parents(self) -> FirstParents:
        """The process's commit cache (history walks of fences and incremental re-runs)."""
        return self._first_parents

    def publish(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        prefix: str,
        workspace: Path,
        diff: Diff,
    ) -> Publication:
        """Fence, stage, fence, confirm: the ref the target branch now holds for this attempt."""
        self._fence(me, 1)
        if diff.is_empty:
            return self._confirm_noop(me, target)
        early = self._acquire_during_upload(me, target, workspace, diff)
        try:
            branch = self._stage(me, target, prefix, workspace, diff)
            return self._commit_and_confirm(me, target, branch, early=early, counts=diff.summary())
        finally:
            if early is not None:
                early.drop()
            self.cancel(target.repository, staging_branch_name(me))

    def _acquire_during_upload(
        self, me: AttemptIdentity, target: WorkspaceTarget, workspace: Path, diff: Diff
    ) -> _BackgroundAcquire | None:
        """For a small diff, start acquiring the branch lease while it uploads.

        Its round trips then cost no time of their own; a large upload would hold the lease
        (and keep fan-out siblings waiting) for as long as it takes, so it waits as before.
        """
        if self._leases is None or len(diff.uploads) > EARLY_LEASE_MAX_FILES:
            return None
        if me.poll_count > 1:
            return None  # a re-delivery waits out report windows before it takes the lease
        try:
            size = sum((workspace / p).stat().st_size for p in diff.uploads)
        except OSError:
            return None  # the upload reports it
        if size > EARLY_LEASE_MAX_BYTES:
            return None
        return _BackgroundAcquire(lambda: self._take_lease(me, target))

    def publish_branch(
        self, me: AttemptIdentity, target: WorkspaceTarget, source: str
    ) -> Publication:
        """Publish onto ``target`` everything ``source`` (a ref of a write-audit-publish
        branch) changed since the input ref, as one publication of this attempt: the change
        is staged on the attempt's own staging branch and goes through the same fences,
        branch lease and Confirm as any step's (``docs/protocol.md``, write-audit-publish)."""
        self._fence(me, 1)
        repo = target.repository
        changes = self._store.diff_refs(repo, target.input_ref, source)
        if not changes:
            return self._confirm_noop(me, target)
        try:
            branch = self._create_staging_branch(me, target)
            removed = [path for kind, path in changes if kind == "removed"]
            for kind, path in changes:
                if kind != "removed":
                    self._store.copy_object(repo, source, path, branch)
            if removed:
                self._store.delete_objects(repo, branch, removed)
            log.info("wap_changes_staged", source=source, changes=len(changes))
            return self._commit_and_confirm(
                me,
                target,
                branch,
                counts={"changed": len(changes) - len(removed), "deleted": len(removed)},
            )
        finally:
            self.cancel(repo, staging_branch_name(me))

    def open_in_place(self, me: AttemptIdentity, target: WorkspaceTarget) -> str:
        """Create the staging branch an in-place body writes to (through the S3 gateway)."""
        branch = self._create_staging_branch(me, target)
        log.info("staging_branch_created", staging_branch=branch, in_place=True)
        return branch

    def publish_in_place(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        *,
        prefix: str = "",
    ) -> Publication:
        """Commit what the body wrote on the staging branch, then the same fences and Confirm.

        Only writes inside the task's ``prefix`` may be published: anything else on the staging
        branch (another dataset, ``_lakefs_actions/``) fails the attempt, nothing published.
        The staging branch is cancelled here, whatever happens (the caller cancels it itself
        only when the body fails before this is called).
        """
        try:
            self._fence(me, 1)
            repo, branch = target.repository, staging_branch_name(me)
            outside = self._store.uncommitted_outside(repo, branch, prefix)
            if outside:
                log.warning("in_place_out_of_scope", prefix=prefix, paths=outside[:5])
                raise WorkspaceError(
                    f"the task wrote outside its prefix {prefix!r} on its staging branch "
                    f"({', '.join(outside[:5])}); nothing was published. Write only under the "
                    "workspace's output URI, or widen the task's WorkspaceSpec prefix",
                    non_retryable=True,
                )
            if not self._store.has_uncommitted(repo, branch):
                return self._confirm_noop(me, target)
            return self._commit_and_confirm(me, target, branch)
        finally:
            self.cancel(target.repository, staging_branch_name(me))

    def _fence(self, me: AttemptIdentity, n: int, lease: GroupMember | None = None) -> None:
        """Attempt fence ``n``; under a lease share, the time its read was sent is kept: a
        report window opens only soon after it (``FENCE_FRESH_SECONDS``)."""

        def check() -> None:
            check_attempt(self._ledger, me, worker_id=self._worker_id)

        if lease is None:
            check()
        else:
            lease.fence(check)
        log.info("attempt_fence_passed", fence=n)
        steps.reached(Boundary(f"after_fence{n}"), me)

    def _commit_and_confirm(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        branch: str,
        early: _BackgroundAcquire | None = None,
        *,
        counts: dict[str, int] | None = None,
    ) -> Publication:
        """Under the branch lease: the staged commit, attempt fence 2, publish fence, Confirm."""
        self._upload_markers(me, target, branch)
        with self._branch_lease(me, target, early) as lease:
            staged = self._commit_staging(me, target, branch, lease, **(counts or {}))
            steps.reached(Boundary.AFTER_STAGE, me)
            self._fence(me, 2, lease)
            started = time.monotonic()
            with _turn(lease):
                published = self._confirm(me, target, staged, lease)
            metrics.PUBLISH_SECONDS.labels("publish").observe(
                time.monotonic() - started, exemplar=tracing.exemplar()
            )
            steps.reached(Boundary.AFTER_PUBLISH, me)
            return Publication(published, lease)

    # -- Try ---------------------------------------------------------------------------------

    def _stage(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        prefix: str,
        workspace: Path,
        diff: Diff,
    ) -> str:
        """Upload the diff to a fresh staging branch (committed later, under the lease)."""
        repo = target.repository
        started = time.monotonic()
        branch = self._create_staging_branch(me, target)
        log.info("staging_branch_created", staging_branch=branch)
        upload_all(
            self._store,
            repo,
            branch,
            prefix,
            workspace,
            diff.uploads,
            parallelism=self._parallelism,
            cache=self._cache,
        )
        if diff.deleted:
            self._store.delete_objects(repo, branch, [prefix + p for p in diff.deleted])
        metrics.STAGE_SECONDS.observe(time.monotonic() - started)
        metrics.FILES.labels("upload").inc(len(diff.uploads))
        metrics.BYTES.labels("upload").inc(
            sum((workspace / p).stat().st_size for p in diff.uploads)
        )
        return branch

    def _create_staging_branch(self, me: AttemptIdentity, target: WorkspaceTarget) -> str:
        repo, branch = target.repository, staging_branch_name(me)
        # Hidden: users' branch lists stay clean; the janitor lists hidden branches too.
        try:
            self._store.create_branch(repo, branch, target.input_ref, hidden=True)
        except ConflictError:
            # Only this very delivery uses this name: a leftover of an earlier try of ours.
            self._store.delete_branch(repo, branch)
            self._store.create_branch(repo, branch, target.input_ref, hidden=True)
        return branch

    def _commit_staging(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        branch: str,
        lease: GroupMember | None,
        **counts: int,
    ) -> StagedReference:
        """Commit the staging branch: the commit that a replacement publication installs."""
        repo = target.repository
        token = {} if lease is None else {"fencing_token": str(lease.token)}
        commit = self._store.commit(
            repo,
            branch,
            message=f"perago: stage {me.task_type} ({me.reference_name}) of {me.workflow_id}",
            metadata={
                **me.metadata(target.input_ref, kind="staged", **token),
                **target.reads_metadata(),
            },
        )
        if commit.parents[:1] != (target.input_ref,):
            raise StoreError(
                f"staged commit {commit.id} has parents {commit.parents}, expected the input "
                f"ref {target.input_ref}; the staging branch was changed by someone else"
            )
        log.info("staged", staging_branch=branch, staging_commit=commit.id, **counts)
        return StagedReference(repo, branch, commit.id)

    def _upload_markers(self, me: AttemptIdentity, target: WorkspaceTarget, branch: str) -> None:
        """The scope markers make two overlapping publications from one input ref conflict
        in lakeFS's atomic 3-way merge, so the store itself rejects the second, while disjoint
        ones merge cleanly (perago.publish.scope, docs/protocol.md). Uploaded at once, before
        the branch lease: the staging branch is this attempt's alone."""
        claim = json.dumps(
            {**me.metadata(target.input_ref), "perago.kind": "publication-marker"}, sort_keys=True
        ).encode()
        markers = scope_markers(target.input_ref, me.scope or "", claim)
        with ThreadPoolExecutor(len(markers), thread_name_prefix="perago-marker") as pool:
            for done in [
                pool.submit(self._store.upload_bytes, target.repository, branch, path, data)
                for path, data in markers.items()
            ]:
                done.result()

    # -- Confirm -----------------------------------------------------------------------------

    def _confirm(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        staged: StagedReference,
        lease: GroupMember | None,
    ) -> str:
        """The publish fence and Confirm. A group member fences on the head the previous
        member's merge handed over, if there is one (the merge commit as lakeFS answered it,
        on the head that member's fence saw: as good as reading the head then)."""
        repo = target.repository
        known = lease.take_head() if lease is not None else None
        head, history = self._read_head(target, known)
        decision = decide_publication(head, target.input_ref, me, history)
        if decision is not HeadDecision.LANDED:  # landed: checked when it was published
            check_reads(self._store, target, head, history)
        log.info(
            "publish_fence_passed",
            decision=decision.value,
            head=head.id,
            **({"handed_over": True} if known is not None else {}),
        )
        steps.reached(Boundary.AFTER_PUBLISH_FENCE, me)
        if decision is HeadDecision.LANDED:
            return self._own_commit(head, history, me)
        if decision is HeadDecision.REPLACE:
            self._reset(me, target, head.id, staged.staging_commit, lease)
            now = self._store.branch_head(repo, target.branch)
            if now != staged.staging_commit:
                raise PublishFenceError(
                    f"replacement publication: after the reset the head of {target.branch} is "
                    f"{now}, not the staged commit {staged.staging_commit}: another writer "
                    "raced; inspect the branch history"
                )
            log.info("published", mode="replace", ref=now, replaced=head.id)
            return now
        if decision is HeadDecision.SCOPED_REPLACE:
            return self._scoped_replace(me, target, staged, lease, head, history)
        for attempt in range(1, MERGE_TRIES + 1):
            try:
                return self._merge(me, target, staged, lease, head)
            except ConflictError as e:
                moved = isinstance(e, HeadMovedError)
                error = PublishFenceError(
                    f"lakeFS rejected the merge into {target.branch} ({e.message}): another "
                    "publication from the same input ref landed first, or the head moved after "
                    "the fence (expected-head hook). Nothing of this attempt was published"
                )
                if not moved or attempt == MERGE_TRIES:
                    raise error from e
                # The hook refused because the head moved: a fan-out sibling may have landed.
                try:
                    head, history, decision = self._fence_again(me, target)
                except PublishFenceError as fence:
                    raise PublishFenceError(f"{error.message}; then: {fence.message}") from e
                if decision is not HeadDecision.BESIDE:
                    raise error from e
            except StoreError as e:
                # 429: lakeFS ran out of its own retries of the branch update (writers
                # contending for the branch). Still under the lease: wait, fence again, merge.
                if e.status != 429 or attempt == MERGE_TRIES:
                    raise
                log.warning("merge_throttled", attempt=attempt, error=e.message)
                time.sleep(merge_throttle_wait(attempt))
                head, history, decision = self._fence_again(me, target)
                if decision is HeadDecision.LANDED:
                    return self._own_commit(head, history, me)
                if decision not in (HeadDecision.FIRST, HeadDecision.BESIDE):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _fence_again(
        self, me: AttemptIdentity, target: WorkspaceTarget
    ) -> tuple[Commit, list[Commit], HeadDecision]:
        """After lakeFS refused a merge: the head now, the publish fence's decision on it
        and, unless it landed, the read-set check (the caller says which decisions merge)."""
        head, history = self._read_head(target)
        decision = decide_publication(head, target.input_ref, me, history)
        if decision is not HeadDecision.LANDED:
            check_reads(self._store, target, head, history)
            log.info("publish_fence_passed", decision=decision.value, head=head.id, again=True)
        return head, history, decision

    def _merge(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        staged: StagedReference,
        lease: GroupMember | None,
        head: Commit,
        **extra: str,
    ) -> str:
        """Confirm by merge (first or beside-siblings publication), guarded by the lease."""
        repo = target.repository
        message = f"perago: publish {me.task_type} ({me.reference_name}) of {me.workflow_id}"
        metadata = me.metadata(
            target.input_ref,
            kind="publication",
            staged_commit=staged.staging_commit,
            expected_head=head.id,
            **({} if lease is None else {"fencing_token": str(lease.token)}),
            **extra,
        )
        metadata.update(target.reads_metadata())

        took: list[float] = []

        def merge(timeout: float | None) -> str:
            asked = time.monotonic()
            merged = self._store.merge(
                repo,
                staged.staging_branch,
                target.branch,
                message=message,
                metadata=metadata,
                timeout=timeout,
            )
            took.append(time.monotonic() - asked)
            if lease is not None:
                if lease.shared:
                    self._hand_on(repo, lease, merged, head.id)
                lease.end_turn()  # the checks after the merge only read: siblings may go on
            return merged

        try:
            if lease is None:
                merged = merge(None)
            else:
                # Like a reset: started only while the lease surely lasts, re-checked after,
                # so a holder paused past its lease never merges (docs/model-check.md).
                lease.refresh()
                merged = lease.guarded(merge)
        except ConflictError:
            raise
        except (StoreError, CoordStoreError) as e:
            # No answer from lakeFS, or from the lease store re-checked after the merge.
            landed = self.find_own_publication(repo, target.branch, me)
            if landed is None:
                raise
            log.warning("merge_answer_lost_but_landed", ref=landed, error=str(e))
            merged = landed
        self._check_first_parent(repo, target.branch, merged, head.id, me)
        log.info("published", mode="merge", ref=merged, **_timings(took, lease))
        return merged

    def _scoped_replace(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        staged: StagedReference | None,
        lease: GroupMember | None,
        head: Commit,
        history: list[Commit],
    ) -> str:
        """A retry inside a fan-out: an earlier attempt of this step published, and disjoint
        siblings merged on top of it. Never a hard reset over them: on a private branch from
        the head, revert the earlier publication(s), merge this attempt's staged commit (the
        scope becomes this attempt's tree; ``staged`` is ``None`` for a no-op), and publish
        that as one merge on the head. The earlier publication stays in history (reachable),
        and exactly one publication of the step is in effect: the one naming it in
        ``perago.replaces``.
        """
        repo = target.repository
        undo = earlier_publications(history, target.input_ref, me)
        scoped = scoped_branch_name(staging_branch_name(me))
        self._store.delete_branch(repo, scoped)  # a leftover of an earlier try of ours
        self._store.create_branch(repo, scoped, head.id, hidden=True)
        try:
            try:
                for commit in undo:
                    self._store.revert(repo, scoped, commit.id, parent_number=1)
                if staged is not None:
                    self._store.merge(
                        repo,
                        staged.staging_branch,
                        scoped,
                        message=f"perago: scoped replacement by {me.task_id} (retry "
                        f"{me.retry_count})",
                        metadata={"perago.kind": "scoped-staged"},
                    )
            except ConflictError as e:
                raise PublishFenceError(
                    f"scoped replacement: reverting the earlier publication(s) "
                    f"{[c.id[:12] for c in undo]} of step {me.reference_name!r} under the "
                    f"head {head.id[:12]} conflicts ({e.message}); nothing was published. "
                    "Inspect the branch history"
                ) from e
            log.info("scoped_replacement_staged", replaces=[c.id for c in undo], branch=scoped)
            source = StagedReference(
                repo, scoped, staged.staging_commit if staged is not None else "none"
            )
            try:
                return self._merge(
                    me, target, source, lease, head, replaces=",".join(c.id for c in undo)
                )
            except ConflictError as e:
                raise PublishFenceError(
                    f"lakeFS rejected the scoped replacement into {target.branch} "
                    f"({e.message}): the head moved after the fence. Nothing of this attempt "
                    "was published"
                ) from e
        finally:
            self.cancel(repo, scoped)

    def _read_head(
        self, target: WorkspaceTarget, known: Commit | None = None
    ) -> tuple[Commit, list[Commit]]:
        """The target head (``known``: the one a group sibling's merge made, read back) and,
        when it moved past the input ref, its first-parent chain."""
        repo = target.repository
        # A branch name reads its head.
        head = known if known is not None else self._store.get_commit(repo, target.branch)
        if head.id == target.input_ref or head.parents[:1] == (target.input_ref,):
            return head, [head]
        # The whole chain down to the input ref, however many siblings published since: each
        # commit is read from lakeFS once per process (FirstParents) and parsed once.
        return head, self._first_parents.chain(repo, head, stop_at=target.input_ref)

    def _hand_on(self, repo: str, lease: GroupMember, merged: str, seen_head: str) -> None:
        """In its turn, a member with siblings waiting hands the head its merge made to the
        next member's fence (``GroupMember.leave_head``), as lakeFS answered it: the merge
        commit read back, and only when its first parent is the head this member's fence
        saw. Then nothing landed between that head and this merge, whether or not a hook
        ran, and the next fence decides on the head as it was right after the merge. A
        merge that landed on anything else hands nothing on: the next member reads the head
        (and this member's post-publish check fails it). A failed read hands nothing on."""
        try:
            commit = self._store.get_commit(repo, merged)
        except StoreError as e:
            log.warning("handoff_read_failed", ref=merged, error=e.message)
            return
        self._first_parents.remember(repo, commit)  # the post-publish check reads it here
        if commit.parents[:1] == (seen_head,):
            lease.leave_head(commit)
        else:
            log.warning(
                "handoff_refused", ref=merged, first_parent=commit.parents[:1], head=seen_head
            )

    @staticmethod
    def _own_commit(head: Commit, history: list[Commit], me: AttemptIdentity) -> str:
        for commit in [head, *history]:
            owner = AttemptIdentity.from_commit(commit)
            if owner is not None and owner.same_attempt(me):
                return commit.id
        raise PublishFenceError(  # decide_publication said LANDED: cannot happen
            f"publish fence: this attempt's publication vanished from {head.id[:12]}'s history"
        )

    def _check_first_parent(
        self, repo: str, branch: str, merged: str, seen_head: str, me: AttemptIdentity
    ) -> None:
        """Post-publish check: the merge must sit on the head the fence saw, or on disjoint
        Perago publications that landed on it since (a racing fan-out sibling)."""
        # Read back (or as ``_hand_on`` read it): the next fence's first parent
        commit = self._first_parents.commit(repo, merged)
        parents = commit.parents[:1]
        if parents == (seen_head,):
            return
        problem = "it is not a descendant"
        if parents:
            under = self._store.get_commit(repo, parents[0])
            history = self._first_parents.chain(repo, under, stop_at=seen_head)
            try:
                if decide_publication(under, seen_head, me, history) is HeadDecision.BESIDE:
                    return
            except PublishFenceError as e:
                problem = e.message
        raise PublishFenceError(
            f"post-publish check: merge commit {merged} has first parent {parents}, but "
            f"the fence saw head {seen_head}: a foreign writer moved {branch} between "
            "fence and merge. The publication landed on top of it; inspect the branch "
            f"history before retrying ({problem})"
        )

    def _confirm_noop(self, me: AttemptIdentity, target: WorkspaceTarget) -> Publication:
        """An empty diff: complete on the input ref, or move an abandoned publication off it.

        An earlier attempt of the step that passed its fence #2 holds the branch lease until
        its merge is done, and may still merge after this attempt read the head (found by the
        model check, docs/model-check.md). So the decision is taken under the lease (a dead
        holder's is taken over), after the attempt fence, and the lease stays held for the
        report like any publication's.
        """
        if self._leases is None:
            return Publication(self._noop_decision(me, target, None))
        with self._branch_lease(me, target) as lease:
            self._fence(me, 2, lease)
            with _turn(lease):
                return Publication(self._noop_decision(me, target, lease), lease)

    def _noop_decision(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        lease: GroupMember | None,
    ) -> str:
        head, history = self._read_head(target)
        decision = decide_publication(head, target.input_ref, me, history)
        if decision is not HeadDecision.LANDED:
            # a no-op completes saying the output is what its inputs give: the same check
            check_reads(self._store, target, head, history)
        if decision in (HeadDecision.FIRST, HeadDecision.BESIDE):
            # BESIDE: only disjoint siblings published since the input ref; nothing to move
            log.info("noop_completed", ref=target.input_ref, head=head.id)
            return target.input_ref
        if decision is HeadDecision.SCOPED_REPLACE:
            return self._scoped_replace(me, target, None, lease, head, history)
        if decision is HeadDecision.LANDED:
            raise PublishFenceError(
                f"no-op attempt found its own publication {head.id} on {target.branch}; "
                "this cannot happen for an empty diff: inspect the branch"
            )
        self._reset(me, target, head.id, target.input_ref, lease)
        log.info("noop_relocated", ref=target.input_ref, replaced=head.id)
        return target.input_ref

    @contextlib.contextmanager
    def _branch_lease(
        self, me: AttemptIdentity, target: WorkspaceTarget, early: _BackgroundAcquire | None = None
    ) -> Iterator[GroupMember | None]:
        """Hold the target branch's lease (if configured) from the staged commit to Confirm;
        released on failure, kept on success (the caller's :class:`Publication` holds it).

        Its fencing token goes into the staged commit (what a replacement installs) and the
        merge commit. A publisher killed while holding it delays the next one by the takeover
        time (ttl x clock-skew rate); the lease is never broken early.
        """
        if self._leases is None:
            yield None
            return
        if me.poll_count > 1:
            # An earlier delivery of this task id may still send its COMPLETED: wait until
            # none can (docs/protocol.md, report windows), before the lease, off the branch.
            assert self._groups is not None and early is None
            log.info("report_windows_waiting", poll_count=me.poll_count)
            waited, ended_by = self._groups.wait_out_report_windows(target.repository, me)
            log.info("report_windows_waited_out", seconds=round(waited, 1), ended_by=ended_by)
        lease = early.take() if early is not None else self._take_lease(me, target)
        try:
            steps.reached(Boundary.AFTER_LEASE, me)
            yield lease
        except BaseException:
            release_lease(lease)
            raise
        log.info("branch_lease_kept_for_report", fencing_token=lease.token)

    def _take_lease(self, me: AttemptIdentity, target: WorkspaceTarget) -> GroupMember:
        """The branch lease: a share of this process's grant if a group of disjoint
        publications holds it (group commit, ``perago.publish.group_commit``), else a grant."""
        assert self._groups is not None
        lease = self._groups.acquire(
            target.repository, target.branch, f"{me.task_id}-p{me.poll_count}", me
        )
        if not lease.joined:
            log.info("branch_lease_acquired", fencing_token=lease.token, branch=target.branch)
        return lease

    def _reset(
        self,
        me: AttemptIdentity,
        target: WorkspaceTarget,
        seen_head: str,
        to: str,
        lease: GroupMember | None,
    ) -> None:
        """Hard-reset the target (no CAS in lakeFS): under the branch lease when configured.

        The lease serializes Perago's resetters of one branch; the head is re-read under it
        (while the replaced head is tagged: a tag too many is harmless, a wait is not), the
        reset runs only while the lease surely lasts and the lease is re-checked after it,
        so a paused holder that lost it stops with LeaseLostError instead of resetting.
        """
        repo = target.repository
        if lease is None:
            self._keep_reachable(repo, seen_head, me)
            self._store.hard_reset(repo, target.branch, to)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="perago-head") as pool:
            head_now = pool.submit(self._store.branch_head, repo, target.branch)
            self._keep_reachable(repo, seen_head, me)
            moved = head_now.result() != seen_head
        if moved:
            raise PublishFenceError(
                f"the head of {target.branch} moved while this attempt held the branch lease "
                f"(saw {seen_head[:12]}): a writer outside Perago; nothing was reset"
            )
        lease.refresh()
        steps.reached(Boundary.BEFORE_RESET, me)
        lease.guarded(
            lambda budget: self._store.hard_reset(repo, target.branch, to, timeout=budget)
        )
        log.info("reset_under_lease", fencing_token=lease.token, ref=to)

    def _keep_reachable(self, repo: str, commit_id: str, me: AttemptIdentity) -> None:
        """Tag a head before a hard reset replaces it, so no commit becomes unreachable."""
        tag = replaced_tag(commit_id, me.retry_count)
        try:
            self._store.create_tag(repo, tag, commit_id)
        except ConflictError:
            pass  # created by an earlier try of the same replacement
        log.info("replaced_head_tagged", tag=tag, ref=commit_id)

    def find_own_publication(self, repo: str, branch: str, me: AttemptIdentity) -> str | None:
        """'Did it land?': look for a commit of this attempt in the branch's recent history."""
        for commit in self._store.log(repo, branch, amount=20):
            owner = AttemptIdentity.from_commit(commit)
            if owner is not None and owner.same_attempt(me):
                return commit.id
        return None

    # -- Cancel ------------------------------------------------------------------------------

    def cancel(self, repository: str, staging_branch: str) -> None:
        """Delete the staging branch; a failure is logged and never changes the result."""
        try:
            self._store.delete_branch(repository, staging_branch)
            log.info("staging_branch_deleted", staging_branch=staging_branch)
        except Exception as e:  # noqa: BLE001 - cleanup must never mask the attempt's result
            log.warning("staging_cleanup_failed", staging_branch=staging_branch, error=str(e))
