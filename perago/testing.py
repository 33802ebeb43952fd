"""Fakes for unit tests of code built on Perago: an in-memory version store, a stub
orchestrator and a ledger.

``MemoryStore`` follows the lakeFS semantics the protocol relies on (checked against the real
server by the integration suite): merges never fast-forward and fail with a conflict when
both sides changed a path since the merge base; hard reset is unconditional; tags and
branches are create-if-absent. It is not a lakeFS emulator: no hooks, no S3 gateway.

``StubOrchestrator`` stands in for Conductor the way dramatiq's ``StubBroker`` stands in for a
broker: tests submit tasks, a real :class:`perago.worker.Worker` polls them, and every update
the worker sends is recorded in order. Tests can lose a request or its answer, hold a call
inside the stub to force an interleaving, time a task out or deliver it again.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

from pydantic import BaseModel

from perago._api.context import AttemptInfo, attempt_context
from perago._api.inputs import Inputs, ResolvedInput
from perago._api.task import RemoteWorkspace, TaskDefinition
from perago.core.orchestrator import IN_PROGRESS, Outcome, TaskSnapshot
from perago.core.store import Commit, DownloadJob, ObjectInfo, UploadJob, download_one
from perago.errors import (
    ConflictError,
    NotFoundError,
    OrchestratorError,
    StoreError,
    TaskDefinitionError,
)

__all__ = [
    "Gate",
    "MemoryStore",
    "StaticLedger",
    "StubOrchestrator",
    "TaskEnvironment",
    "Update",
    "run_task",
    "running_worker",
]


@dataclass
class _Repo:
    commits: dict[str, tuple[Commit, dict[str, bytes]]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    staged: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    default_branch: str = "main"


class MemoryStore:
    """A :class:`perago.core.store.VersionStore` in memory, thread-safe."""

    def __init__(self) -> None:
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.RLock()
        self._ids = itertools.count(1)

    # -- helpers --------------------------------------------------------------------------

    def _repo(self, name: str) -> _Repo:
        try:
            return self._repos[name]
        except KeyError:
            raise NotFoundError(f"repository {name} not found", status=404) from None

    def _resolve(self, repo: _Repo, ref: str) -> str:
        if ref in repo.branches:
            return repo.branches[ref]
        if ref in repo.tags:
            return repo.tags[ref]
        if ref in repo.commits:
            return ref
        raise NotFoundError(f"ref {ref} not found", status=404)

    def _new_commit(
        self,
        repo: _Repo,
        parents: tuple[str, ...],
        tree: dict[str, bytes],
        message: str,
        metadata: dict[str, str],
    ) -> Commit:
        cid = hashlib.sha256(f"{next(self._ids)}".encode()).hexdigest()
        commit = Commit(cid, parents, message, dict(metadata), created=int(time.time()))
        repo.commits[cid] = (commit, dict(tree))
        return commit

    def tree(self, repository: str, ref: str) -> dict[str, bytes]:
        with self._lock:
            repo = self._repo(repository)
            cid = self._resolve(repo, ref)
            tree = dict(repo.commits[cid][1])
            if ref in repo.branches:
                for path, data in repo.staged[ref].items():
                    if data is None:
                        tree.pop(path, None)
                    else:
                        tree[path] = data
            return tree

    # -- VersionStore ---------------------------------------------------------------------

    def create_repository(self, name: str, *, default_branch: str = "main") -> None:
        with self._lock:
            if name in self._repos:
                raise ConflictError(f"repository {name} exists", status=409)
            repo = _Repo(default_branch=default_branch)
            root = self._new_commit(repo, (), {}, "Repository created", {})
            repo.branches[default_branch] = root.id
            repo.staged[default_branch] = {}
            self._repos[name] = repo

    def list_repositories(self) -> list[str]:
        return sorted(self._repos)

    def repository_exists(self, repository: str) -> bool:
        return repository in self._repos

    def default_branch(self, repository: str) -> str:
        with self._lock:
            return self._repo(repository).default_branch

    def branch_head(self, repository: str, branch: str) -> str:
        with self._lock:
            repo = self._repo(repository)
            if branch not in repo.branches:
                raise NotFoundError(f"branch {branch} not found", status=404)
            return repo.branches[branch]

    def get_commit(self, repository: str, ref: str) -> Commit:
        with self._lock:
            repo = self._repo(repository)
            return repo.commits[self._resolve(repo, ref)][0]

    def log(self, repository: str, ref: str, *, amount: int = 50) -> list[Commit]:
        with self._lock:
            repo = self._repo(repository)
            out: list[Commit] = []
            cid: str | None = self._resolve(repo, ref)
            while cid and len(out) < amount:
                commit = repo.commits[cid][0]
                out.append(commit)
                cid = commit.parents[0] if commit.parents else None
            return out

    def create_branch(
        self, repository: str, name: str, source: str, *, hidden: bool = False
    ) -> None:
        with self._lock:
            repo = self._repo(repository)
            if name in repo.branches:
                raise ConflictError(f"branch {name} exists", status=409)
            repo.branches[name] = self._resolve(repo, source)
            repo.staged[name] = {}

    def delete_branch(self, repository: str, name: str) -> None:
        with self._lock:
            repo = self._repo(repository)
            repo.branches.pop(name, None)
            repo.staged.pop(name, None)

    def list_branches(self, repository: str, *, prefix: str = "") -> list[tuple[str, str]]:
        with self._lock:
            repo = self._repo(repository)
            return sorted((b, c) for b, c in repo.branches.items() if b.startswith(prefix))

    def create_tag(self, repository: str, tag: str, ref: str) -> None:
        with self._lock:
            repo = self._repo(repository)
            if tag in repo.tags:
                raise ConflictError(f"tag {tag} exists", status=409)
            repo.tags[tag] = self._resolve(repo, ref)

    def get_tag(self, repository: str, tag: str) -> str:
        with self._lock:
            return self._repo(repository).tags[tag]

    def commit(
        self, repository: str, branch: str, *, message: str, metadata: dict[str, str]
    ) -> Commit:
        with self._lock:
            repo = self._repo(repository)
            if not repo.staged.get(branch):
                raise StoreError("commit: no changes", status=400)
            tree = self.tree(repository, branch)
            commit = self._new_commit(repo, (repo.branches[branch],), tree, message, metadata)
            repo.branches[branch] = commit.id
            repo.staged[branch] = {}
            return commit

    def _ancestors(self, repo: _Repo, cid: str) -> set[str]:
        seen, todo = set(), [cid]
        while todo:
            c = todo.pop()
            if c not in seen:
                seen.add(c)
                todo.extend(repo.commits[c][0].parents)
        return seen

    def merge(
        self,
        repository: str,
        source: str,
        destination: str,
        *,
        message: str,
        metadata: dict[str, str],
        timeout: float | None = None,
    ) -> str:
        with self._lock:
            repo = self._repo(repository)
            src, dst = self._resolve(repo, source), repo.branches[destination]
            common = self._ancestors(repo, src) & self._ancestors(repo, dst)
            base = max(common, key=lambda c: len(self._ancestors(repo, c)))
            b, s, d = (repo.commits[c][1] for c in (base, src, dst))
            merged = dict(d)
            for path in set(b) | set(s):
                if s.get(path) == b.get(path):
                    continue
                if d.get(path) != b.get(path) and d.get(path) != s.get(path):
                    raise ConflictError(f"merge conflict on {path}", status=409)
                if s.get(path) is None:
                    merged.pop(path, None)
                else:
                    merged[path] = s[path]
            commit = self._new_commit(repo, (dst, src), merged, message, metadata)
            repo.branches[destination] = commit.id
            return commit.id

    def revert(self, repository: str, branch: str, commit: str, *, parent_number: int) -> str:
        with self._lock:
            repo = self._repo(repository)
            undone = repo.commits[commit][0]
            parent = undone.parents[max(parent_number, 1) - 1]
            before, after = repo.commits[parent][1], repo.commits[commit][1]
            head = repo.branches[branch]
            tree = dict(repo.commits[head][1])
            for path in set(before) | set(after):
                if before.get(path) == after.get(path) or tree.get(path) == before.get(path):
                    continue
                if tree.get(path) != after.get(path):
                    raise ConflictError(f"revert conflict on {path}", status=409)
                if before.get(path) is None:
                    tree.pop(path, None)
                else:
                    tree[path] = before[path]
            new = self._new_commit(repo, (head,), tree, f"Revert {commit}", {})
            repo.branches[branch] = new.id
            return new.id

    def hard_reset(
        self, repository: str, branch: str, ref: str, *, timeout: float | None = None
    ) -> None:
        with self._lock:
            repo = self._repo(repository)
            repo.branches[branch] = self._resolve(repo, ref)
            repo.staged[branch] = {}

    def list_objects(
        self, repository: str, ref: str, prefix: str, *, direct: bool = False
    ) -> Iterator[ObjectInfo]:
        for path, data in sorted(self.tree(repository, ref).items()):
            if path.startswith(prefix):
                digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
                yield ObjectInfo(path, len(data), digest, physical_address=f"mem://{digest}")

    def download(
        self, repository: str, ref: str, path: str, dest: IO[bytes], *, url: str = ""
    ) -> None:
        tree = self.tree(repository, ref)
        if path not in tree:
            raise NotFoundError(f"{path} not found at {ref}", status=404)
        dest.seek(0)
        dest.truncate()
        dest.write(tree[path])

    def download_many(
        self, repository: str, ref: str, jobs: Iterable[DownloadJob], *, parallelism: int
    ) -> None:
        for job in jobs:  # one at a time, through download (which test doubles count)
            download_one(self, repository, ref, job)

    def upload_many(
        self, repository: str, branch: str, jobs: Iterable[UploadJob], *, parallelism: int
    ) -> None:
        for job in jobs:  # one at a time, through upload (which test doubles count)
            job.done(self.upload(repository, branch, job.path, job.source))

    def upload(self, repository: str, branch: str, path: str, source: Path) -> ObjectInfo:
        data = source.read_bytes()
        self.upload_bytes(repository, branch, path, data)
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
        return ObjectInfo(path, len(data), digest, physical_address=f"mem://{digest}")

    def upload_bytes(
        self, repository: str, branch: str, path: str, data: bytes, *, if_absent: bool = False
    ) -> None:
        with self._lock:
            repo = self._repo(repository)
            if if_absent and path in self.tree(repository, branch):
                raise ConflictError(f"{path} exists", status=412)
            repo.staged[branch][path] = data

    def delete_objects(self, repository: str, branch: str, paths: Sequence[str]) -> None:
        with self._lock:
            staged = self._repo(repository).staged[branch]
            for p in paths:
                staged[p] = None

    def diff_refs(
        self, repository: str, left: str, right: str, *, prefix: str = ""
    ) -> list[tuple[str, str]]:
        a, b = self.tree(repository, left), self.tree(repository, right)
        a = {p: v for p, v in a.items() if p.startswith(prefix)}
        b = {p: v for p, v in b.items() if p.startswith(prefix)}
        out = [("removed", p) for p in a if p not in b]
        out += [("added", p) for p in b if p not in a]
        out += [("changed", p) for p in b if p in a and a[p] != b[p]]
        return sorted(out, key=lambda change: change[1])

    def copy_object(self, repository: str, source_ref: str, path: str, branch: str) -> None:
        data = self.tree(repository, source_ref).get(path)
        if data is None:
            raise NotFoundError(f"{path} not found on {source_ref}", status=404)
        with self._lock:
            self._repo(repository).staged[branch][path] = data

    def has_uncommitted(self, repository: str, branch: str) -> bool:
        with self._lock:
            return bool(self._repo(repository).staged.get(branch))

    def uncommitted_outside(self, repository: str, branch: str, prefix: str) -> list[str]:
        with self._lock:
            staged = self._repo(repository).staged.get(branch) or {}
            return sorted(p for p in staged if not p.startswith(prefix))


class StaticLedger:
    """An attempt ledger whose answers the test sets (``snapshots[task_id]``)."""

    def __init__(self, *snapshots: TaskSnapshot) -> None:
        self.snapshots = {s.task_id: s for s in snapshots}

    def get_task(self, task_id: str) -> TaskSnapshot | None:
        return self.snapshots.get(task_id)

    def set_status(self, task_id: str, status: str) -> None:
        self.snapshots[task_id] = replace(self.snapshots[task_id], status=status)


Call = Literal["poll", "get_task", "extend", "report"]


@dataclass(frozen=True)
class Update:
    """One update a worker sent, in the order the stub received them."""

    kind: Literal["extend", "report"]
    task_id: str
    worker_id: str
    outcome: Outcome | None = None  # None for an extension
    progress: str | None = None  # an extension's progress note


@dataclass
class _Fault:
    call: Call
    task_id: str | None
    applied: bool
    times: int
    error: BaseException | None


class Gate:
    """Holds calls of one kind inside the stub until released (see :meth:`StubOrchestrator.hold`).

    A held update has read the task already and writes when released: with
    ``StubOrchestrator(racy_updates=True)`` a held extension then writes its stale
    IN_PROGRESS over a report that landed meanwhile, as the real server can.
    """

    def __init__(
        self,
        call: Call,
        task_id: str | None,
        release_on: Call | None,
        release_after: float | None,
    ) -> None:
        self.call, self.task_id, self.release_on = call, task_id, release_on
        self.release_after = release_after
        self.arrived = threading.Event()
        self.done = threading.Event()  # the held call has taken effect
        self._open = threading.Event()

    def release(self) -> None:
        self._open.set()

    @property
    def released(self) -> bool:
        return self._open.is_set()

    def _wait(self, timeout: float) -> None:
        self.arrived.set()
        start = time.monotonic()
        # Short waits: an Interrupt raised into this thread must get through (worker drain).
        while not self._open.wait(0.01):
            held = time.monotonic() - start
            if self.release_after is not None and held >= self.release_after:
                return
            if held > timeout:
                raise AssertionError(f"gate on {self.call} was never released")


@dataclass
class _Task:
    snapshot: TaskSnapshot
    retries_left: int
    outcome: Outcome | None = None


class StubOrchestrator:
    """An in-memory :class:`perago.core.orchestrator.Orchestrator` with Conductor's semantics.

    A polled task is IN_PROGRESS for the poller with its poll count raised; a report or an
    extension of a terminal task is ignored and answered as if it worked (as Conductor does);
    a task reported FAILED or timed out is retried as a new task id while its retry budget
    lasts; ``FAILED_WITH_TERMINAL_ERROR`` never is.
    """

    def __init__(self, *, racy_updates: bool = False, gate_timeout: float = 30.0) -> None:
        self.racy_updates = racy_updates
        self.updates: list[Update] = []
        self.gets: list[str] = []
        #: Every poll: (task type, how long it may wait in ms).
        self.polls: list[tuple[str, int]] = []
        #: Deliveries a worker gave back unrun (task ids).
        self.given_back: list[str] = []
        self.polled_domains: set[tuple[str, str | None]] = set()
        #: Workflow states a test sets; others are derived from the workflow's tasks.
        self.workflow_statuses: dict[str, str] = {}
        self._tasks: dict[str, _Task] = {}
        self._queues: dict[str, deque[str]] = {}
        self._faults: list[_Fault] = []
        self._gates: list[Gate] = []
        self._waiting: list[Gate] = []
        self._gate_timeout = gate_timeout
        self._cond = threading.Condition(threading.RLock())
        self._clock = itertools.count(1)

    # -- scripting -------------------------------------------------------------------------

    def submit(
        self,
        task_type: str,
        task_input: dict[str, Any],
        *,
        workflow_id: str | None = None,
        reference_name: str | None = None,
        retries: int = 0,
        response_timeout_seconds: int = 0,
    ) -> str:
        """Schedule a task (the first attempt of a workflow step); returns its task id."""
        snapshot = TaskSnapshot(
            task_id=uuid.uuid4().hex,
            task_type=task_type,
            reference_name=reference_name or task_type,
            workflow_id=workflow_id or uuid.uuid4().hex,
            status="SCHEDULED",
            retry_count=0,
            poll_count=0,
            worker_id="",
            response_timeout_seconds=response_timeout_seconds,
            input=dict(task_input),
        )
        with self._cond:
            self._schedule(snapshot, retries)
            return snapshot.task_id

    def _schedule(self, snapshot: TaskSnapshot, retries: int) -> None:
        self._tasks[snapshot.task_id] = _Task(snapshot, retries)
        self._queues.setdefault(snapshot.task_type, deque()).append(snapshot.task_id)
        self._cond.notify_all()

    def _set(self, task_id: str, **changes: Any) -> TaskSnapshot:
        entry = self._tasks[task_id]
        entry.snapshot = replace(entry.snapshot, update_time_ms=next(self._clock), **changes)
        self._cond.notify_all()
        return entry.snapshot

    def _end(self, task_id: str, status: str, outcome: Outcome | None) -> None:
        entry = self._tasks[task_id]
        self._set(task_id, status=status, terminal=True)
        entry.outcome = outcome
        if status in ("FAILED", "TIMED_OUT") and entry.retries_left > 0:
            old = entry.snapshot
            retry = replace(
                old,
                task_id=uuid.uuid4().hex,
                status="SCHEDULED",
                retry_count=old.retry_count + 1,
                poll_count=0,
                worker_id="",
                terminal=False,
            )
            self._schedule(retry, entry.retries_left - 1)

    def time_out(self, task_id: str) -> None:
        """The response timeout ran out: TIMED_OUT, retried while the budget lasts."""
        with self._cond:
            self._end(task_id, "TIMED_OUT", None)

    def redeliver(self, task_id: str) -> None:
        """Put the same task id back in the queue; the next poll raises its poll count."""
        with self._cond:
            self._set(task_id, status="SCHEDULED", worker_id="")
            self._queues.setdefault(self._tasks[task_id].snapshot.task_type, deque()).append(
                task_id
            )

    def fail(
        self,
        call: Call,
        *,
        task_id: str | None = None,
        applied: bool = False,
        times: int = 1,
        error: BaseException | None = None,
    ) -> None:
        """Make the next ``times`` calls of ``call`` raise ``error`` (default: an
        OrchestratorError, HTTP 503).

        ``applied=False``: the request is lost (nothing changes); ``applied=True``: the
        request takes effect and only its answer is lost.
        """
        with self._cond:
            self._faults.append(_Fault(call, task_id, applied, times, error))

    def hold(
        self,
        call: Call,
        *,
        task_id: str | None = None,
        release_on: Call | None = None,
        release_after: float | None = None,
    ) -> Gate:
        """Hold the next ``call`` inside the stub until the gate is released, until a
        ``release_on`` call (of the same task, when ``task_id`` is given) has been applied, or
        for ``release_after`` seconds (a delayed request: whatever the worker sends meanwhile
        overtakes it)."""
        gate = Gate(call, task_id, release_on, release_after)
        with self._cond:
            self._gates.append(gate)
        return gate

    # -- inspection ------------------------------------------------------------------------

    def task(self, task_id: str) -> TaskSnapshot:
        with self._cond:
            return self._tasks[task_id].snapshot

    def outcome(self, task_id: str) -> Outcome | None:
        """The outcome the task ended with (None while it runs, or when it timed out)."""
        with self._cond:
            return self._tasks[task_id].outcome

    def completed_outputs(self, workflow_id: str) -> list[tuple[str, dict[str, Any]]]:
        with self._cond:
            return [
                (t.snapshot.reference_name, dict(t.outcome.output))
                for t in self._tasks.values()
                if t.snapshot.workflow_id == workflow_id
                and t.outcome is not None
                and t.outcome.status == "COMPLETED"
            ]

    def workflow_status(self, workflow_id: str) -> str | None:
        if workflow_id in self.workflow_statuses:
            return self.workflow_statuses[workflow_id]
        with self._cond:
            tasks = [
                t.snapshot for t in self._tasks.values() if t.snapshot.workflow_id == workflow_id
            ]
        if not tasks:
            return None
        if not all(t.terminal for t in tasks):
            return "RUNNING"
        last: dict[str, TaskSnapshot] = {}
        for t in sorted(tasks, key=lambda t: (t.retry_count, t.poll_count)):
            last[t.reference_name] = t
        return "COMPLETED" if all(t.status == "COMPLETED" for t in last.values()) else "FAILED"

    def attempts(self, workflow_id: str, reference_name: str | None = None) -> list[TaskSnapshot]:
        """Every task of a workflow (step), in the order they were scheduled."""
        with self._cond:
            return [
                t.snapshot
                for t in self._tasks.values()
                if t.snapshot.workflow_id == workflow_id
                and reference_name in (None, t.snapshot.reference_name)
            ]

    def reports(self, task_id: str | None = None) -> list[Update]:
        with self._cond:
            return [u for u in self.updates if u.kind == "report" and task_id in (None, u.task_id)]

    def wait_for(
        self, predicate: Callable[[StubOrchestrator], bool], *, timeout: float = 30.0
    ) -> None:
        """Block until ``predicate(self)`` holds (re-checked on every change)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"stub orchestrator: condition not met in {timeout}s")
                self._cond.wait(min(left, 0.05))

    def settled(self, workflow_id: str) -> bool:
        """Every task of the workflow is terminal and none is scheduled or running."""
        tasks = self.attempts(workflow_id)
        return bool(tasks) and all(t.terminal for t in tasks)

    def final(self, workflow_id: str, reference_name: str | None = None) -> TaskSnapshot:
        """The last attempt of a workflow step."""
        return self.attempts(workflow_id, reference_name)[-1]

    # -- faults and gates ------------------------------------------------------------------

    def _fault(self, call: Call, task_id: str | None) -> _Fault | None:
        for fault in self._faults:
            if fault.call == call and fault.task_id in (None, task_id):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _gate(self, call: Call, task_id: str | None) -> Gate | None:
        for gate in self._gates:
            if gate.call == call and gate.task_id in (None, task_id):
                self._gates.remove(gate)
                return gate
        return None

    def _enter(self, call: Call, task_id: str | None) -> tuple[_Fault | None, Gate | None]:
        with self._cond:
            return self._fault(call, task_id), self._gate(call, task_id)

    @staticmethod
    def _raise(call: Call, task_id: str | None, fault: _Fault) -> None:
        if fault.error is not None:
            raise fault.error
        raise OrchestratorError(
            f"stub orchestrator: {call} {task_id or ''} failed on purpose (HTTP 503)", status=503
        )

    # -- Orchestrator ----------------------------------------------------------------------

    def poll(
        self,
        task_type: str,
        *,
        worker_id: str,
        count: int,
        domain: str | None = None,
        wait_ms: int = 100,
    ) -> list[TaskSnapshot]:
        # Task domains are Conductor's routing; the stub has one queue per task type and
        # records the domains it was polled in (``polled_domains``) and each poll (``polls``).
        self.polled_domains.add((task_type, domain))
        with self._cond:
            self.polls.append((task_type, wait_ms))
        fault, _ = self._enter("poll", None)
        if fault is not None and not fault.applied:
            self._raise("poll", None, fault)
        out: list[TaskSnapshot] = []
        with self._cond:
            if wait_ms > 0:  # a long-poll: Conductor holds it open until a task is ready
                self._cond.wait_for(lambda: self._queues.get(task_type), timeout=wait_ms / 1000)
            queue = self._queues.get(task_type, deque())
            while queue and len(out) < count:
                task_id = queue.popleft()
                old = self._tasks[task_id].snapshot
                out.append(
                    self._set(
                        task_id,
                        status=IN_PROGRESS,
                        poll_count=old.poll_count + 1,
                        worker_id=worker_id,
                    )
                )
        if fault is not None:
            self._raise("poll", None, fault)
        return out

    def get_task(self, task_id: str) -> TaskSnapshot | None:
        fault, _ = self._enter("get_task", task_id)
        if fault is not None:
            self._raise("get_task", task_id, fault)
        with self._cond:
            self.gets.append(task_id)
            entry = self._tasks.get(task_id)
            return None if entry is None else entry.snapshot

    def give_back(self, task: TaskSnapshot, *, worker_id: str) -> None:
        with self._cond:
            self.given_back.append(task.task_id)
        self.redeliver(task.task_id)

    def extend(self, task: TaskSnapshot, *, worker_id: str, progress: str | None = None) -> None:
        self._update(Update("extend", task.task_id, worker_id, progress=progress))

    def report(
        self,
        task: TaskSnapshot,
        outcome: Outcome,
        *,
        worker_id: str,
        timeout: float | None = None,
    ) -> None:
        self._update(Update("report", task.task_id, worker_id, outcome))

    def _update(self, update: Update) -> None:
        call: Call = update.kind
        with self._cond:
            self.updates.append(update)
            self._cond.notify_all()
            if update.task_id not in self._tasks:
                raise OrchestratorError(f"task {update.task_id} not found", status=404)
            read = self._tasks[update.task_id].snapshot
        fault, gate = self._enter(call, update.task_id)
        if fault is not None and not fault.applied:
            self._raise(call, update.task_id, fault)
        if gate is not None:
            with self._cond:
                self._waiting.append(gate)
            try:
                gate._wait(self._gate_timeout)
            finally:
                with self._cond:
                    self._waiting.remove(gate)
        with self._cond:
            now = self._tasks[update.task_id].snapshot
            if update.outcome is not None:
                if not now.terminal:
                    self._end(update.task_id, update.outcome.status, update.outcome)
            elif self.racy_updates and not read.terminal:
                # The extension read the task before a report landed and writes it back.
                self._tasks[update.task_id].outcome = None
                self._set(update.task_id, status=IN_PROGRESS, terminal=False)
            elif not now.terminal:
                self._set(update.task_id)
            self._release_after(call, update.task_id)
            if gate is not None:
                gate.done.set()
        if fault is not None:
            self._raise(call, update.task_id, fault)

    def _release_after(self, call: Call, task_id: str) -> None:
        for gate in self._waiting + self._gates:
            if gate.release_on == call and gate.task_id in (None, task_id):
                gate.release()


