"""Pieces every backend shares: the rank's communication thread, collective kinds, and the rules for
when a tensor can be copied to or from a host buffer in place."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ...tensor import Tensor
from ..group import Work


def check_timeout(timeout: float) -> float:
    t = float(timeout)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return t


def round4(n: int) -> int:
    return -(-n // 4) * 4


def byte_offset(t: Tensor) -> int:
    return t._offset * t.dtype.itemsize


def readable(t: Tensor) -> bool:
    """Copyable to staging as is: contiguous from a 4-aligned byte offset (bytes read past its end, up
    to the next multiple of 4, lie in its own buffer and are ignored)."""
    return t.is_contiguous() and byte_offset(t) % 4 == 0


def writable(t: Tensor) -> bool:
    """Committable in place: contiguous, 4-aligned, a whole number of 4-byte words (writes no neighbour)."""
    return t.is_contiguous() and byte_offset(t) % 4 == 0 and t.nbytes % 4 == 0


def kind_name(name: str, label: str | None) -> str:
    return f"{name}[{label}]" if label else name


class Progress:
    """A rank's communication thread: runs completions in call order, one at a time.

    Arguments:
        name: the thread's name.
        idle: called every ``idle_interval`` seconds while no completion is queued, as long as it
            returns True (the MPI backend drives its outstanding sends from here).
    """

    def __init__(self, name: str, idle: Callable[[], bool] | None = None, idle_interval: float = 0.001) -> None:
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._pending = 0
        self._idle_fn = idle
        self._idle_interval = idle_interval
        self._idle_busy = False

    def submit(self, work: Work, fn: Callable[[], Any]) -> None:
        with self._idle:
            self._pending += 1
            self._start()
        self._queue.put((work, fn))

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def _next(self):
        """The next queued item; () when ``idle`` asked to be called again and nothing came meanwhile."""
        if self._idle_busy:
            try:
                return self._queue.get(timeout=self._idle_interval)
            except queue.Empty:
                return ()
        return self._queue.get()

    def _loop(self) -> None:
        while True:
            item = self._next()
            if item is None:
                return
            if self._idle_fn is not None:
                self._idle_busy = self._idle_fn()
            if not item:
                continue
            work, fn = item
            try:
                work.set_result(fn())
            except BaseException as exc:  # handed to whoever waits on the Work
                work.set_error(exc)
            finally:
                del work, fn, item
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()
            if self._idle_fn is not None:
                self._idle_busy = self._idle_fn()

    @property
    def pending(self) -> int:
        return self._pending

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted completion has run; False if some still run after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(5)
            self._thread = None
