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
        dump_wgsl=os.environ.get("WGPAR_DUMP_WGSL") or None,
    )


CONFIG = load()
