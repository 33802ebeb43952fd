"""The worker: poll, run attempts concurrently, extend response timeouts, drain on SIGTERM.

conductor-python's TaskHandler has no drain, no attempt fencing and forks per task type, so
Perago runs its own small loop against the :class:`perago.core.orchestrator.Orchestrator`
protocol (Conductor in production, ``perago.testing.StubOrchestrator`` in unit tests).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import structlog

from perago._api.context import AttemptControl
from perago._api.task import TaskDefinition
from perago.config import Settings
from perago.coord.branch_leases import BranchLeases
from perago.core.orchestrator import Orchestrator, Outcome, TaskSnapshot
from perago.core.retry_policy import poll_backoff
from perago.core.store import VersionStore
from perago.errors import (
    AttemptFenceError,
    ConfigError,
    Interrupt,
    PeragoError,
    ReportWindowClosedError,
    WorkerShutdown,
)
from perago.publish.deliveries import EndedRecords, LocalDeliveries
from perago.publish.fences import check_attempt, check_current
from perago.publish.group_commit import GroupMember
from perago.publish.transaction import release_lease
from perago.telemetry import metrics, steps, tracing
from perago.telemetry.failure_text import bounded_traceback, describe
from perago.telemetry.steps import Boundary, Phase
from perago.worker import failpoints, lineage_events
from perago.worker.async_bodies import AsyncBodies, Running
from perago.worker.health import HealthServer
from perago.worker.recovery import AttemptRecords, recover
from perago.worker.report import Landing, TaskUpdates, delivered_again, in_report_windows
from perago.worker.runtime import AttemptRunner, Finished, outcome_of

__all__ = ["Worker"]

log = structlog.get_logger("perago.worker")


#: A delivery's key: Conductor may deliver a task id again (its sweeper re-queues a task a
#: poll has just taken) while the earlier delivery still runs; the poll count tells them apart.
DeliveryKey = tuple[str, int]


@dataclass
class _Delivery:
    """One delivery of a task on this worker, from its poll to its report: what the worker
    counts in flight and waits for on drain, what it interrupts, extends and reports for.

    Keyed by (task id, poll count), as the attempt records are (``DeliveryKey``)."""

    snapshot: TaskSnapshot
    control: AttemptControl
    updates: TaskUpdates
    #: A plain attempt's thread (its ident once it runs); an async attempt's place instead.
    ident: int = 0
    running: Running | None = None
    started: float = field(default_factory=time.monotonic)
    #: The attempt record (a restart after a crash fails what it names), once written.
    record: Any = None
    after_report: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    stop_extending: threading.Event = field(default_factory=threading.Event)
    trace: tracing.AttemptTrace | None = None
    #: Its COMPLETED has been sent and is not known to have landed: it might land still, so
    #: a re-delivery on this worker waits its report windows out in full (``_close``).
    completed_in_doubt: bool = True

    @property
    def key(self) -> DeliveryKey:
        return (self.snapshot.task_id, self.snapshot.poll_count)

    def interrupt(self) -> None:
        """The drain's last resort: an asynchronous exception, or the async body cancelled."""
        if self.running is not None:
            self.running.interrupt()
        else:
            _raise_in_thread(self.ident, WorkerShutdown)


def task_domain(defn: TaskDefinition[Any, Any], settings: Settings) -> str | None:
    """The Conductor task domain to poll ``defn`` in: ``PERAGO_TASK_DOMAINS``, then the
    task's own ``domain``, then the worker's ``CONDUCTOR_WORKER_DOMAIN``; None: no domain."""
    return (
        settings.task_domains.get(defn.name)
        or defn.options.domain
        or settings.worker_domain
        or None
    )


