"""``async def`` task bodies: the event loop a worker awaits them on, and the drivers that
take an attempt's steps (``perago.worker.runtime.Steps``) to its body's coroutine and back.

:func:`drive` runs an async body on a fresh event loop in the calling thread (a worker
thread for a plain attempt, tests, the stub orchestrator). A worker with async tasks has one
:class:`AsyncBodies`: bodies are awaited on its loop thread, and the blocking steps around
them (materialise, diff, publish, report) run on a small thread pool, so fifty bodies that
await hold no thread between them. A body that blocks the loop is named in the log.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import inspect
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from perago.errors import Interrupt, WorkerShutdown
from perago.telemetry import metrics

__all__ = ["AsyncBodies", "AsyncBody", "Running", "drive"]

T = TypeVar("T")

log = structlog.get_logger("perago.worker.async")

#: The loop is reported blocked once it has not run for this long.
BLOCKED_SECONDS = 1.0


@dataclass(frozen=True)
class AsyncBody:
    """What an attempt's steps yield at an ``async def`` body: its coroutine, to await."""

    coroutine: Coroutine[Any, Any, Any]


def drive(steps: Generator[AsyncBody, Any, T]) -> T:
    """Run ``steps`` to their end in this thread, each async body on a fresh event loop."""
    try:
        request = next(steps)
        while True:
            try:
                value = asyncio.run(request.coroutine)
            except BaseException as e:  # noqa: BLE001 - the steps decide what it means
                request = steps.throw(e)
            else:
                request = steps.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class _Returned(Exception):
    """The steps returned (a StopIteration cannot travel through a future)."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class Running:
    """Where one async attempt runs now, for the drain to interrupt it: a step on a pool
    thread (an asynchronous exception, as for a thread attempt), or its body on the loop
    (the body's task is cancelled). The lock makes a step clear its thread only after a
    pending interruption reached it, never after it moved on to another attempt's step."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ident = 0
        self._body: asyncio.Task[Any] | None = None
        #: An interruption that found neither a step nor a body: the next one gets it.
        self._pending = False

    def interrupt(self) -> None:
        with self._lock:
            if self._ident:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._ident), ctypes.py_object(WorkerShutdown)
                )
            elif self._body is not None:
                self._loop.call_soon_threadsafe(self._body.cancel)
            else:
                self._pending = True

    @contextmanager
    def on_this_thread(self) -> Iterator[None]:
        with self._lock:
            if self._pending:
                self._pending = False
                raise WorkerShutdown()
            self._ident = threading.get_ident()
        try:
            yield
        finally:
            with self._lock:
                self._ident = 0

    @contextmanager
    def in_body(self, task: asyncio.Task[Any]) -> Iterator[None]:
        with self._lock:
            if self._pending:
                self._pending = False
                task.cancel()
            self._body = task
        try:
            yield
        finally:
            with self._lock:
                self._body = None


class AsyncBodies:
    """One event loop thread for a worker's async bodies, a pool for the steps around them
    and a pool for the attempts' small Conductor calls (timeout extensions)."""

    def __init__(self, *, step_threads: int, call_threads: int = 4) -> None:
        self.loop = asyncio.new_event_loop()
        self._steps = ThreadPoolExecutor(step_threads, thread_name_prefix="perago-step")
        self._calls = ThreadPoolExecutor(call_threads, thread_name_prefix="perago-call")
        self._tick = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perago-async-loop", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watch, name="perago-async-watch", daemon=True).start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._beat = self.loop.create_task(self._heartbeat())
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coroutine`` on the loop (from any thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the call pool: a short blocking request."""
        return await self.loop.run_in_executor(self._calls, fn, *args)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the step pool, out of the drain's reach (cleaning up)."""
        return await self.loop.run_in_executor(self._steps, fn, *args)

    async def step(self, running: Running, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the step pool, where the drain can interrupt it."""

        def on_thread() -> T:
            with running.on_this_thread():
                return fn(*args)

        return await self.loop.run_in_executor(self._steps, on_thread)

    async def drive(self, steps: Generator[AsyncBody, Any, T], running: Running, name: str) -> T:
        """Run ``steps`` to their end: each step on the pool, each body on the loop, all in
        one context (the attempt's log fields and ``perago.info()`` follow it around)."""
        context = contextvars.copy_context()

        def advance(send: Callable[[Any], AsyncBody], value: Any) -> AsyncBody:
            try:
                return context.run(send, value)
            except StopIteration as stop:
                raise _Returned(stop.value) from None

        send: Callable[[Any], AsyncBody] = steps.send
        value: Any = None
        while True:
            try:
                request = await self.step(running, advance, send, value)
            except _Returned as done:
                return done.value  # type: ignore[no-any-return]
            except Interrupt as e:  # between two steps: the steps decide what it means
                if inspect.getgeneratorstate(steps) == inspect.GEN_CLOSED:
                    raise
                send, value = steps.throw, e
                continue
            body = self.loop.create_task(request.coroutine, name=name, context=context)
            with running.in_body(body):
                try:
                    send, value = steps.send, await body
                except asyncio.CancelledError:  # the drain's last resort
                    send, value = steps.throw, WorkerShutdown()
                except BaseException as e:  # noqa: BLE001 - the steps decide what it means
                    send, value = steps.throw, e

    async def _heartbeat(self) -> None:
        while True:
            self._tick = time.monotonic()
            await asyncio.sleep(0.1)

    def _watch(self) -> None:
        """Name the code that keeps the loop from running (a blocking call in an async
        body: ``time.sleep``, a synchronous request, a CPU loop), once per blockage."""
        reported = 0.0
        while not self._stopped.wait(0.25):
            stalled = time.monotonic() - self._tick
            if stalled < BLOCKED_SECONDS:
                reported = 0.0
                continue
            if reported:
                continue
            reported = stalled
            frame = sys._current_frames().get(self._thread.ident or 0)
            task = asyncio.current_task(self.loop) if self._thread.is_alive() else None
            where = (
                f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
                if frame is not None
                else "unknown"
            )
            metrics.EVENT_LOOP_BLOCKED.inc()
            log.warning(
                "event_loop_blocked",
                seconds=round(stalled, 2),
                body=task.get_name() if task is not None else None,
                where=where,
                advice="an async body made a blocking call: every other async body waits; "
                "await an async library, or move the call to asyncio.to_thread(...)",
            )

    async def _finish(self) -> None:
        """Let what is left end (attempts closing after their report), then stop."""
        self._beat.cancel()
        others = asyncio.all_tasks() - {asyncio.current_task(), self._beat}
        if others:
            _, pending = await asyncio.wait(others, timeout=5)
            for t in pending:
                t.cancel()
        await asyncio.gather(self._beat, *others, return_exceptions=True)
        self.loop.stop()

    def close(self) -> None:
        """After the drain: every attempt reported (or was interrupted)."""
        self._stopped.set()
        asyncio.run_coroutine_threadsafe(self._finish(), self.loop)
        self._thread.join(timeout=15)
        if not self.loop.is_running():
            self.loop.close()
        self._steps.shutdown(wait=False, cancel_futures=True)
        self._calls.shutdown(wait=False, cancel_futures=True)
