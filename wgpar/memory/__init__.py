"""Per-device memory counts and cache control, shaped like torch.cuda's, and the memory timeline
(``record_history``, ``snapshot``, ``plot``: every allocation by category over time)."""

from __future__ import annotations

from ..runtime import adapters as _adapters
from ..runtime import memory_history as _hist
from .plot import plot
from .timeline import CATEGORIES, MemorySnapshot, Phase, Timeline, from_history

__all__ = ["CATEGORIES", "MemorySnapshot", "Phase", "Timeline", "empty_cache", "max_memory_allocated",
           "memory_allocated", "memory_reserved", "memory_stats", "plot", "record_history",
           "reset_peak_memory_stats", "set_memory_limit", "snapshot", "synchronize"]

_last: _hist.History | None = None


def memory_stats(device=None) -> dict[str, int]:
    """Counts for one device: allocated_bytes (live tensors, exact), peak_allocated_bytes,
    reserved_bytes (buffers held, cache included), cached_bytes, num_allocs, num_frees, ...,
    staging_bytes (host-transfer staging and upload buffers, outside reserved_bytes)."""
    return _adapters.resolve(device).memory_stats()


def memory_allocated(device=None) -> int:
    """Bytes held by live tensors on ``device`` (exact), like ``torch.cuda.memory_allocated``; no device sync.

    Arguments:
        device: a Device, an index or ``"wgpu:N"`` (default device 0).
    """
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    """The peak of ``memory_allocated`` on ``device`` since the start or the last ``reset_peak_memory_stats``,
    like ``torch.cuda.max_memory_allocated``.

    Arguments:
        device: a Device, an index or ``"wgpu:N"`` (default device 0).
    """
    return memory_stats(device)["peak_allocated_bytes"]


def memory_reserved(device=None) -> int:
    """Bytes of wgpu buffers ``device``'s allocator holds, its cache included, like ``torch.cuda.memory_reserved``.

    Staging buffers for host transfers are not counted here (``memory_stats()["staging_bytes"]``).

    Arguments:
        device: a Device, an index or ``"wgpu:N"`` (default device 0).
    """
    return memory_stats(device)["reserved_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    """Restart the peak that ``max_memory_allocated`` reports on ``device`` from the current allocation, like
    ``torch.cuda.reset_peak_memory_stats``.

    Arguments:
        device: a Device, an index or ``"wgpu:N"`` (default device 0).
    """
    _adapters.resolve(device).allocator.reset_peak()


def set_memory_limit(nbytes: int | None, device=None) -> int | None:
    """Let ``device`` reserve at most ``nbytes`` of buffers (cache included); None lifts the limit.

    Past the limit an allocation behaves as on a device that has only that much memory: the cache
    is released and the allocation retried once, then OutOfMemoryError. Buffers already held stay.
    ``WGPAR_MEMORY_LIMIT`` sets a limit for every device as it is created.

    Arguments:
        nbytes: the limit in bytes, or None.
        device: a Device, an index or ``"wgpu:1"`` (default device 0).

    Returns the previous limit (None if there was none).
    """
    return _adapters.resolve(device).allocator.set_limit(nbytes)


def empty_cache(device=None) -> int:
    """Give cached, unused buffers back to wgpu (all initialised devices when device is None)."""
    devs = _adapters.initialized_devices() if device is None else [_adapters.resolve(device)]
    return sum(d.empty_cache() for d in devs)


def synchronize(device=None) -> None:
    """Wait until the GPU finished all submitted work (all initialised devices when device is None)."""
    devs = _adapters.initialized_devices() if device is None else [_adapters.resolve(device)]
    for d in devs:
        d.synchronize()


def record_history(enabled: bool = True) -> None:
    """Start (or with ``enabled=False`` stop) recording every allocation and free on every device.

    Each event has its device, bytes, time, thread, a short Python stack and a category: parameter,
    gradient, optimizer state, saved activation, FSDP gathered unit, pipeline activation in flight,
    staging / upload buffer, other; the cache shows as "allocator cache". Replayed, the events give
    ``memory_stats``' allocated, reserved and staging bytes exactly. Tensors made before the start
    keep the categories they were tagged with (parameters, gradients, optimizer state); the rest count
    as "other". Start and stop while no other thread allocates. Recording again starts a new history.

    Arguments:
        enabled: True to start (a no-op while recording), False to stop.
    """
    global _last
    if enabled:
        _last = _hist.start()
    else:
        _hist.stop()


def snapshot() -> MemorySnapshot:
    """The events of the running history, or of the last one if it stopped (see ``record_history``)."""
    hist = _hist.ACTIVE or _last
    if hist is None:
        raise RuntimeError("no memory history: call wgpar.memory.record_history() before the code to look at")
    return from_history(hist)