class Worker:
    """Runs the given tasks until SIGTERM/SIGINT (or :meth:`stop`)."""

    def __init__(
        self,
        tasks: Sequence[TaskDefinition[Any, Any]],
        *,
        settings: Settings,
        store: VersionStore,
        orchestrator: Orchestrator,
        spark: Any = None,
        http_port: int | None = None,
        leases: BranchLeases | None = None,
    ) -> None:
        if not tasks:
            raise ConfigError("a worker needs at least one task: pass modules that define @task")
        names = [t.name for t in tasks]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ConfigError(f"task names must be unique in one worker, repeated: {duplicates}")
        self._tasks = {t.name: t for t in tasks}
        _check_isolation(tasks, settings)
        self._domains = {t.name: task_domain(t, settings) for t in tasks}
        self._limits = {
            t.name: settings.task_concurrency.get(t.name) or t.options.concurrency
            for t in tasks
            if settings.task_concurrency.get(t.name) or t.options.concurrency
        }
        self._settings = settings
        self._orchestrator = orchestrator
        self._spark = spark
        self._store = store
        self._leases = leases
        #: Deliveries of each task id run here: a re-delivery's window wait may end sooner.
        self._deliveries = LocalDeliveries(
            records=None
            if leases is None
            else EndedRecords(
                lambda repository: leases.manager(repository).store,
                worker_id=settings.worker_id,
            )
        )
        self._runner = AttemptRunner(
            store, orchestrator, settings, spark=spark, leases=leases, deliveries=self._deliveries
        )
        self._records = AttemptRecords(settings.work_dir)
        self._inflight: dict[DeliveryKey, _Delivery] = {}
        self._poll_failures = 0
        self._lock = threading.Condition()
        self._draining = threading.Event()
        self._force = threading.Event()
        self._http_port = http_port
        self._last_loop = time.monotonic()
        self._async: AsyncBodies | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def stop(self, *, force: bool = False) -> None:
        """Stop polling; with ``force`` interrupt in-flight attempts now."""
        if force or self._draining.is_set():
            self._force.set()
        self._draining.set()
        with self._lock:
            self._lock.notify_all()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.warning("shutdown_requested", signal=signal.Signals(signum).name)
        self.stop()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        failpoints.configure()
        tracing.configure()  # both off unless their standard variables ask for them
        lineage_events.configure()
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        log.info(
            "worker_started",
            worker_id=self._settings.worker_id,
            tasks=sorted(self._tasks),
            domains={n: d for n, d in sorted(self._domains.items()) if d},
            concurrency=self._settings.concurrency,
            publications_in_flight=self._settings.publishing_places,
            task_concurrency=self._limits or None,
        )
        http = self._start_http()
        # Before polling: deliveries a killed process of this worker left IN_PROGRESS are
        # failed now, so Conductor retries them without waiting out the response timeout.
        recover(self._records, self._orchestrator)
        threading.Thread(target=self._janitor_loop, daemon=True, name="perago-janitor").start()
        try:
            self._poll_loop()
        finally:
            self._drain()
            if self._async is not None:
                self._async.close()
            if self._runner.cache is not None:
                self._runner.cache.close()  # its files are vouched for by this process only
            _flush_telemetry()
            if http is not None:
                http.stop()
        log.info("worker_stopped", worker_id=self._settings.worker_id)

    def alive(self) -> bool:
        """Liveness: the poll loop went round recently (or the worker is draining)."""
        return self._draining.is_set() or time.monotonic() - self._last_loop < 60

    def _start_http(self) -> HealthServer | None:
        if self._http_port is None:
            return None
        server = HealthServer(
            self._http_port,
            alive=self.alive,
            draining=self._draining.is_set,
            dependencies={
                "conductor": self._settings.conductor_server_url.removesuffix("/api") + "/health",
                "lakefs": self._settings.lakefs_api_url + "/healthcheck",
            },
            problem=lambda: getattr(self._spark, "problem", None),
        )
        server.start()
        return server

    def _janitor_loop(self) -> None:
        """The start-up janitor pass, then the write-audit-publish sweep every interval: an
        isolated branch goes once its workflow ended, however it ended."""
        if self._settings.janitor_on_start:
            self._janitor_pass()
        interval = self._settings.wap_sweep_interval.total_seconds()
        while interval > 0 and not self._draining.wait(interval):
            self._wap_sweep()

    def _wap_sweep(self) -> None:
        from perago.core.orchestrator import WorkflowLedger
        from perago.publish.janitor import sweep_wap

        if not isinstance(self._orchestrator, WorkflowLedger):
            return
        try:
            report = sweep_wap(
                self._store,
                self._orchestrator,
                repositories=self._store.list_repositories(),
                cluster_id=self._settings.cluster_id,
                keep_wap=self._settings.wap_keep_branch,
            )
            if report.removed:
                log.info("wap_sweep_done", removed=len(report.removed))
        except PeragoError as e:
            log.warning("wap_sweep_failed", error=e.message)

    def _janitor_pass(self) -> None:
        """Staging branches of dead attempts, then leases whose holder died (watched first)."""
        from perago.publish.janitor import sweep, sweep_leases, takeover_watch

        try:
            repositories = self._store.list_repositories()
            report = sweep(
                self._store,
                self._orchestrator,
                repositories=repositories,
                cluster_id=self._settings.cluster_id,
                keep_wap=self._settings.wap_keep_branch,
            )
            log.info("janitor_pass_done", removed=len(report.removed), kept=len(report.kept))
            if self._leases is not None:
                leases = sweep_leases(
                    self._leases,
                    repositories=repositories,
                    watch=takeover_watch(self._settings),
                    sleep=self._draining.wait,
                )
                log.info(
                    "janitor_lease_pass_done",
                    removed=len(leases.removed),
                    kept=len(leases.kept),
                )
        except PeragoError as e:
            log.warning("janitor_pass_failed", error=e.message)

    # -- polling -----------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        """Fill free places as soon as Conductor has a task of any type this worker serves.

        A round asks every task type at once-over, without waiting (a poll that answers at
        once), so a place that frees is filled in one round whatever the number of types.
        Only when no type has a task does the worker wait, in one long-poll of the next type
        in turn (``poll_interval``): a quiet worker costs Conductor one request per type and
        one long-poll per round, and a task of another type waits at most that long."""
        wait_ms = max(1, int(self._settings.poll_interval.total_seconds() * 1000))
        turn = 0
        names = list(self._tasks)
        while not self._draining.is_set():
            self._last_loop = time.monotonic()
            with self._lock:
                free = self._free_places()
                if free <= 0:
                    self._lock.wait(timeout=wait_ms / 1000)
                    continue
            started, free = self._poll_round(names, free, wait_ms=0)
            if started or free <= 0 or self._draining.is_set():
                continue
            # Nothing anywhere: wait for the next type in turn to have a task.
            for _ in range(len(names)):
                name = names[turn % len(names)]
                turn += 1
                if self._slots(name, free) > 0:
                    self._poll_round([name], free, wait_ms=wait_ms)
                    break
            else:  # every type is at its own limit: wait for a place to free
                with self._lock:
                    self._lock.wait(timeout=wait_ms / 1000)

    def _poll_round(self, names: Sequence[str], free: int, *, wait_ms: int) -> tuple[int, int]:
        """Poll each of ``names`` in turn for up to its free places; start what comes.
        Returns how many started and the places still free."""
        started = 0
        for name in names:
            if self._draining.is_set() or free <= 0:
                break
            count = self._slots(name, free)
            if count <= 0:
                continue  # at its own limit: leave its tasks to other workers meanwhile
            try:
                polled = self._orchestrator.poll(
                    name,
                    worker_id=self._settings.worker_id,
                    count=count,
                    domain=self._domains[name],
                    wait_ms=wait_ms,
                )
                self._poll_failures = 0
            except PeragoError as e:
                self._poll_failures += 1
                backoff = poll_backoff(self._poll_failures)
                log.warning("poll_failed", task_type=name, error=e.message, retry_in=backoff)
                self._draining.wait(backoff)
                break
            for snapshot in polled:
                if self._draining.is_set():  # the long-poll answered after the drain began
                    self._give_back(snapshot)
                    continue
                self._start(snapshot)
                free -= 1
                started += 1
        return started, free

    def _give_back(self, snapshot: TaskSnapshot) -> None:
        try:
            self._orchestrator.give_back(snapshot, worker_id=self._settings.worker_id)
            log.info("delivery_given_back", task_id=snapshot.task_id, reason="draining")
        except PeragoError as e:  # its response timeout hands it to another worker
            log.warning("give_back_failed", task_id=snapshot.task_id, error=e.message)

    def _free_places(self) -> int:
        """How many attempts may start now (under ``self._lock``): a place is a running body's.

        An attempt whose body has ended (it uploads, waits for the branch lease, merges and
        reports) frees its place, up to ``publications_in_flight`` of them, so a fan-out's
        next bodies run while their siblings' publications wait to join a group commit.
        """
        bodies = sum(1 for f in self._inflight.values() if not f.control.body_ended)
        total = self._settings.concurrency + self._settings.publishing_places
        return min(self._settings.concurrency - bodies, total - len(self._inflight))

    def _body_ended(self) -> None:
        with self._lock:
            self._lock.notify_all()  # the poll loop may have a place now

    def _slots(self, name: str, free: int) -> int:
        """How many attempts of task ``name`` this worker may start now (its limit counts
        running bodies, as ``concurrency`` does)."""
        limit = self._limits.get(name)
        if limit is None:
            return free
        with self._lock:
            running = sum(
                1
                for f in self._inflight.values()
                if f.snapshot.task_type == name and not f.control.body_ended
            )
        return min(free, limit - running)

    def _start(self, snapshot: TaskSnapshot) -> None:
        delivery = self._delivery(snapshot)
        self._deliveries.started(snapshot.task_id, snapshot.poll_count)
        if self._tasks[snapshot.task_type].is_async:
            bodies = self._async_bodies()
            delivery.running = Running(bodies.loop)
            with self._lock:
                self._inflight[delivery.key] = delivery
            bodies.submit(self._attempt_async(delivery))
            return
        thread = threading.Thread(
            target=self._attempt,
            args=(delivery,),
            name=f"perago-attempt-{snapshot.task_id}-p{snapshot.poll_count}",
            daemon=True,
        )
        with self._lock:
            self._inflight[delivery.key] = delivery
        thread.start()

    def _delivery(self, snapshot: TaskSnapshot) -> _Delivery:
        control = AttemptControl(on_body_end=self._body_ended)
        worker_id = self._settings.worker_id
        updates = TaskUpdates(
            snapshot,
            extend=lambda: self._orchestrator.extend(
                snapshot, worker_id=worker_id, progress=control.take_note()
            ),
            read=lambda: self._orchestrator.get_task(snapshot.task_id),
        )
        return _Delivery(snapshot, control, updates)

    def _async_bodies(self) -> AsyncBodies:
        """The event loop of this worker's ``async def`` bodies, made on first use."""
        if self._async is None:
            self._async = AsyncBodies(step_threads=max(2, min(8, self._settings.concurrency)))
        return self._async

    # -- one attempt ---------------------------------------------------------------------------

    def _attempt(self, delivery: _Delivery) -> None:
        """A plain attempt, start to report, on its own thread."""
        snapshot = delivery.snapshot
        with self._lock:
            delivery.ident = threading.get_ident()
        self._open(delivery)
        threading.Thread(
            target=self._extend_response_timeout,
            args=(delivery,),
            daemon=True,
            name=f"perago-extend-{snapshot.task_id}-p{snapshot.poll_count}",
        ).start()
        try:
            try:
                with tracing.tracing(delivery.trace):
                    finished = self._runner.run(
                        self._tasks[snapshot.task_type],
                        snapshot,
                        after_report=delivery.after_report,
                        control=delivery.control,
                    )
            except WorkerShutdown as e:
                finished = Finished(outcome_of(e, where="run"))
            except Exception as e:  # noqa: BLE001 - never a dead attempt without a report
                finished = _crashed(snapshot, e)
            self._conclude(delivery, finished)
        except Interrupt as e:
            _interrupted(delivery, e)
        finally:
            self._close(delivery)

    async def _attempt_async(self, delivery: _Delivery) -> None:
        """An attempt of an ``async def`` body: its body awaited on the worker's loop, its
        other steps and its report on the loop's thread pool."""
        bodies, snapshot = self._async_bodies(), delivery.snapshot
        assert delivery.running is not None
        self._open(delivery)
        extender = bodies.loop.create_task(self._extend_async(delivery))
        try:
            try:
                steps = self._runner.steps(
                    self._tasks[snapshot.task_type],
                    snapshot,
                    after_report=delivery.after_report,
                    control=delivery.control,
                )
                name = f"perago-body-{snapshot.task_id}-p{snapshot.poll_count}"
                with tracing.tracing(delivery.trace):  # drive() copies this context
                    finished = await bodies.drive(steps, delivery.running, name)
            except WorkerShutdown as e:
                finished = Finished(outcome_of(e, where="run"))
            except Exception as e:  # noqa: BLE001 - never a dead attempt without a report
                finished = _crashed(snapshot, e)
            await bodies.step(delivery.running, self._conclude, delivery, finished)
        except Interrupt as e:
            _interrupted(delivery, e)
        except BaseException as e:  # noqa: BLE001 - nobody awaits this coroutine: log it
            log.error(
                "attempt_crashed",
                task_id=snapshot.task_id,
                error=describe(e),
                traceback=bounded_traceback(e),
            )
        finally:
            extender.cancel()
            await bodies.blocking(self._close, delivery)

    def _open(self, delivery: _Delivery) -> None:
        snapshot = delivery.snapshot
        metrics.IN_FLIGHT.inc()
        # Kept until the report is sent: a restart after a crash fails what it names (recovery);
        # an attempt interrupted before that keeps it, which is right: it was not reported.
        # The attempt directory goes after the report, before the record (recovery removes
        # what a crash in between leaves).
        delivery.record = self._records.add(snapshot, worker_id=self._settings.worker_id)
        delivery.trace = tracing.begin(
            task_type=snapshot.task_type,
            workflow_id=snapshot.workflow_id,
            task_id=snapshot.task_id,
            step=snapshot.reference_name,
            retry_count=snapshot.retry_count,
        )

    def _conclude(self, delivery: _Delivery, finished: Finished) -> None:
        """Report the outcome, then remove the attempt's directory and record."""
        delivery.stop_extending.set()
        metrics.ATTEMPTS.labels(delivery.snapshot.task_type, finished.outcome.status).inc()
        delivery.control.phase = Phase.REPORT
        if delivery.trace is not None:
            delivery.trace.phase("report")
        delivery.completed_in_doubt = self._report(delivery.snapshot, finished, delivery.updates)
        if delivery.trace is not None:
            delivery.trace.end(finished.outcome.status, finished.outcome.reason)
        delivery.control.phase = Phase.AFTER_REPORT
        delivery.after_report.close()
        self._records.remove(delivery.record)
        steps.reached(Boundary.AFTER_COMPLETE, delivery.snapshot)

    def _close(self, delivery: _Delivery) -> None:
        if delivery.trace is not None:  # ended in its report already, unless interrupted
            delivery.trace.end("INTERRUPTED", f"interrupted at {_phase(delivery)}")
        delivery.stop_extending.set()
        delivery.after_report.close()
        metrics.IN_FLIGHT.dec()
        if not delivery.completed_in_doubt:
            snapshot = delivery.snapshot
            with structlog.contextvars.bound_contextvars(
                workflow_id=snapshot.workflow_id, retry_count=snapshot.retry_count
            ):  # a superseded delivery's end is recorded here
                self._deliveries.ended(*delivery.key)
        with self._lock:
            self._inflight.pop(delivery.key, None)
            self._lock.notify_all()

    def _extend_response_timeout(self, delivery: _Delivery) -> None:
        """Tell the orchestrator every third of the response timeout that the attempt lives
        (with the body's newest progress note), then read the task back: cancel the body
        once Conductor no longer counts on this attempt, or when the response timeout is
        about to run out because no extension got through."""
        extension = _Extension(self, delivery)
        while extension.every and not delivery.stop_extending.wait(extension.every):
            if not extension.once():
                return

    async def _extend_async(self, delivery: _Delivery) -> None:
        """:meth:`_extend_response_timeout` for an async attempt: a task on the loop, the
        requests on the loop's call pool (the attempt's report cancels it)."""
        import asyncio

        extension, bodies = _Extension(self, delivery), self._async_bodies()
        while extension.every:
            await asyncio.sleep(extension.every)
            if delivery.stop_extending.is_set() or not await bodies.call(extension.once):
                return

    def _report(self, snapshot: TaskSnapshot, finished: Finished, updates: TaskUpdates) -> bool:
        """Report the outcome. A publication that holds the branch lease leaves it first and
        sends COMPLETED inside the report window that opens (FAILED once it has closed: a
        re-delivery of the task id may be publishing then; docs/model-check.md, F3).
        Returns whether a COMPLETED was sent without Conductor showing it (it may land yet)."""
        outcome, lease = finished.outcome, finished.lease
        fields = {
            "workflow_id": snapshot.workflow_id,
            "task_id": snapshot.task_id,
            "retry_count": snapshot.retry_count,
            "status": outcome.status,
        }
        worker_id = self._settings.worker_id

        if outcome.status != "COMPLETED" and self._delivered_again(snapshot, fields):
            return False
        in_doubt = outcome.status == "COMPLETED"

        def send() -> None:
            self._orchestrator.report(snapshot, outcome, worker_id=worker_id)

        if lease is not None and outcome.status == "COMPLETED":
            # Done with the branch: leave the grant now, so that the next publication need
            # not wait for Conductor's answer, and send COMPLETED inside the report window
            # this opens (a re-delivery of the task id waits the window out before it
            # publishes; docs/protocol.md); a window that closes first is followed by
            # another, under the lease taken again and the attempt fence re-run.
            http = self._settings.http_timeout.total_seconds()
            send = in_report_windows(
                lease,
                lambda budget: self._orchestrator.report(
                    snapshot, outcome, worker_id=worker_id, timeout=min(budget, http)
                ),
                again=lambda member: self._report_again(snapshot, member),
                leave=lambda member: self._leave_for_report(snapshot, member),
                before_send=lambda: steps.reached(Boundary.BEFORE_REPORT, snapshot),
            )
            lease = None
        try:
            try:
                landed = updates.report(outcome.status, send)
            except ReportWindowClosedError as e:
                # A re-delivery of this task id may be publishing now: whatever this
                # delivery published, its COMPLETED might contradict the branch. FAILED,
                # unless that delivery is live: then nothing (one rule, ``_delivered_again``).
                log.warning("guarded_report_refused", error=e.message, **fields)
                fields["status"] = "FAILED"
                if self._delivered_again(snapshot, fields):
                    return in_doubt
                metrics.REPORT_PROBLEMS.labels("report_window_closed").inc()
                failed = Outcome(
                    "FAILED",
                    reason=f"{e.message}; the retry decides from the branch",
                )
                landed = updates.report(
                    "FAILED",
                    lambda: self._orchestrator.report(snapshot, failed, worker_id=worker_id),
                )
        except PeragoError as e:
            # Conductor times the attempt out and retries it; the retry decides from HEAD.
            metrics.REPORT_PROBLEMS.labels("report_failed").inc()
            log.error("report_failed", error=e.message, **fields)
            return in_doubt
        except Exception as e:  # noqa: BLE001 - logged and counted, never silent
            metrics.REPORT_PROBLEMS.labels("report_crashed").inc()
            log.error("report_failed", error=describe(e), traceback=bounded_traceback(e), **fields)
            return in_doubt
        finally:
            if lease is not None:  # a publication that did not complete
                with structlog.contextvars.bound_contextvars(task_id=snapshot.task_id):
                    release_lease(lease, wait=True)
        if landed is Landing.LANDED:
            log.info("attempt_reported", **fields)
            return in_doubt and fields["status"] != "COMPLETED"
        metrics.REPORT_PROBLEMS.labels(f"report_{landed.value}").inc()
        log.warning("report_not_shown", landing=landed.value, **fields)
        return in_doubt

    def _leave_for_report(self, snapshot: TaskSnapshot, member: GroupMember) -> None:
        with structlog.contextvars.bound_contextvars(task_id=snapshot.task_id):
            release_lease(member, wait=True)  # killed after its report: nothing held

    def _report_again(self, snapshot: TaskSnapshot, member: GroupMember) -> GroupMember | None:
        """After a report window closed: None if Conductor shows the task COMPLETED (the
        report landed late); else the branch lease taken again, under which the attempt
        fence passed (ReportWindowClosedError if either fails: the delivery may no longer
        report COMPLETED)."""
        fields = {"task_id": snapshot.task_id, "retry_count": snapshot.retry_count}

        def closed(why: str) -> ReportWindowClosedError:
            return ReportWindowClosedError(
                f"the report window closed before Conductor took the COMPLETED report, and {why}"
            )

        moved_on = "the task is no longer this delivery's ({})"
        try:
            now = self._orchestrator.get_task(snapshot.task_id)
            if now is not None and now.status == "COMPLETED":
                log.info("report_landed_late", **fields)
                return None
            check_current(now, member.me, worker_id=self._settings.worker_id)
            taken = member.again()
        except AttemptFenceError as e:
            raise closed(moved_on.format(e.message)) from e
        except PeragoError as e:
            raise closed(
                f"the branch lease could not be taken again for another ({e.message}): if "
                "Conductor is down or slow, check its health"
            ) from e
        try:
            taken.fence(
                lambda: check_attempt(
                    self._orchestrator, taken.me, worker_id=self._settings.worker_id
                )
            )
        except PeragoError as e:
            self._leave_for_report(snapshot, taken)
            raise closed(moved_on.format(e.message)) from e
        metrics.REPORT_PROBLEMS.labels("report_window_reopened").inc()
        log.info("report_window_reopened", fencing_token=taken.token, **fields)
        return taken

    def _delivered_again(self, snapshot: TaskSnapshot, fields: dict[str, Any]) -> bool:
        """The one rule for a superseded delivery: it sends no FAILED (after a failed
        attempt, or after its lease was lost before a COMPLETED) when Conductor delivered
        the task id again to a delivery still running it (``report.delivered_again``): that
        FAILED would end the task under the live delivery and spend a retry.

        Conductor 3.32.3's sweeper re-queues a task it reads as SCHEDULED while a poll has
        just taken it (``WorkflowSweeper.sweep``), so a wide fan-out sees such deliveries.
        A report skipped is what a worker that died before reporting leaves, which both
        models explore after every step. Counted as ``report_skipped_delivered_again``
        (``report_superseded`` is a report sent that Conductor then showed as another's).
        """
        try:
            now = self._orchestrator.get_task(snapshot.task_id)
        except PeragoError:
            return False  # report as usual
        if not delivered_again(now, snapshot):
            return False
        assert now is not None
        # its end (once no COMPLETED of it can land) is recorded for that delivery's wait
        self._deliveries.superseded(snapshot.task_id, snapshot.poll_count)
        metrics.REPORT_PROBLEMS.labels("report_skipped_delivered_again").inc()
        log.warning(
            "report_skipped_delivered_again",
            poll_count=snapshot.poll_count,
            live_poll_count=now.poll_count,
            live_worker=now.worker_id,
            **fields,
        )
        return True

    # -- drain ----------------------------------------------------------------------------------

    def _drain(self) -> None:
        grace = self._settings.shutdown_grace.total_seconds()
        deadline = time.monotonic() + grace
        with self._lock:
            if self._inflight:
                log.info("draining", in_flight=len(self._inflight), grace_seconds=grace)
            for item in self._inflight.values():  # bodies that check perago.cancelled() stop
                item.control.cancel("the worker is draining (shutdown)")
            while self._inflight and not self._force.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(timeout=min(left, 0.5))
            remaining = list(self._inflight.values())
        if remaining and self._spark is not None:
            # A Spark job blocks in the JVM where no Python exception can reach it: interrupt
            # the remaining attempts' jobs (by their tags), not other attempts'.
            interrupt = getattr(self._spark, "interrupt", None)
            if interrupt is not None:
                interrupt([item.snapshot.task_id for item in remaining])
        for item in remaining:
            log.warning("interrupting_attempt", task_id=item.snapshot.task_id)
            item.interrupt()
        end = time.monotonic() + 15
        with self._lock:
            while self._inflight and (left := end - time.monotonic()) > 0:
                self._lock.wait(timeout=min(left, 0.5))


