"""Element types: how each is stored in a buffer, computed in WGSL and shown in NumPy.

wgpar has four: float32, float16, int32 and bool. Data converts on the way in without a word (NumPy's
float64 to float32, any integer type to int32 once its values are checked to fit). A dtype *asked for*
that wgpar lacks (``dtype="float64"``, ``np.int64``, ``torch.float64``, ``t.long()``) gives the
nearest one (every float type float32, every integer type int32) with a DTypeWarning, once per
process and dtype; README "Types".
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)  # four singletons, compared and hashed by identity (in C: plan keys hash them)
class DType:
    name: str
    np: np.dtype
    storage: str  # WGSL element type of the buffer
    compute: str  # WGSL type arithmetic runs in
    itemsize: int

    @property
    def is_float(self) -> bool:
        """True for the floating dtypes (computed in f32 by the kernels: float32 and float16), like
        ``torch.dtype.is_floating_point``."""
        return self.compute == "f32"

    def __repr__(self) -> str:
        return f"wgpar.{self.name}"

    def __reduce__(self):  # pickled and copied, still the one instance (code compares dtypes with `is`)
        return as_dtype, (self.name,)


float32 = DType("float32", np.dtype(np.float32), "f32", "f32", 4)
float16 = DType("float16", np.dtype(np.float16), "f16", "f32", 2)
int32 = DType("int32", np.dtype(np.int32), "i32", "i32", 4)
# bool is stored as one i32 per element (0 or 1): WGSL storage has no 1-byte type.
bool_ = DType("bool", np.dtype(np.bool_), "i32", "i32", 4)

ALL = (float32, float16, int32, bool_)
_BY_NAME = {d.name: d for d in ALL} | {"float": float32, "half": float16, "int": int32, "bool_": bool_}


SUPPORTED = "float32, float16, int32 and bool"


class DTypeWarning(UserWarning):
    """A dtype wgpar lacks was asked for (float64, int64, ...) and the nearest supported one given."""


_warned: set[str] = set()
_warn_lock = threading.Lock()
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _lookup(x) -> tuple[DType, str | None]:
    """The DType ``x`` asks for, and the name of the dtype it asked for when wgpar lacks that one."""
    if isinstance(x, DType):
        return x, None
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x], None
    if x is float:  # Python's types name wgpar's defaults, as wgpar.float and wgpar.int do
        return float32, None
    if x is int:
        return int32, None
    if x is bool:
        return bool_, None
    if type(x).__module__ == "torch":  # torch.float64 and friends, by name
        x = str(x).removeprefix("torch.")
        if x in _BY_NAME:
            return _BY_NAME[x], None
    if isinstance(x, str) and x in ("bfloat16", "bf16"):  # NumPy has no bfloat16
        return float32, "bfloat16"
    try:
        nd = np.dtype(x)
    except TypeError:
        raise TypeError(f"unsupported dtype {x!r}; wgpar supports {SUPPORTED}") from None
    got = from_numpy_dtype(nd)
    return got, (None if nd == got.np else nd.name)


def as_dtype(x) -> DType:
    """The DType asked for by a DType, a name (``"float32"``), a NumPy dtype, a torch dtype or a Python
    type. One wgpar lacks gives the nearest (floats float32, integers int32) and a DTypeWarning, once per
    process and dtype."""
    got, missing = _lookup(x)
    if missing is not None:
        with _warn_lock:
            first = missing not in _warned
            _warned.add(missing)
        if first:
            warnings.warn(f"wgpar has no {missing}: it gives {got.name} instead (its dtypes are {SUPPORTED}; "
                          f"README 'Types'). This warning is shown once per dtype.", DTypeWarning,
                          stacklevel=_caller_level())
    return got


def _caller_level() -> int:
    """The stacklevel of the first frame outside wgpar, so a warning names the user's line."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def is_dtype(x) -> bool:
    """Whether ``x`` names a dtype (a DType, a type, a NumPy or torch dtype, ``"float16"``, ``"int64"``)
    rather than, say, a device (``t.to(x)`` takes either)."""
    if isinstance(x, (DType, type, np.dtype)) or (type(x).__module__ == "torch" and type(x).__name__ == "dtype"):
        return True
    if not isinstance(x, str):
        return False
    try:
        _lookup(x)
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
