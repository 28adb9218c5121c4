"""MultiAdapterContext (rumus: MultiGpuContext): the devices a job uses and their process group."""

from __future__ import annotations

from collections.abc import Sequence

from ..runtime import adapters as _adapters
from ..runtime.device import Device
from .collectives import DEFAULT_TIMEOUT, ThreadGroup, ThreadRank
from .workers import RankWorkers


class MultiAdapterContext:
    """Ranks 0..world_size-1, rank r on ``devices[r]``, with a threaded process group.

    Arguments:
        n: number of devices (``wgpar.devices(n)``: logical devices on shared adapters if needed).
        devices: explicit devices (or indices) instead of ``n``.
        timeout: seconds every collective wait may take before all ranks raise.
    By default every physical adapter is used.
    """

    def __init__(self, n: int | None = None, devices: Sequence[Device | int] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        if devices is not None and n is not None and len(devices) != n:
            raise ValueError(f"MultiAdapterContext: n={n} but {len(devices)} devices given")
        devs = [_adapters.resolve(d) for d in devices] if devices is not None else _adapters.devices(n)
        self.devices: list[Device] = devs
        self.group = ThreadGroup(devs, timeout=timeout)
        self._workers: RankWorkers | None = None

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def timeout(self) -> float:
        return self.group.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.group.timeout = float(seconds)

    def rank_of(self, device: Device) -> int:
        for r, d in enumerate(self.devices):
            if d is device:
                return r
        raise ValueError(f"{device} is not part of this context ({[str(d) for d in self.devices]})")

    def device_of(self, rank: int) -> Device:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for {self.world_size} ranks")
        return self.devices[rank]

    def comm(self, rank: int) -> ThreadRank:
        """Rank ``rank``'s collectives handle (use it from that rank's thread)."""
        return self.group.rank(rank)

    @property
    def workers(self) -> RankWorkers:
        if self._workers is None:
            self._workers = RankWorkers(self.group)
        return self._workers

    def run(self, fn, *per_rank_args, timeout: float | None = None) -> list:
        """Call ``fn(rank, *args_r)`` on every rank's own thread; results in rank order."""
        calls = []
        for r in range(self.world_size):
            args = [a[r] for a in per_rank_args]
            calls.append(lambda r=r, args=args: fn(r, *args))
        return self.workers.run(calls, timeout)

    def reset(self) -> None:
        """Clear a failed collective so the context can be used again."""
        self.group.reset()

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __enter__(self) -> MultiAdapterContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MultiAdapterContext(world_size={self.world_size}, devices={[str(d) for d in self.devices]})"
