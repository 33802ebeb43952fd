"""A thread pool for blocking transfers that the worker's drain can still interrupt."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["run_parallel"]

T = TypeVar("T")


def run_parallel(items: Iterable[T], fn: Callable[[T], None], *, parallelism: int) -> None:
    """Run ``fn`` over ``items`` on a thread pool; the first failure cancels the rest.

    Whatever ends the wait (a failure, or the drain interrupting this thread) cancels the
    items not started yet, and returns once the running ones have ended. The wait wakes up
    every quarter second: the drain's exception reaches a thread only while it runs Python.
    """
    pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="perago-xfer")
    try:
        pending: set[Future[None]] = {pool.submit(fn, item) for item in items}
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_EXCEPTION)
            for f in done:
                f.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
