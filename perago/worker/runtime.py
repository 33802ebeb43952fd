"""One attempt, start to finish: guardrails, materialize, body, diff, publish, outcome.

The worker polls and reports; this module decides what an attempt's outcome is, following
the failure matrix of docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog
from pydantic import BaseModel, ValidationError

from perago._api.context import AttemptControl, attempt_context
from perago._api.inputs import Inputs, ResolvedInput
from perago._api.task import RemoteWorkspace, TaskDefinition, is_terminal
from perago._api.task_io import MAX_PARAMS_BYTES, WorkspaceInput, check_param_keys
from perago.config import Settings
from perago.coord.branch_leases import BranchLeases
from perago.core.lakefs_names import METADATA_PREFIX, wap_branch_name, wap_kept_tag
from perago.core.orchestrator import AttemptLedger, Outcome, Status, StepOutputs, TaskSnapshot
from perago.core.parallel import run_parallel
from perago.core.retry_policy import body_retry_wait
from perago.core.step_lineage import ParentSteps, step_lineage
from perago.core.store import Commit, VersionStore
from perago.errors import (
    AttemptFenceError,
    BodyTriesExhausted,
    CodeError,
    ConflictError,
    GuardrailError,
    LeaseEndedError,
    NotFoundError,
    PeragoError,
    PolicyError,
    PublishFenceError,
    ResultValidationError,
    TaskError,
    WorkerShutdown,
)
from perago.publish import AttemptIdentity, Publication, Publisher, WorkspaceTarget
from perago.publish.deliveries import LocalDeliveries
from perago.publish.fences import check_attempt
from perago.publish.group_commit import GroupMember
from perago.publish.joins import check_contains, unpinned_input_ref
from perago.publish.transaction import release_lease
from perago.telemetry import metrics, steps, tracing
from perago.telemetry.failure_text import UserTraceback, describe, user_traceback
from perago.telemetry.steps import Boundary, Phase
from perago.worker import lineage_events
from perago.worker.async_bodies import AsyncBody, drive
from perago.worker.attempt import RunningAttempt
from perago.worker.inputs import (
    OneDownloadAtATime,
    input_overrides,
    local_inputs,
    remote_inputs,
    resolve_inputs,
)
from perago.worker.reuse import find_reusable, record
from perago.worker.spark import spark_tag
from perago.workspace import (
    AttemptDirectory,
    ContentCache,
    Manifest,
    compute_diff,
    local_path_for,
    materialize,
    without_renamed_folders,
)

__all__ = [
    "SHUTDOWN",
    "AttemptRunner",
    "Finished",
    "Outcome",
    "WorkspaceInput",
    "check_result",
    "outcome_of",
]

T = TypeVar("T")

#: A full lakeFS commit id (64 hex digits): immutable (cached), and checked by the access
#: policy through the branch it is read with.
_COMMIT_ID = re.compile(r"^[0-9a-f]{64}$")
#: How long a process trusts that a target branch it read exists: a pinned fan-out's
#: siblings skip that read (a branch deleted meanwhile fails the publication instead).
BRANCH_SEEN_SECONDS = 30.0

#: Inputs a write-audit-publish publication records at most (commit metadata stays small).
WAP_INPUTS_LIMIT = 200
#: How far back the branch's history is read for them.
WAP_HISTORY_LIMIT = 500

#: What an attempt interrupted by the worker's drain reports (Conductor retries it).
SHUTDOWN = Outcome("FAILED", reason="worker shutdown: the attempt was interrupted")

#: Events carry the attempt's context from structlog's contextvars (RunningAttempt.logging).
log = structlog.get_logger("perago.worker.attempt")

#: An attempt as a generator: it yields once per ``async def`` body, the body's coroutine,
#: for its driver to await (perago.worker.async_bodies), and returns what it returns.
Steps = Generator[AsyncBody, Any, "Finished"]


@dataclass(frozen=True)
class Finished:
    """How an attempt ended: its outcome and, after a publication, the branch lease that
    guarded it, still held: the worker leaves it as it reports COMPLETED, which opens the
    report window (docs/protocol.md). The orchestrator only ever sees the outcome."""

    outcome: Outcome
    lease: GroupMember | None = None

    def release(self) -> None:
        """Give the lease back now (a caller that reports nothing)."""
        if self.lease is not None:
            release_lease(self.lease, wait=True)


def _validation_summary(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def outcome_of(
    e: BaseException, *, where: str, advice: str = "", trace: UserTraceback | None = None
) -> Outcome:
    """The outcome an attempt that raised ``e`` at step ``where`` reports: the one place an
    exception becomes FAILED or FAILED_WITH_TERMINAL_ERROR (docs/protocol.md, failure matrix).
    ``trace`` (the task author's frames) adds the failing line to the reason and the whole
    trimmed traceback to the outcome's details."""
    if isinstance(e, WorkerShutdown):
        # a body that stopped on cancellation says why; the drain's interruption does not
        return Outcome("FAILED", reason=f"{where}: {e.message}") if e.message else SHUTDOWN
    if isinstance(e, LeaseEndedError):
        reason = f"{where}: lease lost: {e}; the attempt was cancelled"
        return Outcome("FAILED", reason=reason)
    status: Status = "FAILED"
    if isinstance(e, PeragoError):
        status = "FAILED_WITH_TERMINAL_ERROR" if e.non_retryable else "FAILED"
        what = e.message
    else:
        what = describe(e)
    at = f" (at {trace.location})" if trace is not None and trace.location else ""
    reason = f"{where}: {what}{at}" + (f"; {advice}" if advice else "")
    return Outcome(status, reason=reason, details=trace.text if trace is not None else "")


def _authors_traceback(e: BaseException) -> UserTraceback | None:
    """``e``'s traceback if it passed through the task author's code, else None."""
    trace = user_traceback(e)
    return trace if trace.location else None


def hopeless(
    e: Exception,
    *,
    pinned: bool,
    in_body: bool = False,
    terminal: Sequence[type[BaseException] | str] = (),
) -> Exception:
    """``e``, or a terminal error in its place where no retry can succeed: a module the task
    needs is not installed, the body raised one of the task's ``terminal`` errors (a code
    error, by default: ``perago.CODE_ERRORS``), or a publish fence refused a workflow that
    pinned its input ref (every retry would start from that ref again)."""
    if isinstance(e, ImportError):  # ModuleNotFoundError too
        missing = f"module {e.name!r}" if e.name else "a module"
        return TaskError(
            f"the task needs {missing}, which the worker cannot import ({type(e).__name__}: "
            f"{e}); install it into the worker's environment (pyspark.ml needs numpy: "
            "perago-runtime[ml]) and re-run the workflow. Not retried: a retry on this worker "
            "would fail the same way",
            non_retryable=True,
        )
    if in_body and is_terminal(e, terminal):
        return CodeError(describe(e))
    if isinstance(e, PublishFenceError) and pinned and not e.non_retryable:
        return PublishFenceError(
            f"{e.message}. Not retried: the workflow pinned its input ref (workspace.ref), so "
            "every retry would start from it again; re-run the workflow from the new head, or "
            'omit "ref" to start each attempt from the branch head',
            non_retryable=True,
        )
    return e


class AttemptRunner:
    """Runs attempts of registered tasks against one store and one ledger."""

    def __init__(
        self,
        store: VersionStore,
        ledger: AttemptLedger,
        settings: Settings,
        *,
        spark: Callable[[], Any] | None = None,
        leases: BranchLeases | None = None,
        deliveries: LocalDeliveries | None = None,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._settings = settings
        self._spark = spark
        # One cache per worker process, shared by all its attempts (perago.workspace.cache).
        self.cache = (
            ContentCache(settings.cache_dir, max_bytes=settings.cache_bytes)
            if settings.cache_bytes > 0
            else None
        )
        self._input_downloads = OneDownloadAtATime()
        #: (repository, branch) -> when this process last read that target branch.
        self._branches_seen: dict[tuple[str, str], float] = {}
        self._policy = settings.access_policy()
        self._deliveries = deliveries
        self._publisher = Publisher(
            store,
            ledger,
            worker_id=settings.worker_id,
            parallelism=settings.transfer_parallelism,
            leases=leases,
            cache=self.cache,
            deliveries=deliveries,
        )

    def run(
        self,
        defn: TaskDefinition[Any, Any],
        task: TaskSnapshot,
        *,
        after_report: contextlib.ExitStack | None = None,
        control: AttemptControl | None = None,
    ) -> Finished:
        """How the attempt ended. With ``after_report``, removing the attempt directory is
        left on it, for the worker to close once the outcome is reported: deleting thousands
        of files is not part of the task's duration (a crash in between leaves the attempt
        record, whose recovery removes the directory). Without it, removed before returning,
        and the publication's lease is released (no report follows).
        """
        if after_report is None:
            with contextlib.ExitStack() as cleanup:
                finished = self.run(defn, task, after_report=cleanup, control=control)
                finished.release()
                return Finished(finished.outcome)
        return drive(self.steps(defn, task, after_report=after_report, control=control))

    def steps(
        self,
        defn: TaskDefinition[Any, Any],
        task: TaskSnapshot,
        *,
        after_report: contextlib.ExitStack,
        control: AttemptControl | None = None,
    ) -> Steps:
        """:meth:`run` as steps: the worker drives an async body's attempt on its event
        loop, so the body holds no thread while it awaits (materialising and publishing run
        on the loop's thread pool)."""
        attempt = RunningAttempt.start(
            defn,
            task,
            cluster_id=self._settings.cluster_id,
            after_report=after_report,
            control=control,
        )
        started = time.monotonic()
        attempt.enter(Phase.START)
        with attempt.logging():
            try:
                target, params = self._pre_guardrails(defn, task.input, attempt.identity)
                # the scope is recorded in every commit of this attempt (perago.publish.scope)
                attempt.resolved(target, params, defn.workspace.render(params))
                if self._deliveries is not None:  # where its end is recorded if superseded
                    self._deliveries.publishes_to(task.task_id, task.poll_count, target.repository)
                tracing.annotate(
                    scope=attempt.scope,
                    repository=target.repository,
                    branch=target.branch,
                    input_ref=target.input_ref,
                )
                me = attempt.identity
                if not defn.workspace.read_only and isinstance(self._ledger, ParentSteps):
                    # a step of a retried sub-workflow is the same logical step
                    # (perago.core.step_lineage)
                    key, retries = step_lineage(self._ledger, me.workflow_id, me.reference_name)
                    attempt.identity = replace(me, step_key=key, lineage_retries=retries)
            except GuardrailError as e:
                log.warning("pre_guardrails_failed", reason=e.message)
                if isinstance(e, PolicyError):  # every policy check is a pre-guardrail
                    metrics.POLICY_REFUSALS.labels(e.refused).inc()
                return _ended(attempt, Finished(outcome_of(e, where="pre-guardrail")))
            except PeragoError as e:
                log.warning("pre_guardrails_unavailable", reason=e.message)
                where = "pre-guardrail (store or Conductor unavailable)"
                return _ended(attempt, Finished(outcome_of(e, where=where)))
            with attempt.logging():
                log.info("pre_guardrails_passed", read_only=defn.workspace.read_only)
                lineage_events.started(attempt)
                finished = yield from self._run_checked(attempt)
                outcome = finished.outcome
                log.info(
                    "attempt_finished",
                    status=outcome.status,
                    reason=outcome.reason or None,
                    ref=outcome.output.get("workspace", {}).get("ref"),
                    seconds=round(time.monotonic() - started, 3),
                )
                return _ended(attempt, finished)

    def _pre_guardrails(
        self, defn: TaskDefinition[Any, Any], raw: dict[str, Any], me: AttemptIdentity
    ) -> tuple[WorkspaceTarget, BaseModel]:
        if "workspace" not in raw:
            raise GuardrailError(
                'task input has no "workspace": pass {"workspace": {"repository", "branch", '
                '"ref"}, "params": {...}} (chain steps with "${prev.output.workspace}")'
            )
        try:
            ws = WorkspaceInput.model_validate(raw["workspace"])
        except ValidationError as e:
            raise GuardrailError(f"invalid workspace input: {_validation_summary(e)}") from e
        raw_params = raw.get("params") or {}
        size = len(json.dumps(raw_params, default=str))
        if size > MAX_PARAMS_BYTES:
            raise GuardrailError(
                f"the params of {defn.name} are {size:,} bytes of JSON, more than "
                f"{MAX_PARAMS_BYTES:,}: pass large data through lakeFS (an input or the "
                "workspace), not through Conductor"
            )
        if self._settings.params_extra == "forbid":
            check_param_keys(defn, raw_params)
        try:
            params = defn.params_type.model_validate(raw_params)
        except ValidationError as e:
            raise GuardrailError(
                f"invalid params for {defn.name}: {_validation_summary(e)}; fix the workflow's "
                "task input"
            ) from e
        if raw.get("recompute") not in (None, True, False):
            raise GuardrailError(
                f'"recompute" must be true or false (or absent), got {raw["recompute"]!r}; '
                'pass "${workflow.input.recompute}" or a constant'
            )
        overrides = input_overrides(defn, raw.get("inputs"))
        self._check_policy(defn, ws, params)
        if ws.after is not None and ws.ref is not None:
            raise GuardrailError(
                'workspace input has both "ref" and "after": a join starts from the branch '
                'head and checks it contains the "after" refs; drop "ref"'
            )
        if ws.ref is None:
            head = self._target_head(ws.repository, ws.branch)
            input_ref = unpinned_input_ref(self._store, ws.repository, head, me)
            if ws.after:
                check_contains(self._store, ws.repository, ws.branch, input_ref, ws.after)
            inputs_at = head
        else:
            if not self._branch_seen_lately(ws.repository, ws.branch):
                self._target_head(ws.repository, ws.branch)
            try:
                input_ref = self._commit(ws.repository, ws.ref).id
            except NotFoundError as e:
                raise GuardrailError(
                    f"ref {ws.ref!r} does not exist in {ws.repository!r}; pass a commit id "
                    "(or omit ref to start from the branch head)"
                ) from e
            inputs_at = input_ref
        target = WorkspaceTarget(ws.repository, ws.branch, input_ref)
        # Pinned: inputs at the pinned commit, so a retry reads what its attempt read.
        # Unpinned: at the head this attempt starts from, even when a retry's workspace starts
        # from its earlier attempt's input ref (to replace that publication): each attempt
        # reads its inputs afresh (else a serializable retry would be refused forever, F7).
        reads = resolve_inputs(
            self._store,
            defn,
            overrides,
            target,
            params,
            default_commit=inputs_at,
            policy=self._policy,
        )
        serializable = defn.workspace.isolation == "serializable"
        return replace(target, reads=reads, serializable=serializable), params

    def _target_head(self, repository: str, branch: str) -> str:
        """The target branch's head; a GuardrailError saying which is missing, if one is."""
        try:
            head = self._store.branch_head(repository, branch)
        except NotFoundError as e:  # which is missing: asked only then (a request less)
            if not self._store.repository_exists(repository):
                raise GuardrailError(
                    f"lakeFS repository {repository!r} does not exist; create it or fix "
                    "the workflow input"
                ) from e
            raise GuardrailError(
                f"branch {branch!r} does not exist in {repository!r}; create it or fix the "
                "workflow input"
            ) from e
        self._branches_seen[(repository, branch)] = time.monotonic()
        return head

    def _branch_seen_lately(self, repository: str, branch: str) -> bool:
        """Whether this process read the branch within ``BRANCH_SEEN_SECONDS``: a pinned
        attempt needs only to know it exists, and its fan-out siblings ask the same."""
        seen = self._branches_seen.get((repository, branch))
        return seen is not None and time.monotonic() - seen < BRANCH_SEEN_SECONDS

    def _commit(self, repository: str, ref: str) -> Commit:
        """A pinned input ref's commit: a commit id through the publisher's per-process cache
        (commits never change), a branch or tag name from lakeFS each time."""
        if _COMMIT_ID.fullmatch(ref):
            return self._publisher.first_parents.commit(repository, ref)
        return self._store.get_commit(repository, ref)

    def _check_policy(
        self, defn: TaskDefinition[Any, Any], ws: WorkspaceInput, params: Any
    ) -> None:
        """The worker's access policy (perago.core.policy), before anything is read."""
        from perago import wap

        spec, repo = defn.workspace, ws.repository
        what = f"the workspace of {defn.name}"
        self._policy.check_source(repo, ws.branch, what=what, narrowed=spec.allowed_sources)
        if ws.ref is not None and not _COMMIT_ID.match(ws.ref):
            self._policy.check_source(repo, ws.ref, what=what, narrowed=spec.allowed_sources)
        if defn.system == wap.BEGIN:  # where the workflow will publish, through its audit
            self._policy.check_target(repo, ws.branch, task=defn.name, audited=True)
        elif defn.system == wap.PUBLISH:
            self._policy.check_target(repo, params.target_branch, task=defn.name, audited=True)
        elif not spec.read_only:
            self._policy.check_target(
                repo, ws.branch, task=defn.name, narrowed=spec.allowed_targets
            )

    def _run_checked(self, attempt: RunningAttempt) -> Steps:
        try:
            if attempt.defn.system:
                return self._run_system(attempt)
            if attempt.defn.options.incremental:
                reused = self._reused(attempt)
                if reused is not None:
                    return reused
            if attempt.defn.workspace.in_place:
                return (yield from self._run_in_place(attempt))
            return (yield from self._run_local(attempt))
        except WorkerShutdown as e:
            log.warning("attempt_interrupted", step=attempt.step)
            attempt.aborted = True
            return Finished(outcome_of(e, where=attempt.step))
        except LeaseEndedError as e:
            log.warning("lease_lost", step=attempt.step, reason=str(e))
            return Finished(outcome_of(e, where=attempt.step))
        except TaskError as e:
            trace = _authors_traceback(e)
            log.warning(
                "task_error",
                step=attempt.step,
                reason=e.message,
                non_retryable=e.non_retryable,
                traceback=trace.text if trace else None,
            )
            if attempt.tries_ran_out:
                return Finished(_out_of_tries(attempt, e, trace))
            return Finished(outcome_of(e, where=attempt.step, trace=trace))
        except Exception as caught:  # noqa: BLE001 - any failure of user code or I/O fails it
            failure = hopeless(
                caught,
                pinned=attempt.pinned,
                in_body=attempt.step is Phase.BODY,
                terminal=attempt.defn.options.terminal_errors,
            )
            if isinstance(failure, AttemptFenceError):
                metrics.FENCE_REJECTIONS.labels("attempt").inc()
            elif isinstance(failure, PublishFenceError):
                metrics.FENCE_REJECTIONS.labels("publish").inc()
            trace = _authors_traceback(caught)
            log.warning(
                "attempt_failed",
                step=attempt.step,
                error=describe(caught),
                terminal=failure is not caught,
                traceback=trace.text if trace else None,
            )
            if attempt.tries_ran_out:
                return Finished(_out_of_tries(attempt, caught, trace))
            advice = CodeError.ADVICE if isinstance(failure, CodeError) else ""
            return Finished(outcome_of(failure, where=attempt.step, advice=advice, trace=trace))

    def _reused(self, attempt: RunningAttempt) -> Finished | None:
        """An incremental attempt's answer from its step's earlier publication, when that
        publication read what this attempt would (``perago.worker.reuse``); None: run."""
        attempt.enter(Phase.REUSE_CHECK)
        target, defn = attempt.resolved_target(), attempt.defn
        if attempt.recompute:
            log.info("reuse_skipped", reason="the workflow asked to recompute")
            return None
        history = self._publisher.first_parents
        params = attempt.resolved_params()
        verdict = find_reusable(self._store, history, defn, target, attempt.scope, params)
        if verdict.reuse is None:
            log.info("reuse_refused", reason=verdict.reason, candidate=verdict.candidate or None)
            return None
        reuse = verdict.reuse
        log.info("step_reused", reused=reuse.commit.id, reason=verdict.reason)
        metrics.STEPS_REUSED.labels(defn.name).inc()
        tracing.annotate(reused=reuse.commit.id)
        finished = self._completed(target, Publication(target.input_ref), reuse.result)
        finished.outcome.output["reused"] = reuse.as_output()
        return finished

    def _recorded(self, attempt: RunningAttempt, result: BaseModel) -> WorkspaceTarget:
        """The target, carrying what an incremental task's publication records."""
        target = attempt.resolved_target()
        if not attempt.defn.options.incremental:
            return target
        kept = record(attempt.defn, attempt.resolved_params(), result)
        return replace(target, recorded=tuple(sorted(kept.items())))

    def _run_system(self, attempt: RunningAttempt) -> Finished:
        """The write-audit-publish tasks (``perago.wap``): branch work, no body."""
        from perago import wap

        me, source = attempt.identity, attempt.resolved_target()
        repo = source.repository
        check_attempt(self._ledger, me, worker_id=self._settings.worker_id)
        if attempt.defn.system == wap.BEGIN:
            attempt.enter(Phase.STAGE)
            branch = wap_branch_name(me.workflow_id, self._settings.cluster_id)
            with contextlib.suppress(NotFoundError):  # an earlier try of this begin made it
                self._store.delete_branch(repo, branch)
            self._store.create_branch(repo, branch, source.input_ref)
            log.info("wap_branch_created", wap_branch=branch, base=source.input_ref)
            result = wap.BeginResult(
                target_branch=source.branch, base=source.input_ref, wap_branch=branch
            )
            return self._completed(
                WorkspaceTarget(repo, branch, source.input_ref),
                Publication(source.input_ref),
                result,
            )
        params = attempt.params
        assert isinstance(params, wap.PublishParams)
        attempt.enter(Phase.PUBLISH)
        try:
            self._store.get_commit(repo, params.base)
        except NotFoundError as e:
            raise GuardrailError(
                f"write-audit-publish: base {params.base!r} does not exist in {repo!r}; pass "
                '"${<begin step>.output.result.base}"'
            ) from e
        # The publication records what every step it publishes read (``<step>.<input>``),
        # and keeps the isolated branch's history, where those commits are, under a tag.
        kept = self._keep_history(repo, source.input_ref)
        target = WorkspaceTarget(
            repo,
            params.target_branch,
            params.base,
            reads=self._inputs_read_on(source, params, me.workflow_id),
            recorded=(
                (f"{METADATA_PREFIX}wap_base", params.base),
                (f"{METADATA_PREFIX}wap_tag", kept),
            ),
        )
        wap_target = replace(me, scope="")  # the whole branch: exclusive, like a serial step
        try:
            publication = self._publisher.publish_branch(wap_target, target, source.input_ref)
        except PublishFenceError as e:
            raise PublishFenceError(
                f"write-audit-publish: {e.message}. The target {params.target_branch!r} moved "
                f"since the workflow began at {params.base[:12]}; nothing was published and the "
                f"isolated branch {source.branch!r} is kept: re-run the workflow",
                non_retryable=True,
            ) from e
        keep = self._settings.wap_keep_branch
        ref = publication.ref
        try:
            if not keep:
                with contextlib.suppress(NotFoundError):
                    self._store.delete_branch(repo, source.branch)
            log.info("wap_published", ref=ref, wap_branch=source.branch, kept=keep)
            changes = (
                len(self._store.diff_refs(repo, params.base, ref)) if ref != params.base else 0
            )
        except BaseException:
            publication.release()  # no report will be made under it
            raise
        done = wap.PublishResult(
            published=ref != params.base, changes=changes, wap_branch_kept=keep
        )
        return self._completed(target, publication, done)

    def _keep_history(self, repository: str, commit: str) -> str:
        """Tag ``commit`` (a write-audit-publish branch's head) so that its history outlives
        the branch; the same tag again on a retry."""
        tag = wap_kept_tag(commit)
        try:
            self._store.create_tag(repository, tag, commit)
        except ConflictError:
            if self._store.get_tag(repository, tag) != commit:
                raise
        log.info("wap_history_kept", tag=tag, commit=commit)
        return tag

    def _inputs_read_on(
        self, source: WorkspaceTarget, params: Any, workflow_id: str
    ) -> tuple[ResolvedInput, ...]:
        """The named inputs the Perago publications on a write-audit-publish branch read,
        since its base (newest first), then those its read-only steps read (an audit), from
        their outputs in the orchestrator: at most ``WAP_INPUTS_LIMIT`` in all."""
        found = self._published_reads(source, params)
        if isinstance(self._ledger, StepOutputs):
            seen = {read.name for read in found}
            for ref, output in self._ledger.completed_outputs(workflow_id):
                for name, read in (output.get("inputs") or {}).items():
                    key = f"{ref}.{name}"
                    if key in seen or not isinstance(read, dict):
                        continue
                    seen.add(key)
                    location = f"{read.get('repository')}@{read.get('commit')}/{read.get('prefix')}"
                    found.append(ResolvedInput.parse(key, location))
        return tuple(found[:WAP_INPUTS_LIMIT])

    def _published_reads(self, source: WorkspaceTarget, params: Any) -> list[ResolvedInput]:
        found: list[ResolvedInput] = []
        history = self._store.log(source.repository, source.input_ref, amount=WAP_HISTORY_LIMIT)
        for commit in history:
            if commit.id == params.base or len(found) >= WAP_INPUTS_LIMIT:
                break
            step = commit.metadata.get("perago.task_ref")
            if step is None or commit.metadata.get("perago.kind") != "publication":
                continue
            key = commit.metadata.get("perago.step")  # a step of a sub-workflow
            if key:
                step = key.partition("/")[2] or step  # its task refs below the root workflow
            for name, location in ResolvedInput.from_metadata(commit.metadata).items():
                found.append(ResolvedInput.parse(f"{step}.{name}", location))
        return found

    def _refuse_projection_on_a_cluster(self, attempt: RunningAttempt) -> None:
        """A local-projection Spark task hands executors paths on this worker's disk: only
        right when they run here (local master) or share the disk (declared)."""
        target = getattr(self._spark, "target", None)
        if (
            not attempt.defn.wants_spark
            or target is None
            or target.local
            or self._settings.spark_shared_filesystem
        ):
            return
        raise TaskError(
            f"task {attempt.defn.name} reads and writes a local workspace, but Spark runs on "
            f"{target.url} (from {target.source}), whose executors cannot see this worker's "
            "disk. Declare the task WorkspaceSpec(..., in_place=True) (it then reads s3a:// "
            "through lakeFS), or set PERAGO_SPARK_SHARED_FILESYSTEM=true if every executor "
            "mounts PERAGO_WORK_DIR at the same path",
            non_retryable=True,
        )

    def _run_local(self, attempt: RunningAttempt) -> Steps:
        """Local projection: download the prefix, run, diff, stage, publish."""
        self._refuse_projection_on_a_cluster(attempt)
        attempt.enter(Phase.MATERIALIZE)
        me, target, prefix = attempt.identity, attempt.resolved_target(), attempt.prefix
        attempt_dir = AttemptDirectory(self._settings.work_dir, me.task_id)
        attempt.after_report.callback(attempt_dir.remove)
        if self.cache is not None:  # runs first: unchanged files go to the cache, not away
            attempt.after_report.callback(self.cache.adopt, attempt_dir.workspace)
        inputs = (
            local_inputs(
                self._store,
                target.reads,
                attempt_dir.root / "inputs",
                parallelism=self._settings.transfer_parallelism,
                cache=self.cache,
                one_at_a_time=self._input_downloads,
            )
            if target.reads
            else None
        )

        def one_try() -> Generator[AsyncBody, Any, tuple[Manifest, BaseModel]]:
            if attempt.body_try:  # a fresh workspace at the same input ref
                attempt.enter(Phase.MATERIALIZE)
                if self.cache is not None:
                    self.cache.adopt(attempt_dir.workspace)
                attempt_dir.empty_workspace()
            manifest = materialize(
                self._store,
                target.repository,
                target.input_ref,
                prefix,
                attempt_dir.workspace,
                parallelism=self._settings.transfer_parallelism,
                cache=self.cache,
            )
            manifest.save(attempt_dir.manifest_path)
            log.info("materialized", files=len(manifest.entries), bytes=manifest.total_bytes)
            metrics.FILES.labels("download").inc(len(manifest.entries))
            metrics.BYTES.labels("download").inc(manifest.total_bytes)
            steps.reached(Boundary.AFTER_MATERIALIZE, attempt.identity)
            checked = yield from self._body_and_checks(
                attempt, attempt_dir.workspace, inputs.view if inputs else None
            )
            return manifest, checked

        manifest, checked = yield from self._body_tries(
            attempt, one_try, before_retry=inputs.check_unchanged if inputs else None
        )
        if inputs is not None:
            inputs.check_unchanged()
        if attempt.defn.workspace.read_only:
            log.info("read_only_completed", ref=target.input_ref)
            return self._completed(target, Publication(target.input_ref), checked)
        attempt.enter(Phase.DIFF)
        diff = compute_diff(manifest, attempt_dir.workspace)
        log.info("diffed", **diff.summary())
        spec = attempt.defn.workspace
        renames_ok = spec.renames_are_noops
        if renames_ok is None:
            renames_ok = attempt.defn.wants_spark
        fetch_old = partial(self._fetch_old, target, prefix, attempt_dir.root / "before")
        if renames_ok and diff.added and diff.deleted:
            kept = without_renamed_folders(
                manifest, diff, attempt_dir.workspace, fetch_old=fetch_old
            )
            if kept != diff:  # those folders would differ by file names alone
                renamed = len(diff.added) - len(kept.added)
                log.info("only_renamed_same_bytes", renamed=renamed, left=kept.summary())
                diff = kept
        attempt.enter(Phase.PUBLISH)
        target = self._recorded(attempt, checked)
        publication = self._publisher.publish(me, target, prefix, attempt_dir.workspace, diff)
        return self._completed(target, publication, checked)

    def _fetch_old(
        self, target: WorkspaceTarget, prefix: str, root: Path, paths: list[str]
    ) -> Path:
        """Download ``paths`` (relative to ``prefix``) at the input ref into ``root``: the
        files a re-run deleted, to compare with what it wrote (``only_renames``)."""

        def fetch(rel: str) -> None:
            dest = local_path_for(root, rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with dest.open("wb") as sink:
                self._store.download(target.repository, target.input_ref, prefix + rel, sink)

        run_parallel(paths, fetch, parallelism=self._settings.transfer_parallelism)
        log.info("fetched_for_comparison", files=len(paths))
        return root

    def _run_in_place(self, attempt: RunningAttempt) -> Steps:
        """In place: the body reads the input ref and writes the staging branch over S3."""
        attempt.enter(Phase.STAGE)
        me, target, prefix = attempt.identity, attempt.resolved_target(), attempt.prefix
        repo = target.repository
        inputs = remote_inputs(target.reads)

        def one_try() -> Generator[AsyncBody, Any, BaseModel]:
            if attempt.body_try:  # a fresh staging branch at the same input ref
                attempt.enter(Phase.STAGE)
            staging = self._publisher.open_in_place(me, target)
            remote = RemoteWorkspace(
                input_uri=f"s3a://{repo}/{target.input_ref}/{prefix}",
                output_uri=f"s3a://{repo}/{staging}/{prefix}",
                repository=repo,
                input_ref=target.input_ref,
                staging_branch=staging,
                prefix=prefix,
                inputs=dict(inputs),
            )
            try:
                return (yield from self._body_and_checks(attempt, remote, inputs))
            except BaseException:
                self._publisher.cancel(repo, staging)
                raise

        checked = yield from self._body_tries(attempt, one_try)
        attempt.enter(Phase.PUBLISH)
        # publish_in_place cancels the staging branch itself: Cancel runs once on every path.
        target = self._recorded(attempt, checked)
        publication = self._publisher.publish_in_place(me, target, prefix=prefix)
        return self._completed(target, publication, checked)

    def _body_tries(
        self,
        attempt: RunningAttempt,
        one_try: Callable[[], Generator[AsyncBody, Any, T]],
        *,
        before_retry: Callable[[], None] | None = None,
    ) -> Generator[AsyncBody, Any, T]:
        """Run ``one_try`` (a fresh workspace, then the body) until it succeeds, or fails in
        a way another try cannot fix: outside the body, with a terminal error, cancelled, or
        on its last allowed try (``@task(body_retries)``), which is then terminal. Another
        try inside the attempt is one no JOIN can cancel (docs/tasks.md, "Retries")."""
        tries = attempt.defn.options.body_tries
        try:
            while True:
                try:
                    return (yield from one_try())
                except Exception as e:
                    delay = self._next_try_in(attempt, e, tries)
                    if delay is None:
                        raise
                if attempt.defn.is_async:  # no thread held while it waits
                    yield AsyncBody(asyncio.sleep(delay))
                else:
                    attempt.control.wait(delay)
                if attempt.control.cancelled:
                    raise WorkerShutdown(
                        f"the attempt was cancelled ({attempt.control.reason}) while it "
                        "waited to try the body again; nothing published"
                    )
                attempt.body_try += 1
                if before_retry is not None:
                    before_retry()
        finally:
            attempt.control.end_body()

    def _next_try_in(self, attempt: RunningAttempt, e: Exception, tries: int) -> float | None:
        """After a failed try: the seconds to wait before the next one (logged for the task
        log), or None when there is none."""
        retryable = (
            attempt.step is Phase.BODY
            and not (isinstance(e, PeragoError) and e.non_retryable)
            and not is_terminal(e, attempt.defn.options.terminal_errors)
            and not isinstance(e, ImportError)
        )
        if not retryable or tries == 1:
            return None
        done = attempt.body_try + 1
        trace = _authors_traceback(e)
        text = trace.text if trace is not None else describe(e)
        attempt.failed_tries.append(f"try {done} of {tries} failed:\n{text}")
        if done >= tries:
            attempt.tries_ran_out = True
            return None
        delay = body_retry_wait(attempt.defn.options.retry_delay.total_seconds(), done)
        log.warning(
            "body_try_failed",
            body_try=attempt.body_try,
            tries=tries,
            error=describe(e),
            retry_in=delay,
            traceback=trace.text if trace else None,
        )
        metrics.BODY_RETRIES.labels(attempt.defn.name).inc()
        tracing.annotate(body_tries=done + 1)
        return delay

    def _body_and_checks(
        self, attempt: RunningAttempt, workspace: Any, inputs: Inputs[Any] | None = None
    ) -> Generator[AsyncBody, Any, BaseModel]:
        attempt.enter(Phase.BODY)
        try:
            result = yield from self._call_body(attempt, workspace, inputs)
        except Exception:
            _stop_if_cancelled(attempt)
            raise
        _stop_if_cancelled(attempt)
        log.info("body_finished")
        steps.reached(Boundary.AFTER_BODY, attempt.identity)
        attempt.enter(Phase.POST_GUARDRAIL)
        return check_result(attempt.defn, result)

    def _call_body(
        self, attempt: RunningAttempt, workspace: Any, inputs: Inputs[Any] | None
    ) -> Generator[AsyncBody, Any, Any]:
        defn, params = attempt.defn, attempt.params
        kwargs: dict[str, Any] = {}
        if defn.wants_inputs:
            kwargs["inputs"] = inputs
        with attempt_context(attempt.info(), attempt.control):
            if defn.is_async:  # the driver awaits it, in this context
                return (yield AsyncBody(defn.fn(workspace, params, **kwargs)))
            if defn.wants_spark:
                if self._spark is None:
                    raise TaskError(
                        f"task {defn.name} needs Spark but the worker has no Spark session "
                        "provider; run it with `perago worker`",
                        non_retryable=True,
                    )
                session = self._spark()
                # This attempt's Spark jobs carry its tag, so a drain interrupts them and
                # no other attempt's (SparkSessions.interrupt).
                tags = [spark_tag(attempt.identity.task_id)]
                trace = tracing.current()
                if trace is not None:  # the trace id in the Spark UI: a tag and a description
                    tags.append(f"perago-trace-{trace.trace_id}")
                    with contextlib.suppress(Exception):  # Spark Connect has no SparkContext
                        session.sparkContext.setJobDescription(
                            f"perago {defn.name} {attempt.identity.task_id} "
                            f"trace_id={trace.trace_id}"
                        )
                tagging = hasattr(session, "addTag")
                if tagging:
                    for tag in tags:
                        session.addTag(tag)
                try:
                    return defn.fn(workspace, params, spark=session, **kwargs)
                finally:
                    if tagging:
                        with contextlib.suppress(Exception):  # a dead JVM: nothing to untag
                            for tag in tags:
                                session.removeTag(tag)
            return defn.fn(workspace, params, **kwargs)

    @staticmethod
    def _completed(
        target: WorkspaceTarget, publication: Publication, result: BaseModel
    ) -> Finished:
        output: dict[str, Any] = {
            "workspace": {
                "repository": target.repository,
                "branch": target.branch,
                "ref": publication.ref,
            },
            "result": result.model_dump(mode="json"),
        }
        if target.reads:
            output["inputs"] = {read.name: read.as_output() for read in target.reads}
        outcome = Outcome("COMPLETED", output=output)
        return Finished(outcome, publication.lease)


def _out_of_tries(attempt: RunningAttempt, e: Exception, trace: UserTraceback | None) -> Outcome:
    """The terminal outcome of a body that failed every try its attempt allows."""
    tries = attempt.defn.options.body_tries
    what = e.message if isinstance(e, PeragoError) else describe(e)
    failure = BodyTriesExhausted(what)
    return outcome_of(failure, where=attempt.step, advice=failure.advice(tries), trace=trace)


def _ended(attempt: RunningAttempt, finished: Finished) -> Finished:
    """Tell the trace and the lineage receiver how the attempt ended; the task log gets the
    earlier tries' failures of its body before the outcome's own details."""
    if attempt.failed_tries:
        earlier = attempt.failed_tries[: -1 if attempt.tries_ran_out else None]
        details = "\n\n".join([*earlier, finished.outcome.details])
        finished = replace(finished, outcome=replace(finished.outcome, details=details.strip()))
    outcome = finished.outcome
    tracing.annotate(output_ref=outcome.output.get("workspace", {}).get("ref"))
    lineage_events.finished(attempt, outcome, aborted=attempt.aborted)
    return finished


def _stop_if_cancelled(attempt: RunningAttempt) -> None:
    """A body that saw its cancellation (``perago.cancelled()`` answered True) may have
    stopped half way: it publishes nothing, whatever it returned or raised, and the attempt
    ends as drained (FAILED, retried by Conductor where it still counts). A body that never
    asked finishes and publishes as usual."""
    control = attempt.control
    if control.observed:
        log.warning("body_cancelled", reason=control.reason)
        raise WorkerShutdown(f"the attempt was cancelled ({control.reason}); nothing published")


def check_result(defn: TaskDefinition[Any, Any], result: Any) -> BaseModel:
    """Post-guardrail: the body's result as the declared model (ResultValidationError)."""
    if isinstance(result, BaseModel) and not isinstance(result, defn.result_type):
        raise ResultValidationError(
            f"{defn.name} returned a {type(result).__name__}, declared "
            f"{defn.result_type.__name__}; return the declared result model"
        )
    data = result.model_dump() if isinstance(result, BaseModel) else result
    try:
        checked: BaseModel = defn.result_type.model_validate(data)
        return checked
    except ValidationError as e:
        raise ResultValidationError(
            f"the result of {defn.name} does not validate as {defn.result_type.__name__}: "
            f"{_validation_summary(e)}"
        ) from e
