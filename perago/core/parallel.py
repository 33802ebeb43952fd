"""A thread pool for blocking transfers that the worker's drain can still interrupt."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["run_parallel"]

T = TypeVar("T")
#: The calling thread looks at its lanes after 1 ms, then twice as long each time, up to this.
_LOOK_SECONDS = 0.05
#: What the lanes' iterator gives once it has no item left.
_END = object()


class _Lanes(Generic[T]):
    """``parallelism`` lanes taking items from one iterator until it ends or ``stop``."""

    def __init__(self, items: Iterable[T], fn: Callable[[T], None]) -> None:
        self._items = iter(items)
        self._fn = fn
        self._take = threading.Lock()
        self.stop = False
        #: One entry per lane that has ended (a list: ``append`` is atomic, ``+= 1`` is not).
        self.ended: list[None] = []
        self.failures: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.stop:
                with self._take:
                    item = next(self._items, _END)
                if item is _END:
                    return
                self._fn(item)  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - raised again in the calling thread
            self.stop = True
            self.failures.append(e)
        finally:
            self.ended.append(None)


def run_parallel(items: Iterable[T], fn: Callable[[T], None], *, parallelism: int) -> None:
    """Run ``fn`` over ``items`` on ``parallelism`` threads; the first failure stops the rest.

    Whatever ends the wait (a failure, or the drain interrupting this thread) starts no
    further item, and returns once the running ones have ended. The drain's exception is
    asynchronous (``PyThreadState_SetAsyncExc``) and reaches this thread only while it runs
    Python, so the wait is ``time.sleep`` in short steps and plain reads, never a lock or a
    condition: an exception landing inside ``threading``'s own lock handling would leave a
    lock released twice (a RuntimeError in place of the drain's ``WorkerShutdown``).
    """
    if parallelism < 1:
        raise ValueError(f"run_parallel needs parallelism >= 1, not {parallelism}")
    todo = list(items)
    count = min(parallelism, len(todo))
    if count == 0:
        return
    lanes = _Lanes(todo, fn)
    pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="perago-xfer")
    look = 0.001
    try:
        for _ in range(count):
            pool.submit(lanes.run)
        while len(lanes.ended) < count and not lanes.failures:
            time.sleep(look)
            look = min(2 * look, _LOOK_SECONDS)
    finally:
        lanes.stop = True
        pool.shutdown(wait=True, cancel_futures=True)
    if lanes.failures:
        raise lanes.failures[0]
