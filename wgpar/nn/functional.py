"""Functional forms of the layers and losses (``wgpar.nn.functional``, as in torch.nn.functional)."""

from __future__ import annotations

import numpy as np

from .. import creation
from .. import ops as raw
from ..autograd import functions as F
from ..autograd.nn_ops import CrossEntropy, Dropout
from ..ops.loss import class_targets
from ..tensor import Tensor


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with weight [out_features, in_features]; the transpose is a view."""
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: input of shape {x.shape} does not match weight of shape {weight.shape} "
                         f"(in_features {weight.shape[-1]})")
    y = F.matmul(x, F.transpose(weight, 0, 1))
    return F.binary("add", y, bias) if bias is not None else y


def relu(x: Tensor) -> Tensor:
    return F.unary("relu", x)


def gelu(x: Tensor) -> Tensor:
    return F.unary("gelu", x)


def tanh(x: Tensor) -> Tensor:
    return F.unary("tanh", x)


def sigmoid(x: Tensor) -> Tensor:
    return F.unary("sigmoid", x)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return F.softmax(x, dim, log=False)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return F.softmax(x, dim, log=True)


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability p (a fresh mask per call, seeded by wgpar.manual_seed)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return F.binary("mul", x, 0.0)
    if not x.dtype.is_float:
        raise TypeError(f"dropout needs a float tensor, got {x.dtype.name}")
    return Dropout.apply(x, p, int(creation.generator().integers(0, 2**32)))


def embedding(indices, weight: Tensor) -> Tensor:
    """Rows of ``weight`` [num_embeddings, dim] picked by integer ``indices`` of any shape."""
    return F.index_select(weight, 0, indices, op="embedding")


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else (normalized_shape,)
    if tuple(x.shape[-len(shape):]) != shape:
        raise ValueError(f"layer_norm: input of shape {x.shape} does not end with normalized_shape {shape}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mu = F.reduce("mean", x, axes, keepdims=True)
    xc = F.binary("sub", x, mu)
    var = F.reduce("mean", F.binary("mul", xc, xc), axes, keepdims=True)
    y = F.binary("mul", xc, F.unary("rsqrt", F.binary("add", var, eps)))
    if weight is not None:
        y = F.binary("mul", y, weight)
    if bias is not None:
        y = F.binary("add", y, bias)
    return y


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    if isinstance(target, Tensor) and input.shape != target.shape:
        raise ValueError(f"mse_loss: input shape {input.shape} and target shape {target.shape} differ")
    d = F.binary("sub", input, target)
    sq = F.binary("mul", d, d)
    return _reduce(sq, reduction, "mse_loss")


def _reduce(t: Tensor, reduction: str, what: str) -> Tensor:
    if reduction == "mean":
        return F.reduce("mean", t)
    if reduction == "sum":
        return F.reduce("sum", t)
    if reduction == "none":
        return t
    raise ValueError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def cross_entropy(input: Tensor, target, reduction: str = "mean") -> Tensor:
    """Softmax cross entropy of logits [N, C] against int class targets [N] (one fused kernel).

    reduction: "mean" (default), "sum" or "none".
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"cross_entropy: input must be a wgpar.Tensor, got {type(input).__name__}")
    if input.ndim != 2:
        raise ValueError(f"cross_entropy: expected logits of shape [N, C], got {input.shape}")
    if not input.dtype.is_float:
        raise TypeError(f"cross_entropy: logits must be float, got {input.dtype.name}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return CrossEntropy.apply(input, class_targets(target, input, "cross_entropy"), reduction)


def nll_loss(log_probs: Tensor, target, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities [N, C] at int targets [N]."""
    if log_probs.ndim != 2:
        raise ValueError(f"nll_loss: expected [N, C] log-probabilities, got {log_probs.shape}")
    n, c = log_probs.shape
    tgt = class_targets(target, log_probs, "nll_loss")
    # Flat positions row * C + target pick one entry per row; index_select carries the gradient.
    rows = Tensor.from_numpy(np.arange(n, dtype=np.int32) * c, device=log_probs.device)
    flat_index = raw.binary("add", rows, tgt)
    flat_index._host_range = (0, n * c - 1)  # every target was checked above
    picked = F.index_select(F.reshape(log_probs, (-1,)), 0, flat_index)
    return _reduce(F.unary("neg", picked), reduction, "nll_loss")