#: Share of the response timeout without a successful extension after which the body is
#: asked to stop: Conductor is about to time the attempt out and retry it.
LOSING_TIMEOUT_SHARE = 0.8


class _Extension:
    """One attempt's response-timeout extensions, one at a time (:meth:`once`)."""

    def __init__(self, worker: Worker, delivery: _Delivery) -> None:
        self._worker, self._delivery = worker, delivery
        self.timeout = delivery.snapshot.response_timeout_seconds
        interval = worker._settings.extension_interval
        every = interval.total_seconds() if interval else max(1.0, self.timeout / 3)
        #: Seconds between extensions (0: the task has no response timeout to extend).
        self.every = every if self.timeout > 0 else 0.0
        self._extended = time.monotonic()

    def once(self) -> bool:
        """Extend and read the task back; False once there is nothing more to extend."""
        snapshot, control = self._delivery.snapshot, self._delivery.control
        try:
            if not self._delivery.updates.extend():
                return False
            self._extended = time.monotonic()
            metrics.TIMEOUT_EXTENSIONS.labels("ok").inc()
            log.debug("response_timeout_extended", task_id=snapshot.task_id)
            now = self._worker._orchestrator.get_task(snapshot.task_id)
        except PeragoError as e:
            metrics.TIMEOUT_EXTENSIONS.labels("failed").inc()
            log.warning(
                "response_timeout_extension_failed", task_id=snapshot.task_id, error=e.message
            )
            silent = time.monotonic() - self._extended
            if silent > self.timeout * LOSING_TIMEOUT_SHARE:
                control.cancel(
                    f"no response-timeout extension reached Conductor for {silent:.0f} of "
                    f"{self.timeout:.0f} s; Conductor will retry the task"
                )
            return True
        if self._delivery.stop_extending.is_set():
            return False
        lost = _no_longer_ours(snapshot, now)
        if lost:
            control.cancel(lost)
            return False
        return True


