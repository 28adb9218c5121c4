"""Matrix multiplication: 2-D, batched with NumPy broadcasting, 1-D operands as in np.matmul."""

from __future__ import annotations

import math

from .. import dtypes as _dt
from ..runtime.kernels import pack, spec
from ..tensor import Tensor, check_same_device
from .elementwise import broadcast_shape, fill
from .shape import expand, reshape, squeeze

_TILE = 64
_MAX_Z = 65535


def matmul(a: Tensor, b: Tensor) -> Tensor:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected two wgpar.Tensors, got {type(a).__name__} and {type(b).__name__}")
    check_same_device(a, b, op="matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must be at least 1-d, got shapes {a.shape} and {b.shape}")
    for t in (a, b):
        if not t.dtype.is_float:
            raise TypeError(f"matmul: needs float tensors, got {a.dtype.name} and {b.dtype.name}")
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    a2 = reshape(a, (1, a.shape[0])) if a_vec else a
    b2 = reshape(b, (b.shape[0], 1)) if b_vec else b
    M, K = a2.shape[-2:]
    K2, N = b2.shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} are not aligned ({K} != {K2})")
    try:
        batch = broadcast_shape(a2.shape[:-2], b2.shape[:-2], op="matmul")
    except ValueError:
        raise ValueError(f"matmul: the batch dims of shapes {a.shape} and {b.shape} cannot be broadcast") from None
    out_dt = _dt.promote(a.dtype, b.dtype)
    if out_dt is _dt.float16 and not (a.dtype is _dt.float16 and b.dtype is _dt.float16):
        out_dt = _dt.float32
    if math.prod(batch) * M * N == 0 or K == 0:
        out = fill(batch + (M, N), 0.0, out_dt, a.device)
    else:
        a3 = reshape(expand(a2, batch + (M, K)), (-1, M, K))
        b3 = reshape(expand(b2, batch + (K, N)), (-1, K, N))
        out = Tensor.empty(batch + (M, N), out_dt, a.device)
        _dispatch(a3, b3, out, math.prod(batch), M, N, K)
    if a_vec:
        out = squeeze(out, -2)
    if b_vec:
        out = squeeze(out, -1)
    return out


def _dispatch(a: Tensor, b: Tensor, out: Tensor, nb: int, M: int, N: int, K: int) -> None:
    f16 = "enable f16;" if _dt.float16 in (a.dtype, b.dtype, out.dtype) else ""
    dev = out.device
    k = spec("matmul", ("w", "r", "r"), F16=f16, TC=out.dtype.storage, TA=a.dtype.storage,
             TB=b.dtype.storage, PARAMS=3)
    sa, sb = a.strides, b.strides
    for z0 in range(0, nb, _MAX_Z):
        nz = min(_MAX_Z, nb - z0)
        params = pack(M, N, K, z0, a._offset, b._offset, out._offset, 0,
                      sa[0], sa[1], sa[2], 0, sb[0], sb[1], sb[2], 0)
        dev.dispatch(k, [out._storage.buffer, a._storage.buffer, b._storage.buffer], params,
                     (-(-N // _TILE), -(-M // _TILE), nz))
