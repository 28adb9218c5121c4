"""MultiAdapterContext (rumus, the Rust framework wgpar follows: MultiGpuContext): the single-controller API.

One Python thread (the driver) holds the context and hands per-rank work to
the ranks' persistent threads with ``run``; each rank talks to the others
through its ProcessGroup, ``ctx.comm(rank)``. It is a thin layer over the
threaded backend and the launcher that ``run_spmd`` uses.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from ...runtime import adapters as _adapters
from ...runtime.device import Device
from ..backends.common import check_timeout
from ..backends.threads import RankWorkers, ThreadGroup, ThreadRank
from ..group import DEFAULT_TIMEOUT


class _Threads:
    """A context's rank threads (started at the first ``run``) and its group, closed once."""

    def __init__(self, group: ThreadGroup) -> None:
        self.group = group
        self._workers: RankWorkers | None = None

    def workers(self) -> RankWorkers:
        if self._workers is None:
            self._workers = RankWorkers(self.group)
        return self._workers

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        self.group.close()


class MultiAdapterContext:
    """Ranks 0..world_size-1, rank r on ``devices[r]``, with a threaded process group.

    Arguments:
        n: number of devices (``wgpar.devices(n)``: logical devices on shared adapters if needed).
        devices: explicit devices (or indices) instead of ``n``.
        timeout: seconds every collective wait may take before all ranks raise (positive).
    By default every physical adapter is used.
    """

    def __init__(self, n: int | None = None, devices: Sequence[Device | int] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        check_timeout(timeout)
        if devices is not None and n is not None and len(devices) != n:
            raise ValueError(f"MultiAdapterContext: n={n} but {len(devices)} devices given")
        devs = [_adapters.resolve(d) for d in devices] if devices is not None else _adapters.devices(n)
        self.devices: list[Device] = devs
        self.group = ThreadGroup(devs, timeout=timeout)
        self._threads = _Threads(self.group)
        # A context dropped without close() still ends its rank and communication threads (they refer to the
        # group, never to the context, so the context dies by reference counting).
        self._finalizer = weakref.finalize(self, self._threads.close)

    @property
    def world_size(self) -> int:
        """The number of ranks (devices)."""
        return len(self.devices)

    @property
    def timeout(self) -> float:
        """The collective timeout of the context's group, in seconds."""
        return self.group.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.group.timeout = seconds

    def rank_of(self, device: Device) -> int:
        """The rank that runs on ``device``; ValueError if it is not in the context.

        Arguments:
            device: a Device.
        """
        for r, d in enumerate(self.devices):
            if d is device:
                return r
        raise ValueError(f"{device} is not part of this context ({[str(d) for d in self.devices]})")

    def device_of(self, rank: int) -> Device:
        """The device of rank ``rank``; ValueError if out of range.

        Arguments:
            rank: a rank index.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for {self.world_size} ranks")
        return self.devices[rank]

    def comm(self, rank: int) -> ThreadRank:
        """Rank ``rank``'s ProcessGroup (use it from that rank's thread)."""
        return self.group.rank(rank)

    @property
    def workers(self) -> RankWorkers:
        """The ranks' worker threads."""
        return self._threads.workers()

    def run(self, fn, *per_rank_args, timeout: float | None = None) -> list:
        """Call ``fn(rank, *args_r)`` on every rank's own thread; results in rank order.

        Each of ``per_rank_args`` is a sequence with one entry per rank.
        """
        for i, a in enumerate(per_rank_args):
            if len(a) != self.world_size:
                raise ValueError(f"run: per-rank argument {i} has {len(a)} entries for {self.world_size} ranks")
        calls = []
        for r in range(self.world_size):
            args = [a[r] for a in per_rank_args]
            calls.append(lambda r=r, args=args: fn(r, *args))
        return self.workers.run(calls, timeout)

    def reset(self) -> None:
        """Clear a failed collective so the context can be used again."""
        self.group.reset()

    def close(self) -> None:
        """Stop the ranks' threads (also done when the context is garbage-collected)."""
        self._finalizer()

    def __enter__(self) -> MultiAdapterContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MultiAdapterContext(world_size={self.world_size}, devices={[str(d) for d in self.devices]})"
