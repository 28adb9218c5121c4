"""The dropout kernel: the mask is a hash of (element index, seed), so backward regenerates it."""

from __future__ import annotations

from ..runtime.kernels import WORKGROUP, Kernel, grid
from ..tensor import Tensor
from .elementwise import contiguous

_DROPOUT = Kernel("dropout", "y: w, x: r", "numel: u32, off_x: u32, seed: u32, threshold: u32, scale: f32")


def dropout(x: Tensor, p: float, seed: int) -> Tensor:
    """Keep each element of ``x`` with probability 1 - p and scale it by 1 / (1 - p): inverted
    dropout. The same ``seed`` gives the same mask (a dropped NaN stays NaN: it is multiplied by 0).

    Arguments:
        x: a float tensor.
        p: the probability of dropping an element, in [0, 1).
        seed: 32 bits that pick the mask.
    """
    src = contiguous(x)
    out = Tensor.empty(x.shape, x.dtype, x.device)
    n = x.numel()
    if n:
        threshold = min(int(p * 2**32), 2**32 - 1)
        k = _DROPOUT.spec((x.dtype.storage, x.dtype.storage), T=x.dtype.storage)
        x.device.dispatch(k, [out._storage.buffer, src._storage.buffer],
                          _DROPOUT.pack(numel=n, off_x=src._offset, seed=seed, threshold=threshold,
                                        scale=1.0 / (1.0 - p)),
                          grid(-(-n // WORKGROUP), x.device.max_workgroups))
    return out
