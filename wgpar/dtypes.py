"""Element types: how each is stored in a buffer, computed in WGSL and shown in NumPy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    np: np.dtype
    storage: str  # WGSL element type of the buffer
    compute: str  # WGSL type arithmetic runs in
    itemsize: int

    @property
    def is_float(self) -> bool:
        return self.compute == "f32"

    def __repr__(self) -> str:
        return f"wgpar.{self.name}"


float32 = DType("float32", np.dtype(np.float32), "f32", "f32", 4)
float16 = DType("float16", np.dtype(np.float16), "f16", "f32", 2)
int32 = DType("int32", np.dtype(np.int32), "i32", "i32", 4)
# bool is stored as one i32 per element (0 or 1): WGSL storage has no 1-byte type.
bool_ = DType("bool", np.dtype(np.bool_), "i32", "i32", 4)

ALL = (float32, float16, int32, bool_)
_BY_NAME = {d.name: d for d in ALL} | {"float": float32, "half": float16, "int": int32, "bool_": bool_}


def as_dtype(x) -> DType:
    """Accept a DType, a name (``"float32"``), a NumPy dtype or a Python type."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    if x is float:
        return float32
    if x is int:
        return int32
    if x is bool:
        return bool_
    try:
        nd = np.dtype(x)
    except TypeError:
        raise TypeError(f"unsupported dtype {x!r}; wgpar supports float32, float16, int32 and bool") from None
    return from_numpy_dtype(nd)


def is_dtype_name(name: str) -> bool:
    """Whether a string names a dtype (``"float16"``, ``"int64"``) rather than, say, a device."""
    try:
        as_dtype(name)
    except TypeError:
        return False
    return True


def from_numpy_dtype(nd: np.dtype) -> DType:
    """Map a NumPy dtype: floats of 32/64 bits -> float32, float16 -> float16, any integer -> int32."""
    if nd == np.float16:
        return float16
    if nd.kind == "f":
        return float32
    if nd.kind in "iu":
        return int32
    if nd.kind == "b":
        return bool_
    raise TypeError(f"unsupported dtype {nd}; wgpar supports float32, float16, int32 and bool")


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary op between two tensors (PyTorch's rules, restricted to our types)."""
    if a == b:
        return a
    if a.is_float and b.is_float:
        return float32
    if a.is_float:
        return a
    if b.is_float:
        return b
    return int32  # int32 with bool


def promote_scalar(t: DType, scalar) -> DType:
    """Result type of a tensor op with a Python or NumPy scalar (PyTorch's rules for Python numbers).

    A scalar keeps the tensor's type within its kind (float16 stays float16 next to 0.5): a float
    joining an integer or bool tensor gives float32, an integer joining a bool tensor gives int32.
    NumPy scalars (np.float32(0.5), np.int64(2), np.bool_(True)) count as the Python number they hold.
    """
    if isinstance(scalar, (bool, np.bool_)):
        return t
    if isinstance(scalar, (float, np.floating)):
        return t if t.is_float else float32
    if t == bool_:
        return int32
    return t
