"""Per-device memory counts and cache control, shaped like torch.cuda's."""

from __future__ import annotations

from .runtime import adapters as _adapters


def memory_stats(device=None) -> dict[str, int]:
    """Counts for one device: allocated_bytes (live tensors, exact), peak_allocated_bytes,
    reserved_bytes (buffers held, cache included), cached_bytes, num_allocs, num_frees, ..."""
    return _adapters.resolve(device).memory_stats()


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["peak_allocated_bytes"]


def memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes"]


def reset_peak_memory_stats(device=None) -> None:
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
