"""Layers: Linear, activations, LayerNorm, Embedding, Dropout, Sequential, the transformer MLP."""

from __future__ import annotations

import math

from .. import creation
from .. import dtypes as _dt
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module
from .parameter import Parameter


def _param(shape, device, dtype) -> Parameter:
    return Parameter(creation.empty(*shape, dtype=dtype, device=device))


class Linear(Module):
    """y = x @ weight.T + bias, weight [out_features, in_features]; PyTorch's default init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear needs positive sizes, got in={in_features}, out={out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.weight = _param((out_features, in_features), device, dtype)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if bias:
            self.bias = _param((out_features,), device, dtype)
            bound = 1.0 / math.sqrt(in_features)
            init.uniform_(self.bias, -bound, bound)
        else:
            self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class GELU(Module):
    """GELU, exact or (``approximate="tanh"``) with PyTorch's tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return "" if self.approximate == "none" else f"approximate={self.approximate!r}"


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Softmax(Module):
    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.dim)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else (normalized_shape,)
        self.normalized_shape, self.eps = shape, eps
        if elementwise_affine:
            self.weight = _param(shape, device, dtype)
            self.bias = _param(shape, device, dtype)
            init.ones_(self.weight)
            init.zeros_(self.bias)
        else:
            self.weight = self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = _param((num_embeddings, embedding_dim), device, dtype)
        init.normal_(self.weight)

    def forward(self, indices) -> Tensor:
        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Sequential(Module):
    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential takes Modules, got {type(m).__name__} at position {i}")
            self.add_module(str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)


class MLP(Module):
    """The transformer MLP: ``fc2(act(fc1(x)))``, d_model -> hidden -> d_model.

    ``wgpar.distributed.ParallelMLP`` splits it over ranks (fc1 by columns, fc2 by rows).

    Arguments:
        d_model: input and output features.
        hidden: the inner width (4 * d_model in GPT-2).
        bias: whether both layers have a bias.
        activation: a parameter-free module (default GELU).
        device, dtype: of the parameters.
    """

    def __init__(self, d_model: int, hidden: int, bias: bool = True, activation: Module | None = None, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        self.fc1 = Linear(d_model, hidden, bias, device=device, dtype=dtype)
        self.act = activation if activation is not None else GELU()
        self.fc2 = Linear(hidden, d_model, bias, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CrossEntropyLoss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: Tensor, target) -> Tensor:
        return F.cross_entropy(logits, target, self.reduction)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)
