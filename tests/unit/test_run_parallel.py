"""perago.core.parallel.run_parallel: every item once; a failure, or the drain's exception in the
calling thread, starts nothing more.

No timing: the items that are not meant to finish block on a gate that opens only once
``run_parallel`` has cancelled what had not started (``_GatedPool``), so how many items ran
is decided by the pool's threads alone.
"""

from __future__ import annotations

import ctypes
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from perago.core import parallel
from perago.core.parallel import run_parallel
from perago.errors import WorkerShutdown


class _GatedPool(ThreadPoolExecutor):
    """The real pool; its shutdown opens ``gate`` after cancelling what has not started."""

    gate = threading.Event()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=cancel_futures)
        _GatedPool.gate.set()
        super().shutdown(wait=wait)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    _GatedPool.gate = threading.Event()
    monkeypatch.setattr(parallel, "ThreadPoolExecutor", _GatedPool)
    return _GatedPool.gate


def test_every_item_runs_once_on_at_most_parallelism_threads() -> None:
    seen: list[int] = []
    names: set[str] = set()

    def fn(item: int) -> None:
        seen.append(item)
        names.add(threading.current_thread().name)

    run_parallel(range(500), fn, parallelism=3)
    assert sorted(seen) == list(range(500))
    assert 1 <= len(names) <= 3


def test_the_first_failure_stops_the_rest_and_is_raised(gate: threading.Event) -> None:
    started: list[int] = []

    def fn(item: int) -> None:
        started.append(item)
        if item == 0:
            raise ValueError("item 0")
        assert gate.wait(10), "run_parallel never cancelled the rest"

    with pytest.raises(ValueError, match="item 0"):
        run_parallel(list(range(500)), fn, parallelism=4)
    # Item 0, and at most the items the 3 other lanes took before its failure stopped them
    # (each then waits on the gate, so none takes a second one).
    assert 0 in started and set(started) <= {0, 1, 2, 3} and len(started) == len(set(started))


def test_the_drains_exception_in_the_waiting_thread_cancels_what_has_not_started(
    gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's drain raises WorkerShutdown in an attempt's thread (ctypes) while every
    # transfer thread is busy: the waiting thread must see it without waiting for them.
    started: list[int] = []
    busy = threading.Semaphore(0)
    caught: list[BaseException] = []
    looked: list[float] = []
    sleep = time.sleep

    def look(seconds: float) -> None:
        looked.append(seconds)  # atomic: the waiting thread takes no lock while it waits
        sleep(seconds)

    monkeypatch.setattr(parallel, "time", types.SimpleNamespace(sleep=look))

    def fn(item: int) -> None:
        started.append(item)
        busy.release()
        assert gate.wait(10), "run_parallel never cancelled the rest"

    def attempt() -> None:
        try:
            run_parallel(list(range(300)), fn, parallelism=2)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            caught.append(e)

    t = threading.Thread(target=attempt)
    t.start()
    for _ in range(2):
        assert busy.acquire(timeout=10)  # both threads are inside an item
    while not looked:  # and the calling thread is waiting for them, not starting them
        sleep(0.001)
    assert t.ident is not None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(t.ident), ctypes.py_object(WorkerShutdown)
    )
    t.join(10)
    assert not t.is_alive()
    assert [type(e) for e in caught] == [WorkerShutdown]
    assert sorted(started) == [0, 1]  # nothing started after the interrupt, nothing after return
