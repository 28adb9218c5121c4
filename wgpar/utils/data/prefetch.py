"""The background thread that prepares batches ahead of the training loop, with a bounded look-ahead."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_POLL = 0.05  # seconds between checks of the stop flag in the background thread's waits
_DONE = object()
_log = logging.getLogger("wgpar")


class _Failed:
    """The background thread's exception, handed to the consumer to raise."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _work(load: Callable[[int, Any], Any], items: Iterator, results: queue.SimpleQueue,
          slots: threading.Semaphore, stop: threading.Event) -> None:
    """The thread's loop. It holds no reference to the Prefetcher, so a dropped iterator can be collected
    (and its finaliser stop this thread)."""
    try:
        for k, item in enumerate(items):
            while not slots.acquire(timeout=_POLL):  # at most `depth` results ahead of the consumer
                if stop.is_set():
                    return
            if stop.is_set():
                return
            results.put(load(k, item))
        results.put(_DONE)
    except BaseException as exc:  # handed over, never lost: the consumer raises it
        results.put(_Failed(exc))


class Prefetcher:
    """Runs ``load(k, item)`` for the items of ``items`` in order on one background thread, at most
    ``depth`` results ahead of the consumer; iterating yields the results in order.

    An exception in ``load`` (or in ``items``) ends the thread and is raised by the next ``next()``.
    ``close()`` (also on leaving a ``with`` block) stops the thread and joins it: a batch being
    loaded is finished first. Every wait has a timeout: the consumer's for a result (``timeout``, then
    TimeoutError), the thread's for a free slot (it polls the stop flag).

    Arguments:
        load: called on the background thread with the item's position and the item.
        items: an iterator, consumed on the background thread.
        depth: results prepared ahead of the one the consumer holds (>= 1).
        timeout: seconds the consumer waits for one result, and ``close`` for the thread.
        name: the thread's name.
    """

    def __init__(self, load: Callable[[int, Any], Any], items: Iterator, depth: int, timeout: float,
                 name: str = "wgpar-prefetch") -> None:
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._slots = threading.Semaphore(depth)
        self._timeout = timeout
        self._taken = 0
        self._finished = False
        self.thread = threading.Thread(target=_work, args=(load, items, self._results, self._slots, self._stop),
                                       name=name, daemon=True)
        self.thread.start()

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                item = self._results.get(timeout=_POLL)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self._results.empty():
                    self._finished = True
                    raise RuntimeError(f"{self.thread.name}: the background thread ended without a result "
                                       f"for item {self._taken}") from None
                if time.monotonic() > deadline:
                    self.close(wait=False)
                    raise TimeoutError(f"{self.thread.name}: item {self._taken} was not ready after "
                                       f"{self._timeout:g} s (the background thread is still loading it: a slow "
                                       "or stuck dataset?); pass a larger timeout= if that is expected") from None
        if item is _DONE:
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failed):
            self._finished = True
            self.close()
            raise item.exc
        self._taken += 1
        self._slots.release()
        return item

    def close(self, wait: bool = True) -> None:
        """Stop the background thread; with ``wait``, join it (up to the timeout). Safe to call twice."""
        self._finished = True
        self._stop.set()
        if wait and self.thread is not threading.current_thread():
            self.thread.join(self._timeout)
            if self.thread.is_alive():
                _log.warning("%s: the background thread did not stop within %g s (still loading a batch)",
                             self.thread.name, self._timeout)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Prefetcher"]
