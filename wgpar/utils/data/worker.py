"""What runs inside a DataLoader worker process: seeding, ``worker_init_fn``, then fetch-and-collate
for each batch of indices the main process sends; and ``get_worker_info()``.

A worker never touches a device: it returns host batches (NumPy arrays, numbers, strings), pickled
by the worker itself so that a batch that cannot be pickled is reported as that batch's error.
"""

from __future__ import annotations

import os
import pickle
import queue
import random
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_POLL = 0.1  # seconds between a worker's checks of the stop event and of its parent
_INIT = -1  # the batch index of a result that reports a failure before the first batch


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a DataLoader worker (torch's fields).

    Attributes:
        id: this worker's index, 0 .. num_workers - 1.
        num_workers: the number of workers of the loader.
        seed: this worker's seed, the loader's base seed + id (``random``, NumPy's global generator and
            ``wgpar.manual_seed`` are seeded from it).
        dataset: this worker's copy of the dataset.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """Inside a DataLoader worker process, its ``WorkerInfo``; in the main process None.

    Use it in a dataset or ``worker_init_fn`` to split work between workers (an iterable source, a
    file per worker) or to seed per-worker augmentation, as with ``torch.utils.data.get_worker_info``.
    """
    return _info


class WorkerError:
    """An exception raised in a worker, carried to the main process and raised there by ``reraise``."""

    def __init__(self, exc: BaseException, worker_id: int, k: int) -> None:
        self.worker_id = worker_id
        self.k = k
        self.type_name = type(exc).__name__
        self.trace = "".join(traceback.format_exception(exc))
        try:  # the original exception when it survives pickling, so `except ValueError` still works
            self.payload = pickle.dumps(exc)
            pickle.loads(self.payload)
        except Exception:
            self.payload = None

    def reraise(self, where: str) -> None:
        exc = pickle.loads(self.payload) if self.payload is not None else RuntimeError(
            f"{self.type_name} (not picklable; its traceback follows)")
        exc.add_note(f"wgpar DataLoader: caught {self.type_name} in worker process {self.worker_id} {where}.\n"
                     f"Original traceback in the worker:\n{self.trace}")
        raise exc


def fetch(dataset: Any, collate_fn: Callable[[list], Any] | None, indices: Sequence[int]) -> Any:
    """One batch on the host: the dataset's ``get_batch`` without a ``collate_fn``, else the collated samples."""
    from .collate import default_collate

    get_batch = getattr(dataset, "get_batch", None)
    if collate_fn is None and get_batch is not None:
        return get_batch(indices)
    return (collate_fn or default_collate)([dataset[i] for i in indices])


def _seed(seed: int, worker_id: int) -> None:
    from ...creation import manual_seed

    random.seed(seed)
    np.random.seed(np.random.SeedSequence([worker_id, seed]).generate_state(4))
    manual_seed(seed)


def worker_loop(dataset: Any, collate_fn: Callable | None, worker_init_fn: Callable[[int], Any] | None,
                worker_id: int, num_workers: int, seed: int, tasks: Any, results: Any, done: Any,
                parent_pid: int) -> None:
    """The worker process: ``tasks`` brings ``(epoch, k, indices)`` (None: stop), ``results`` takes pickled
    ``(epoch, k, batch or WorkerError)``. It ends on None, on ``done``, or when its parent has died."""
    global _info
    try:
        _seed(seed, worker_id)
        _info = WorkerInfo(worker_id, num_workers, seed, dataset)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except Exception as exc:
        results.put(pickle.dumps((None, _INIT, WorkerError(exc, worker_id, _INIT))))
        return
    try:
        while not done.is_set():
            try:
                task = tasks.get(timeout=_POLL)
            except queue.Empty:
                if os.getppid() != parent_pid:  # orphaned: nobody will read the results
                    return
                continue
            if task is None:
                return
            epoch, k, indices = task
            try:
                out = pickle.dumps((epoch, k, fetch(dataset, collate_fn, indices)), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                out = pickle.dumps((epoch, k, WorkerError(exc, worker_id, k)))
            results.put(out)
    except KeyboardInterrupt:  # the main process handles Ctrl-C; the worker just ends
        return
    finally:
        if done.is_set():  # the main process stopped reading: do not block exiting on unread results
            results.cancel_join_thread()


__all__ = ["WorkerInfo", "get_worker_info"]