P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


@contextmanager
def running_worker(
    tasks: Sequence[TaskDefinition[Any, Any]],
    *,
    store: Any,
    orchestrator: Any,
    work_dir: Path,
    leases: Any = None,
    spark: Any = None,
    **settings: Any,
) -> Iterator[Any]:
    """A real :class:`perago.worker.Worker` polling ``orchestrator`` (a
    :class:`StubOrchestrator`) from a thread, against ``store`` (a :class:`MemoryStore`):
    a whole worker without servers. Stopped (drained) on exit. ``settings`` override the
    defaults made for tests (fast polls, no janitor pass, a short drain)."""
    from perago.config import load
    from perago.worker import Worker

    values: dict[str, Any] = {
        "worker_id": "w1",
        "work_dir": work_dir,
        "poll_interval": timedelta(milliseconds=5),
        "janitor_on_start": False,
        "wap_sweep_interval": timedelta(0),
        "shutdown_grace": timedelta(seconds=1),
        **settings,
    }
    worker = Worker(
        tasks,
        settings=load(env={}, **values),
        store=store,
        orchestrator=orchestrator,
        leases=leases,
        spark=spark,
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        yield worker
    finally:
        # A test that stopped the worker itself is draining it: a second stop() would force
        # the drain (interrupting attempts in their report, and whatever lock they hold).
        if not worker.draining:
            worker.stop()
        thread.join(timeout=60)
        if thread.is_alive():
            raise AssertionError("the worker did not stop within 60 s")


class TaskEnvironment:
    """Run a task function directly, with :func:`perago.info` set (temporal's
    ``ActivityEnvironment`` is the model): no lakeFS, no Conductor, no workspace copy.

    ``params`` may be the model or a dict (validated like the runner does); the result goes
    through the post-guardrail, so a result that would fail the attempt fails here too::

        env = TaskEnvironment(retry_count=1)
        result = env.run(orders_clean, tmp_path, {"min_amount": 5})
        assert env.info.retry_count == 1
    """

    def __init__(self, *, spark: Any = None, **info: Any) -> None:
        self.spark = spark
        self._info = info

    @property
    def info(self) -> AttemptInfo:
        """What ``perago.info()`` returns inside :meth:`run` (override fields by keyword)."""
        defaults: dict[str, Any] = {
            "workflow_id": "test-workflow",
            "task_id": "test-task",
            "task_type": "test-task-type",
            "reference_name": "test-step",
            "retry_count": 0,
            "poll_count": 1,
            "repository": "test-repository",
            "branch": "main",
            "input_ref": "test-input-ref",
        }
        return AttemptInfo(**{**defaults, **self._info})

    def run(
        self,
        defn: TaskDefinition[P, R],
        workspace: Path | RemoteWorkspace,
        params: P | dict[str, Any] | None = None,
        *,
        inputs: Mapping[str, Path | str] | None = None,
    ) -> R:
        """``inputs`` maps each of the task's named inputs to a folder (or URI) of test data."""
        from perago._api.task_io import check_param_keys
        from perago.worker.runtime import check_result

        raw = params.model_dump() if isinstance(params, BaseModel) else params or {}
        check_param_keys(defn, raw)  # as the worker does by default (PERAGO_PARAMS_EXTRA)
        checked = defn.params_type.model_validate(raw)
        current = replace(self.info, task_type=self._info.get("task_type", defn.name))
        kwargs: dict[str, Any] = {}
        if defn.wants_spark:
            kwargs["spark"] = self.spark
        if defn.wants_inputs:
            kwargs["inputs"] = self._inputs(defn, checked, inputs or {})
        with attempt_context(current):
            result: Any = defn.fn(workspace, checked, **kwargs)
            if defn.is_async:  # an async def body: awaited on a fresh loop, as drive() does
                import asyncio

                result = asyncio.run(result)
        return check_result(defn, result)  # type: ignore[return-value]

    def _inputs(
        self, defn: TaskDefinition[Any, Any], params: BaseModel, given: Mapping[str, Path | str]
    ) -> Inputs[Path | str]:
        declared = defn.workspace.render_inputs(params)
        if set(given) != set(declared):
            raise TaskDefinitionError(
                f"{defn.name} declares the inputs {sorted(declared)}; pass exactly those to "
                f"run(..., inputs={{...}}), got {sorted(given)}"
            )
        info = self.info
        sources = {
            name: ResolvedInput(name, info.repository, "", info.input_ref, prefix, True)
            for name, prefix in declared.items()
        }
        return Inputs(dict(given), sources)


def run_task(
    defn: TaskDefinition[P, R],
    workspace: Path | RemoteWorkspace,
    params: P | dict[str, Any] | None = None,
    *,
    inputs: Mapping[str, Path | str] | None = None,
    **info: Any,
) -> R:
    """One call of :class:`TaskEnvironment`: ``run_task(my_task, tmp_path, {"n": 1})``."""
    return TaskEnvironment(**info).run(defn, workspace, params, inputs=inputs)
