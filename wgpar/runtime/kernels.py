"""WGSL kernel sources: load, specialise, and pack their parameters.

Every kernel family lives in one ``.wgsl`` file under ``shaders/``; a file is
a template whose ``{{NAME}}`` placeholders are filled per specialisation
(element types, the op's expression, a fast path). Parameters travel in a
uniform struct at the last binding, read through a dynamic offset into the
device's parameter arena, so one cached bind group serves every call with the
same buffers.
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

WORKGROUP = 256
MAX_DIMS = 8
PARAM_SLOT = 256  # bytes per dispatch in the arena; a multiple of every uniform offset alignment
# Most loop iterations one shader invocation may run. lavapipe (llvmpipe) silently leaves its loops
# once an invocation has run 65535 iterations (nested loops counted together), so kernels whose
# loops grow with the data (reductions, softmax, matmul's K) split the work on the host to stay
# below this, with room to spare.
MAX_LOOP = 32768


@functools.cache
def _shader_dir() -> Path:
    shipped = resources.files("wgpar") / "shaders"
    if shipped.is_dir():  # installed wheel: shaders/ is force-included into the package
        return Path(str(shipped))
    return Path(__file__).resolve().parents[2] / "shaders"  # source checkout


@functools.cache
def load_source(family: str) -> str:
    path = _shader_dir() / f"{family}.wgsl"
    try:
        return path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"wgpar shader {family!r} not found at {path}") from None


_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class KernelSpec:
    """One specialised kernel: its family file, fills and binding access modes.

    ``access`` lists the storage bindings in order, ``"r"`` (read-only) or
    ``"w"`` (read-write); the parameter uniform is the binding after them.
    """

    family: str
    fills: tuple[tuple[str, str], ...]
    access: tuple[str, ...]
    f16: bool = False

    @property
    def label(self) -> str:
        tag = ",".join(f"{k}={v}" for k, v in self.fills if len(v) < 24)
        return f"wgpar:{self.family}[{tag}]"

    def source(self) -> str:
        fills = dict(self.fills)

        def sub(m: re.Match[str]) -> str:
            try:
                return fills[m.group(1)]
            except KeyError:
                raise KeyError(f"{self.label}: no fill for {{{{{m.group(1)}}}}}") from None

        body = _PLACEHOLDER.sub(sub, load_source(self.family))
        return ("enable f16;\n" if self.f16 else "") + body


def spec(family: str, access: tuple[str, ...], f16: bool = False, **fills: str | int) -> KernelSpec:
    return KernelSpec(family, tuple(sorted((k, str(v)) for k, v in fills.items())), access, f16)


class F32(float):
    """Marks a parameter word as an f32 (plain ints pack as u32/i32)."""


def _f32_bits(x: float) -> int:
    try:
        return _U32.unpack(_F32.pack(x))[0]
    except OverflowError:  # beyond float32's range: round to inf as a cast would
        with np.errstate(over="ignore"):
            return int(np.array(x, dtype=np.float32).view(np.uint32))


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def pack(*words: int | float | F32 | list | tuple) -> bytes:
    """Pack parameter words (ints as 32-bit two's complement, F32 as f32 bits).

    On the path of every dispatch: plain ``struct``, one call when every word
    is already a non-negative int (the common case), word by word otherwise.
    """
    flat: list = []
    for w in words:
        if isinstance(w, (list, tuple)):
            flat.extend(w)
        else:
            flat.append(w)
    if len(flat) * 4 > PARAM_SLOT:
        raise ValueError(f"kernel parameters of {len(flat) * 4} bytes exceed the {PARAM_SLOT}-byte slot")
    fmt = f"<{len(flat)}I"
    try:
        return struct.pack(fmt, *flat)
    except struct.error:  # floats, negative ints, NumPy scalars
        return struct.pack(fmt, *(_f32_bits(v) if isinstance(v, float) else int(v) & 0xFFFFFFFF for v in flat))


def dims(values, fill: int = 0) -> list[int]:
    """Pad a per-dimension list to MAX_DIMS words (two vec4s in WGSL)."""
    values = list(values)
    if len(values) > MAX_DIMS:
        raise ValueError(f"tensors of more than {MAX_DIMS} dimensions are not supported (got {len(values)})")
    return values + [fill] * (MAX_DIMS - len(values))


def grid(n_groups: int, max_per_dim: int) -> tuple[int, int]:
    """Split a 1-D workgroup count into (x, y) within the per-dimension limit (``Device.max_workgroups``).

    Kernels recover the flat index as ``wid.x + wid.y * nwg.x`` and skip the overshoot of x * y.
    """
    if n_groups <= max_per_dim:
        return max(n_groups, 1), 1
    y = -(-n_groups // max_per_dim)
    x = -(-n_groups // y)
    return x, y
