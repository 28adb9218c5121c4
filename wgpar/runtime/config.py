"""Environment-variable configuration, read once and typed, in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    adapter: str | None
    """WGPAR_ADAPTER: adapter index (``"1"``) or a case-insensitive name substring."""
    backend: str | None
    """WGPAR_BACKEND: restrict to one backend (``vulkan``, ``metal``, ``d3d12``, ``opengl``)."""
    submit_threshold: int
    """WGPAR_SUBMIT_THRESHOLD: dispatches recorded before a device submits on its own."""
    dump_wgsl: str | None = None
    """WGPAR_DUMP_WGSL: a directory; every shader wgpar builds is written there (one file per kernel)."""
    mpi_chunk_kb: int = 16384
    """WGPAR_MPI_CHUNK_KB: KiB per pipelined chunk of the MPI backend's collectives (a power of two)."""
    mpi_ranks_per_host: int | None = None
    """WGPAR_MPI_RANKS_PER_HOST: treat every N consecutive MPI ranks as one host (to test the
    multi-host path of the MPI backend on one machine); unset: the real hosts."""
    memory_limit: int | None = None
    """WGPAR_MEMORY_LIMIT: bytes each device may reserve (``512M``, ``2G`` and ``64K`` work too)."""


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes(name: str) -> int | None:
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return None
    scale = _UNITS.get(raw[-1].upper(), 1)
    digits = raw[:-1] if raw[-1].upper() in _UNITS else raw
    try:
        value = int(digits) * scale
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of bytes (e.g. 1073741824, 512M, 2G)") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


def load() -> Config:
    return Config(
        adapter=os.environ.get("WGPAR_ADAPTER") or None,
        backend=(os.environ.get("WGPAR_BACKEND") or "").lower() or None,
        submit_threshold=max(1, _int("WGPAR_SUBMIT_THRESHOLD", 512)),
        dump_wgsl=os.environ.get("WGPAR_DUMP_WGSL") or None,
        mpi_chunk_kb=_int("WGPAR_MPI_CHUNK_KB", 16384),
        mpi_ranks_per_host=_int("WGPAR_MPI_RANKS_PER_HOST", 0) or None,
        memory_limit=_bytes("WGPAR_MEMORY_LIMIT"),
    )


CONFIG = load()