def _check_isolation(tasks: Sequence[TaskDefinition[Any, Any]], settings: Settings) -> None:
    """Refuse serializable tasks without branch leases: the read-set check and the merge
    after it are atomic only under the lease (the expected-head hook would make the merge
    a compare-and-swap, but a worker cannot know that lakeFS runs it)."""
    if settings.coord_backend != "none":
        return
    serializable = sorted(t.name for t in tasks if t.workspace.isolation == "serializable")
    if serializable:
        raise ConfigError(
            f"task(s) {', '.join(serializable)} declare WorkspaceSpec(isolation="
            '"serializable"), but PERAGO_COORD_BACKEND=none publishes without branch leases, '
            "so an input could change between the read-set check and the merge. Set "
            "PERAGO_COORD_BACKEND to a lease backend (lakefs, the default; s3, dynamodb, "
            'put_and_verify) or declare isolation="snapshot"'
        )


def _flush_telemetry(seconds: float = 5.0) -> None:
    """Send the spans and lineage events still buffered, both at once, for at most
    ``seconds``: a collector that is down must not hold up the worker's exit."""
    flushes = [
        threading.Thread(target=f, args=(seconds,), daemon=True)
        for f in (tracing.shutdown, lineage_events.shutdown)
    ]
    for t in flushes:
        t.start()
    for t in flushes:
        t.join(seconds + 1)


