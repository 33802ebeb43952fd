"""Which attempt is running, for task bodies that want to log or name things by it, and
the two ways a body and its worker talk while it runs: cancellation and progress notes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perago.errors import NoAttemptError

if TYPE_CHECKING:  # `import perago` loads the task API alone (tests/unit/test_boundaries.py)
    from perago.telemetry.steps import Phase

__all__ = [
    "AttemptControl",
    "AttemptInfo",
    "attempt_context",
    "cancelled",
    "info",
    "progress",
    "wait_cancelled",
    "wait_cancelled_async",
]

#: A progress note is cut to this many characters (it travels in every extension).
PROGRESS_CHARS = 1000


@dataclass(frozen=True)
class AttemptInfo:
    workflow_id: str
    task_id: str
    task_type: str
    reference_name: str
    retry_count: int
    poll_count: int
    repository: str
    branch: str
    input_ref: str
    #: Which try of the body this is inside the attempt (0: the first; ``@task(body_retries)``).
    body_try: int = 0


class AttemptControl:
    """Between a running body and its worker: the worker cancels (draining, the task lost
    or about to be), the body notes its progress (sent with the next timeout extension)."""

    def __init__(self, on_body_end: Callable[[], None] | None = None) -> None:
        self._cancelled = threading.Event()
        self._on_body_end = on_body_end
        #: The body returned or raised: what is left (publication, report) is I/O, and the
        #: worker no longer counts the attempt against its concurrency (``end_body``).
        self.body_ended = False
        self._lock = threading.Lock()
        self.reason = ""
        self._note: str | None = None
        self._on_cancel: list[Callable[[], None]] = []
        #: The body saw the cancellation (it may have stopped half way): publish nothing.
        self.observed = False
        #: Where the delivery is, from its poll to its report: the runner's phases, then the
        #: worker's (report, after report); None before the runner starts. Failure messages
        #: and interrupt logs name it.
        self.phase: Phase | None = None

    def cancel(self, reason: str) -> None:
        """Ask the body to stop; the first reason stays."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self.reason = reason
            self._cancelled.set()
            callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()
        _log().warning("attempt_cancelling", reason=reason)

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (from any thread) once the attempt is cancelled, right away if
        it is; returns what forgets it."""
        with self._lock:
            if not self._cancelled.is_set():
                self._on_cancel.append(callback)
                return lambda: self._forget(callback)
        callback()
        return lambda: None

    def _forget(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._on_cancel:
                self._on_cancel.remove(callback)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def wait(self, seconds: float) -> bool:
        return self._cancelled.wait(seconds)

    def end_body(self) -> None:
        """The body is over: tell the worker once, so it may poll for the next body."""
        with self._lock:
            if self.body_ended:
                return
            self.body_ended = True
        if self._on_body_end is not None:
            self._on_body_end()

    def note(self, text: str) -> None:
        with self._lock:
            self._note = text[:PROGRESS_CHARS]

    def take_note(self) -> str | None:
        """The newest note not sent yet (None if there is none)."""
        with self._lock:
            note, self._note = self._note, None
            return note


def _log() -> Any:
    """structlog, imported on first use: ``import perago`` stays light for task modules."""
    import structlog

    return structlog.get_logger("perago.task")


_current: ContextVar[AttemptInfo | None] = ContextVar("perago_attempt", default=None)
_control: ContextVar[AttemptControl | None] = ContextVar("perago_control", default=None)


@contextmanager
def attempt_context(
    current: AttemptInfo, control: AttemptControl | None = None
) -> Iterator[AttemptInfo]:
    """Make ``current`` what :func:`info` returns in this context (the runner, and
    ``perago.testing.TaskEnvironment`` for tests of task functions), and ``control`` what
    :func:`cancelled` and :func:`progress` use."""
    token = _current.set(current)
    control_token = _control.set(control)
    try:
        yield current
    finally:
        _control.reset(control_token)
        _current.reset(token)


def cancelled() -> bool:
    """True once the worker asks the running body to stop: it is draining (SIGTERM), or
    Conductor no longer counts on this attempt (the workflow was terminated, the task timed
    out, or its response timeout is about to run out). Stop soon: return or raise; nothing
    of a cancelled attempt is published, and Conductor retries it where that applies. A
    body that does not stop is interrupted when the worker's shutdown grace ends. Always
    False outside an attempt. A body that never asks is left to finish and publish within
    the grace, as before."""
    control = _control.get()
    if control is None or not control.cancelled:
        return False
    control.observed = True
    return True


def wait_cancelled(seconds: float) -> bool:
    """Sleep up to ``seconds``, waking as soon as the attempt is cancelled; returns
    :func:`cancelled`. Use it instead of ``time.sleep`` in a body's loop."""
    control = _control.get()
    if control is None:
        threading.Event().wait(seconds)
        return False
    if control.wait(seconds):
        control.observed = True
        return True
    return False


async def wait_cancelled_async(seconds: float) -> bool:
    """:func:`wait_cancelled` for ``async def`` bodies: awaits up to ``seconds`` without
    holding a thread, waking as soon as the attempt is cancelled; returns
    :func:`cancelled`. Use it instead of ``asyncio.sleep`` in an async body's loop."""
    import asyncio  # here: ``import perago`` stays light for task modules

    control = _control.get()
    if control is None:
        await asyncio.sleep(seconds)
        return False
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def settle() -> None:
        if not woken.done():
            woken.set_result(True)

    def wake() -> None:
        loop.call_soon_threadsafe(settle)

    forget = control.on_cancel(wake)
    try:
        await asyncio.wait_for(woken, seconds)
    except TimeoutError:
        return False
    finally:
        forget()
    control.observed = True
    return True


def progress(message: str) -> None:
    """Note how far the body got (e.g. ``"3 of 10 files"``): logged now, and sent to
    Conductor with the attempt's next response-timeout extension, as a line
    ``progress: ...`` of the task's execution log (the UI's Logs tab,
    ``GET /api/tasks/{taskId}/log``). Only the newest note is sent; at most 1,000
    characters. Outside an attempt it is only logged."""
    text = str(message)[:PROGRESS_CHARS]
    _log().info("attempt_progress", progress=text)
    control = _control.get()
    if control is not None:
        control.note(text)


def info() -> AttemptInfo:
    """The running attempt; :class:`~perago.errors.NoAttemptError` (a ``LookupError``)
    outside one."""
    current = _current.get()
    if current is None:
        raise NoAttemptError(
            "perago.info() is only available while Perago runs the task: to call a task "
            "function in a test, use perago.testing.run_task(task, tmp_path, params) (or "
            "TaskEnvironment), which sets it"
        )
    return current
