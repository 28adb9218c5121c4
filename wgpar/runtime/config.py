"""Environment-variable configuration, read once and typed, in one place."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
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
    mpi_chunk_kb: int | None = None
    """WGPAR_MPI_CHUNK_KB: KiB per pipelined chunk of the MPI backend's collectives (a power of two); unset:
    the backend's choice (``backends/mpi.py``, ``default_chunk``)."""
    mpi_ranks_per_host: int | None = None
    """WGPAR_MPI_RANKS_PER_HOST: treat every N consecutive MPI ranks as one host (to test the
    multi-host path of the MPI backend on one machine); unset: the real hosts."""
    memory_limit: int | None = None
    """WGPAR_MEMORY_LIMIT: bytes each device may reserve (``512M``, ``2G`` and ``64K`` work too)."""
    native_calls: bool = True
    """WGPAR_NATIVE_CALLS: ``0`` records dispatches through wgpu-py's public calls instead of straight
    into wgpu-native (runtime/native.py; slower, for comparison)."""


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
        mpi_chunk_kb=_int("WGPAR_MPI_CHUNK_KB", 0) or None,
        mpi_ranks_per_host=_int("WGPAR_MPI_RANKS_PER_HOST", 0) or None,
        memory_limit=_bytes("WGPAR_MEMORY_LIMIT"),
        native_calls=_int("WGPAR_NATIVE_CALLS", 1) != 0,
    )


CONFIG = load()


def ensure_xdg_runtime_dir() -> str | None:
    """Give ``XDG_RUNTIME_DIR`` a private default when it is unset (Linux), before any adapter is opened.

    Vulkan loaders and Mesa's window-system code look for it and print "error: XDG_RUNTIME_DIR is invalid
    or not set" several times per process without it (scripts run outside a desktop session, ssh, cron,
    containers). wgpar draws nothing on screen, so any private directory will do:
    ``<tempdir>/wgpar-runtime-<uid>``, made 0700 (a fresh one if that path is someone else's or not
    private). Returns the directory set, or None when nothing was changed.
    """
    if not sys.platform.startswith("linux") or os.environ.get("XDG_RUNTIME_DIR"):
        return None
    uid = os.getuid()
    path = os.path.join(tempfile.gettempdir(), f"wgpar-runtime-{uid}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
            path = tempfile.mkdtemp(prefix="wgpar-runtime-")
    except OSError:  # an unwritable temporary directory: leave the variable alone
        return None
    os.environ["XDG_RUNTIME_DIR"] = path
    return path
