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
    mpi_chunk_kb: int = 16384
    """WGPAR_MPI_CHUNK_KB: KiB per pipelined chunk of the MPI backend's collectives (a power of two)."""
    mpi_ranks_per_host: int | None = None
    """WGPAR_MPI_RANKS_PER_HOST: treat every N consecutive MPI ranks as one host (to test the
    multi-host path of the MPI backend on one machine); unset: the real hosts."""


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def load() -> Config:
    return Config(
        adapter=os.environ.get("WGPAR_ADAPTER") or None,
        backend=(os.environ.get("WGPAR_BACKEND") or "").lower() or None,
        submit_threshold=max(1, _int("WGPAR_SUBMIT_THRESHOLD", 512)),
        mpi_chunk_kb=_int("WGPAR_MPI_CHUNK_KB", 16384),
        mpi_ranks_per_host=_int("WGPAR_MPI_RANKS_PER_HOST", 0) or None,
    )


CONFIG = load()
