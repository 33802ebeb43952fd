"""The steps of one attempt and the boundaries between them, as one vocabulary.

The runtime and the publisher announce each boundary they pass (:func:`reached`); whoever
cares observes it (:func:`observe`), as dramatiq's middleware does: the failpoints of the
crash tests (``perago.worker.failpoints``) and the metrics (``perago.telemetry.metrics``) register
themselves when imported. :class:`Phase` names where an attempt is, for failure messages
and logs ("... failed during stage").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

__all__ = ["Attempt", "Boundary", "Observer", "Phase", "observe", "reached"]


class Phase(StrEnum):
    """Where an attempt is (``RunningAttempt.step``)."""

    START = "start"
    #: An incremental task looks for an earlier publication to answer with.
    REUSE_CHECK = "reuse check"
    MATERIALIZE = "materialize"
    BODY = "task body"
    POST_GUARDRAIL = "post-guardrail"
    DIFF = "diff"
    STAGE = "stage"
    PUBLISH = "publish"
    #: The worker's part, after the run: sending the outcome, then cleaning up after it.
    REPORT = "report"
    AFTER_REPORT = "after report"


class Boundary(StrEnum):
    """A point between two protocol steps, in the order an attempt passes them (also the
    names ``PERAGO_FAILPOINTS`` takes)."""

    AFTER_MATERIALIZE = "after_materialize"
    AFTER_BODY = "after_body"
    AFTER_FENCE1 = "after_fence1"
    AFTER_LEASE = "after_lease"
    AFTER_STAGE = "after_stage"
    AFTER_FENCE2 = "after_fence2"
    AFTER_PUBLISH_FENCE = "after_publish_fence"
    BEFORE_RESET = "before_reset"
    AFTER_PUBLISH = "after_publish"
    BEFORE_REPORT = "before_report"
    AFTER_COMPLETE = "after_complete"


class Attempt(Protocol):
    """Which attempt reached a boundary: the delivery of a task (two deliveries of one task
    id differ in ``poll_count``). The publisher's ``AttemptIdentity`` and the orchestrator's
    ``TaskSnapshot`` both are one."""

    @property
    def workflow_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def retry_count(self) -> int: ...
    @property
    def poll_count(self) -> int: ...
    @property
    def task_type(self) -> str: ...


#: Called with each boundary an attempt reaches and that attempt (as dramatiq's middleware
#: gets the message), on the thread doing the step; may raise or block (a failpoint does),
#: which the attempt then sees as raised or blocked there.
Observer = Callable[[Boundary, Attempt], None]

_observers: list[Observer] = []
_lock = threading.Lock()


def observe(observer: Observer) -> Callable[[], None]:
    """Add ``observer`` (once); returns a function that removes it."""
    with _lock:
        if observer not in _observers:
            _observers.append(observer)

    def remove() -> None:
        with _lock:
            if observer in _observers:
                _observers.remove(observer)

    return remove


def reached(boundary: Boundary, attempt: Attempt) -> None:
    """Tell every observer, in registration order, that ``attempt`` reached ``boundary``."""
    for observer in tuple(_observers):
        observer(boundary, attempt)
