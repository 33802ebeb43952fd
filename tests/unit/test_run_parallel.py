"""perago.workspace.transfer.run_parallel: every item once; a failure, or the drain's
exception in the calling thread, starts nothing more."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

from perago.errors import WorkerShutdown
from perago.parallel import run_parallel


def test_every_item_runs_once_on_at_most_parallelism_threads() -> None:
    seen: list[int] = []
    names: set[str] = set()

    def fn(item: int) -> None:
        seen.append(item)
        names.add(threading.current_thread().name)

    run_parallel(range(500), fn, parallelism=3)
    assert sorted(seen) == list(range(500))
    assert 1 <= len(names) <= 3


def test_the_first_failure_stops_the_rest_and_is_raised() -> None:
    started: list[int] = []

    def fn(item: int) -> None:
        started.append(item)
        time.sleep(0.01)
        if item == 3:
            raise ValueError("item 3")

    with pytest.raises(ValueError, match="item 3"):
        run_parallel(list(range(500)), fn, parallelism=4)
    assert len(started) < 20  # the items after the failure were never started


def test_the_drains_exception_in_the_waiting_thread_cancels_what_has_not_started() -> None:
    # The worker's drain raises WorkerShutdown in an attempt's thread (ctypes); a thread
    # blocked in a plain wait would only see it once all 300 items (1.5 s) had run.
    started: list[int] = []
    caught: list[BaseException] = []

    def fn(item: int) -> None:
        started.append(item)
        time.sleep(0.01)

    def attempt() -> None:
        try:
            run_parallel(list(range(300)), fn, parallelism=2)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            caught.append(e)

    t = threading.Thread(target=attempt)
    t.start()
    time.sleep(0.1)
    assert t.ident is not None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(t.ident), ctypes.py_object(WorkerShutdown)
    )
    t.join(5)
    assert [type(e) for e in caught] == [WorkerShutdown]
    assert len(started) < 150
    count = len(started)
    time.sleep(0.1)
    assert len(started) == count  # nothing runs after run_parallel returned
