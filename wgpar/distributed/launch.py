"""Launching SPMD work: one persistent worker thread per rank, and ``run_spmd``.

SPMD (single program, multiple data): the same function runs on every rank,
written against that rank's ProcessGroup (its rank, its device, its
collectives), so it runs unchanged as threads of one process or as processes
under MPI. With threads, ``RankWorkers.run`` hands rank r's function to
thread r (persistent, so thread-local autograd tapes stay put) and waits for
all of them. If a rank raises, the group is aborted at once, so ranks blocked
in a collective raise too instead of waiting for their timeout; ``run`` then
raises a RankError naming the first failing rank.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .backends.threads import ThreadGroup
from .errors import CollectiveError, RankError

BACKENDS = ("threads",)


class RankWorkers:
    def __init__(self, group: ThreadGroup, name: str = "wgpar-rank") -> None:
        self.group = group
        self._inboxes: list[queue.Queue] = []
        self._threads: list[threading.Thread] = []
        for r in range(group.world_size):
            inbox: queue.Queue = queue.Queue()
            t = threading.Thread(target=self._loop, args=(inbox,), name=f"{name}{r}", daemon=True)
            t.start()
            self._inboxes.append(inbox)
            self._threads.append(t)

    @staticmethod
    def _loop(inbox: queue.Queue) -> None:
        while True:
            item = inbox.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller of run()
                box["error"] = exc
            done.set()
            # An idle worker must not keep the last task's result or error (its traceback holds the task's
            # tensors: a failed step's whole graph) alive until the next task.
            del fn, box, done, item

    def run(self, fns: Sequence[Callable[[], Any]], timeout: float | None = None) -> list[Any]:
        """Run ``fns[r]`` on rank r's thread; return their results in rank order."""
        n = self.group.world_size
        if len(fns) != n:
            raise ValueError(f"run needs {n} functions (one per rank), got {len(fns)}")
        boxes = [{} for _ in range(n)]
        dones = [threading.Event() for _ in range(n)]
        for r in range(n):
            self._inboxes[r].put((fns[r], boxes[r], dones[r]))
        # A rank stuck in GPU work past every collective timeout is reported, not waited on forever.
        limit = timeout if timeout is not None else self.group.timeout * 2 + 60
        first_error: tuple[int, BaseException] | None = None
        pending = set(range(n))
        while pending:
            for r in sorted(pending):
                if dones[r].wait(0.01):
                    pending.discard(r)
                    err = boxes[r].get("error")
                    if err is not None:
                        if first_error is None or (isinstance(first_error[1], CollectiveError)
                                                   and not isinstance(err, CollectiveError)):
                            first_error = (r, err)
                        self.group.abort(r, f"{type(err).__name__}: {err}")
            limit -= 0.01 * max(1, len(pending))
            if limit <= 0 and pending:
                self.group.abort(min(pending), "did not finish its work")
                raise RankError(min(pending), TimeoutError(f"rank(s) {sorted(pending)} did not finish"))
        if first_error is not None:
            r, err = first_error
            raise RankError(r, err) from err
        return [b.get("value") for b in boxes]

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        for t in self._threads:
            t.join(5)


def run_spmd(fn: Callable[..., Any], world_size: int | None = None, *, devices: Sequence | None = None,
             backend: str = "threads", timeout: float | None = None, args: Sequence = ()) -> list[Any]:
    """Run ``fn(group, *args)`` on every rank and return the results in rank order.

    Arguments:
        fn: the per-rank program; ``group`` is that rank's ProcessGroup (``group.rank``,
            ``group.device``, the collectives).
        world_size: number of ranks (``wgpar.devices(world_size)``; default: every adapter).
        devices: explicit devices (or indices) instead of ``world_size``.
        backend: "threads" (one thread per rank in this process).
        timeout: seconds every collective wait may take (default 300).
    If a rank raises, every rank stops within the timeout and RankError names the rank.
    """
    if backend not in BACKENDS:
        raise ValueError(f"run_spmd: unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    from .context import MultiAdapterContext

    kw = {} if timeout is None else {"timeout": timeout}
    with MultiAdapterContext(world_size, devices=devices, **kw) as ctx:
        return ctx.run(lambda r: fn(ctx.comm(r), *args))
