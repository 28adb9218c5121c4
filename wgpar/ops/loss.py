"""Cross-entropy kernels: a fused log-softmax + negative log-likelihood per row, and its gradient.

shaders/cross_entropy.wgsl runs one workgroup per row of contiguous logits [rows, classes]; its
backward form reads the loss gradient from a device buffer, so backward needs no readback. The
differentiable op is ``autograd.nn_ops.CrossEntropy``.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..runtime.kernels import Kernel, grid, load_source
from ..tensor import Tensor, check_same_device
from .index import as_index

_CROSS_ENTROPY = Kernel("cross_entropy", "out: w, x: r, labels: r, gout: r",
                        "rows: u32, cols: u32, off_x: u32, off_t: u32, off_g: u32")


def class_targets(target, scores: Tensor, op: str) -> Tensor:
    """Class targets [N] for scores [N, C] as int32, each checked to lie in [0, C) before narrowing.

    Negative targets are errors: nn.functional handles ignore_index before it comes here.

    Arguments:
        target: an integer tensor or host array of N class indices.
        scores: the [N, C] scores they index.
        op: the caller's name, for errors.
    """
    if isinstance(target, Tensor):
        if target.dtype.is_float:
            raise TypeError(f"{op}: targets must be integer class indices, got {target.dtype.name}")
        check_same_device(scores, target, op=op)
        shape = target.shape
    else:
        target = np.asarray(target)
        shape = target.shape
    n, c = scores.shape
    if shape != (n,):
        raise ValueError(f"{op}: targets of shape {shape} for scores of shape {scores.shape}")
    if n and c == 0:
        raise ValueError(f"{op}: scores of shape {scores.shape} have no classes")
    return as_index(target, scores.device, c, f"{op} with {c} classes", noun="target")


def _run(logits: Tensor, target: Tensor, gout: Tensor | None) -> Tensor:
    rows, cols = logits.shape
    backward = gout is not None
    out_dt = logits.dtype if backward else _dt.float32
    out = Tensor.empty((rows, cols) if backward else (rows,), out_dt, logits.device)
    if rows == 0:  # an empty batch (a data-parallel rank's empty share): nothing to bind or run
        return out
    g = gout if backward else target  # an unused binding still needs a buffer
    k = _CROSS_ENTROPY.spec((out_dt.storage, logits.dtype.storage, "i32", g.dtype.storage), O=out_dt.storage,
                            BACKWARD="true" if backward else "false", FNS=load_source("float_fns"))
    logits.device.dispatch(
        k, [out._storage.buffer, logits._storage.buffer, target._storage.buffer, g._storage.buffer],
        _CROSS_ENTROPY.pack(rows=rows, cols=cols, off_x=logits._offset, off_t=target._offset, off_g=g._offset),
        grid(rows, logits.device.max_workgroups))
    return out


def cross_entropy_rows(logits: Tensor, target: Tensor) -> Tensor:
    """Each row's loss, logsumexp(row) - row[target], as float32 [N] (NaN for a row holding a NaN or
    +inf, or only -inf: PyTorch's log_softmax gives NaN there).

    Arguments:
        logits: contiguous float [N, C].
        target: contiguous int32 [N], checked to lie in [0, C) (``class_targets``).
    """
    return _run(logits, target, None)


def cross_entropy_grad(logits: Tensor, target: Tensor, scale: Tensor) -> Tensor:
    """(softmax(logits) - onehot(target)) * scale[0] / N, in logits' dtype: the gradient of the mean
    loss for a loss gradient ``scale`` (a one-element tensor, read on the device).

    Arguments:
        logits, target: as for ``cross_entropy_rows``.
        scale: a tensor whose first element scales the gradient.
    """
    return _run(logits, target, scale)
