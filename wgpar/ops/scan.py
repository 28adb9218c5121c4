"""Running sums and products along a dim (cumsum, cumprod): a blocked scan on the device.

Each row is cut into blocks of ``BLOCK`` entries, scanned in workgroup memory (scan.wgsl), and the
blocks' totals, themselves a [rows, blocks] array, are scanned the same way and combined back
(scan_add.wgsl): O(n) work in log_BLOCK(n) levels, no loop that grows with n (lavapipe's loop limit).
"""

from __future__ import annotations

from .. import dtypes as _dt
from ..runtime.kernels import WORKGROUP, Kernel, grid
from ..tensor import Tensor, wrap_dim
from .elementwise import cast, contiguous
from .shape import permute, reshape

_SCAN = Kernel("scan", "out: w, x: r, sums: w", "rows: u32, n: u32, nb: u32, off_x: u32")
_SCAN_ADD = Kernel("scan_add", "out: w, s: r", "rows: u32, n: u32, nb: u32, block: u32")
BLOCK = 4 * WORKGROUP  # entries per workgroup: WG threads of ITEMS (scan.wgsl) each

# op -> compute type -> (COMBINE, ID); int32 runs in u32 so that it wraps modulo 2**32.
_OPS = {"sum": {"f32": ("a + b", "0.0"), "u32": ("a + b", "0u")},
        "prod": {"f32": ("a * b", "1.0"), "u32": ("a * b", "1u")}}


def _fills(op: str, x: Tensor) -> dict[str, str]:
    c = "f32" if x.dtype is _dt.float32 else "u32"
    combine, ident = _OPS[op][c]
    load, store = ("", "") if c == "f32" else ("bitcast<u32>", "bitcast<i32>")
    return {"C": c, "COMBINE": combine, "ID": ident, "LOAD": load, "STORE": store}


def _scan_rows(op: str, x: Tensor) -> Tensor:
    """The inclusive scan of each row of a contiguous 2-d float32 or int32 ``x``."""
    rows, n = x.shape
    out = Tensor.empty(x.shape, x.dtype, x.device)
    if out.numel() == 0:
        return out
    nb = -(-n // BLOCK)
    sums = Tensor.empty((rows, nb), x.dtype, x.device)
    fills = _fills(op, x)
    dev = x.device
    storage = x.dtype.storage
    dev.dispatch(_SCAN.spec((storage, storage, storage), **fills),
                 [out._storage.buffer, x._storage.buffer, sums._storage.buffer],
                 _SCAN.pack(rows=rows, n=n, nb=nb, off_x=x._offset), grid(rows * nb, dev.max_workgroups))
    if nb > 1:
        carried = _scan_rows(op, sums)
        dev.dispatch(_SCAN_ADD.spec((storage, storage), **fills), [out._storage.buffer, carried._storage.buffer],
                     _SCAN_ADD.pack(rows=rows, n=n, nb=nb, block=BLOCK),
                     grid(-(-rows * n // WORKGROUP), dev.max_workgroups))
    return out


def scan(op: str, x: Tensor, dim: int) -> Tensor:
    """The running ``op`` ("sum" or "prod") of ``x`` along ``dim``, inclusive, in x's dtype: float32 and
    int32 (wrapping) directly, float16 through float32, bool as int32."""
    if x.ndim == 0:
        return reshape(scan(op, reshape(x, (1,)), 0), ())
    d = wrap_dim(dim, x.ndim)
    if x.dtype is _dt.float16:
        return cast(scan(op, cast(x, _dt.float32), d), _dt.float16)
    if x.dtype is _dt.bool_:
        x = cast(x, _dt.int32)
    order = [i for i in range(x.ndim) if i != d] + [d]
    moved = contiguous(permute(x, order)) if d != x.ndim - 1 else contiguous(x)
    n = x.shape[d]
    rows = moved.numel() // n if n else 0
    out = reshape(_scan_rows(op, reshape(moved, (rows, n))), moved.shape)
    if d == x.ndim - 1:
        return out
    inv = [0] * x.ndim
    for pos, ax in enumerate(order):
        inv[ax] = pos
    return contiguous(permute(out, inv))
