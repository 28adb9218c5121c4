"""The main process's side of DataLoader workers: start them, hand out batches of indices, take the
results back in order, notice dead or stuck workers, and shut them down.

Batch k of an epoch goes to worker ``k % num_workers``; at most ``prefetch_factor * num_workers``
batches are out (sent and not yet yielded). Every task and result carries an epoch number, so a
persistent pool reused after an epoch was left early drops the stale results of that epoch.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .worker import _INIT, WorkerError, worker_loop

_POLL = 0.05  # seconds between checks of the workers' health while waiting for a result
_JOIN = 5.0  # seconds a stopping worker gets before it is terminated
_log = logging.getLogger("wgpar")


def _preview(indices: Sequence[int], n: int = 8) -> str:
    shown = ", ".join(str(i) for i in list(indices)[:n])
    return f"[{shown}{', ...' if len(indices) > n else ''}]"


def _shutdown(done: Any, tasks: list, workers: list, results: Any) -> None:
    """Stop the workers (a finaliser: it holds no reference to the pool)."""
    done.set()
    for q in tasks:
        try:
            q.put(None)
        except (OSError, ValueError):  # already closed
            pass
    deadline = time.monotonic() + _JOIN
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    for i, w in enumerate(workers):
        if w.is_alive():
            _log.warning("wgpar DataLoader: worker %d (pid %s) did not stop within %g s; terminating it", i, w.pid,
                         _JOIN)
            w.terminate()
            w.join(_JOIN)
    for q in (*tasks, results):
        q.cancel_join_thread()
        q.close()


class WorkerPool:
    """``num_workers`` processes loading host batches for one DataLoader.

    Arguments:
        dataset, collate_fn, worker_init_fn: as the DataLoader's (pickled into each worker).
        num_workers: processes to start.
        base_seed: worker i seeds itself with ``base_seed + i``.
        context: the multiprocessing context that starts them.
        timeout: seconds to wait for one batch before raising TimeoutError.
    """

    def __init__(self, dataset: Any, collate_fn: Callable | None, worker_init_fn: Callable | None, num_workers: int,
                 base_seed: int, context: Any, timeout: float) -> None:
        self.num_workers = num_workers
        self.timeout = timeout
        self._epoch = 0
        self._results = context.Queue()
        self._done = context.Event()
        self._tasks: list = []
        self._workers: list = []
        self._finalizer = weakref.finalize(self, _shutdown, self._done, self._tasks, self._workers, self._results)
        try:
            for i in range(num_workers):
                q = context.Queue()
                w = context.Process(target=worker_loop, name=f"wgpar-DataLoader-worker-{i}", daemon=True,
                                    args=(dataset, collate_fn, worker_init_fn, i, num_workers, base_seed + i, q,
                                          self._results, self._done, os.getpid()))
                self._tasks.append(q)
                w.start()
                self._workers.append(w)
        except Exception as exc:
            self.close()
            if isinstance(exc, (pickle.PicklingError, AttributeError, TypeError)):
                method = context.get_start_method()
                exc.add_note(f"wgpar DataLoader: workers start with {method!r}, which pickles the dataset, "
                             "collate_fn and worker_init_fn: use module-level functions and classes (not lambdas "
                             "or local functions), or pass multiprocessing_context='fork'")
            raise

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [w.pid for w in self._workers]

    def close(self) -> None:
        """Stop and join the workers (terminating any that do not stop in time). Safe to call twice."""
        self._finalizer()

    def _check_alive(self, k: int) -> None:
        for i, w in enumerate(self._workers):
            if not w.is_alive():
                raise RuntimeError(f"wgpar DataLoader: worker {i} (pid {w.pid}) exited unexpectedly with exit code "
                                   f"{w.exitcode} while batch {k} was awaited (killed, out of memory, or os._exit "
                                   "in the dataset?)")

    def _get(self, k: int, owner: int) -> tuple:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return pickle.loads(self._results.get(timeout=_POLL))
            except queue.Empty:
                self._check_alive(k)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"wgpar DataLoader: batch {k} was not ready after {self.timeout:g} s (worker "
                                       f"{owner} is still loading it: a slow or stuck dataset?); pass a larger "
                                       "timeout= if that is expected") from None

    def epoch(self, batches: Iterator[Sequence[int]], prefetch_factor: int) -> Iterator[Any]:
        """The host batches of one epoch, in the order of ``batches``; a worker's error is raised here."""
        if not self._finalizer.alive:
            raise RuntimeError("wgpar DataLoader: the worker pool was shut down")
        self._epoch += 1
        epoch = self._epoch
        sent: dict[int, Sequence[int]] = {}  # batches sent and not yet yielded
        ready: dict[int, Any] = {}
        source = enumerate(batches)
        exhausted = False
        next_k = 0

        def send() -> None:
            nonlocal exhausted
            try:
                k, indices = next(source)
            except StopIteration:
                exhausted = True
                return
            self._tasks[k % self.num_workers].put((epoch, k, list(indices)))
            sent[k] = indices

        while not exhausted and len(sent) < prefetch_factor * self.num_workers:
            send()
        while sent:
            while next_k not in ready:
                e, k, payload = self._get(next_k, next_k % self.num_workers)
                if k == _INIT:
                    payload.reraise("while starting (seeding or worker_init_fn)")
                if e == epoch:
                    ready[k] = payload
            payload = ready.pop(next_k)
            indices = sent.pop(next_k)
            if isinstance(payload, WorkerError):
                payload.reraise(f"while loading batch {next_k} (dataset indices {_preview(indices)})")
            next_k += 1
            if not exhausted:
                send()
            yield payload


def resolve_context(context: Any) -> Any:
    """A multiprocessing context: the given one, one named by its start method, or 'spawn' (None)."""
    if context is None:
        return mp.get_context("spawn")
    if isinstance(context, str):
        if context not in mp.get_all_start_methods():
            raise ValueError(f"DataLoader: multiprocessing_context {context!r} is not one of this platform's start "
                             f"methods {mp.get_all_start_methods()}")
        return mp.get_context(context)
    if not hasattr(context, "Process"):
        raise TypeError(f"DataLoader: multiprocessing_context must be a start method name or a multiprocessing "
                        f"context, got {type(context).__name__}")
    return context


__all__ = ["WorkerPool", "resolve_context"]