def _crashed(snapshot: TaskSnapshot, e: Exception) -> Finished:
    """The outcome of a runner that raised (a bug): FAILED, so Conductor retries."""
    log.error(
        "attempt_crashed",
        workflow_id=snapshot.workflow_id,
        task_id=snapshot.task_id,
        error=describe(e),
        traceback=bounded_traceback(e),
    )
    metrics.REPORT_PROBLEMS.labels("runner_crashed").inc()
    return Finished(
        outcome_of(
            e,
            where="internal error in the worker",
            advice="report it to the Perago maintainers (Conductor retries the task)",
        )
    )


def _interrupted(delivery: _Delivery, e: Interrupt) -> None:
    """The drain interrupted the attempt in its report (or after it): without a report
    Conductor times the attempt out and retries it; the retry decides from HEAD."""
    snapshot = delivery.snapshot
    metrics.REPORT_PROBLEMS.labels("interrupted").inc()
    log.warning(
        "attempt_interrupted",
        reported=delivery.control.phase is Phase.AFTER_REPORT,
        workflow_id=snapshot.workflow_id,
        task_id=snapshot.task_id,
        retry_count=snapshot.retry_count,
        step=_phase(delivery),
        interrupt=type(e).__name__,
    )


def _phase(delivery: _Delivery) -> str:
    """Where the delivery is, for logs ("start" before the runner began)."""
    return str(delivery.control.phase or Phase.START)


def _no_longer_ours(delivery: TaskSnapshot, now: TaskSnapshot | None) -> str:
    """Why Conductor no longer counts on this delivery ("" while it does)."""
    if now is None:
        return "Conductor no longer knows the task (its workflow was removed)"
    if now.status != "IN_PROGRESS":
        return f"Conductor ended the task ({now.status}): the workflow was terminated or timed out"
    if now.poll_count != delivery.poll_count:
        return "the task was delivered to a worker again"
    return ""


def _raise_in_thread(ident: int, exc: type[BaseException]) -> None:
    """Deliver ``exc`` in another thread at its next Python instruction."""
    if ident:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc))
