"""Layers: Linear, activations, LayerNorm, Embedding, Dropout, Sequential, the transformer MLP."""

from __future__ import annotations

import math
import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from .. import creation
from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
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
    """``max(x, 0)`` elementwise (NaN stays NaN), as ``torch.nn.ReLU``. Differs from torch: ``inplace=True``
    raises ValueError."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        F._no_inplace(inplace, "ReLU")

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


class Identity(Module):
    """Returns its input unchanged, as ``torch.nn.Identity`` (constructor arguments are ignored, as torch's)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, x):
        return x


class SiLU(Module):
    """``x * sigmoid(x)`` elementwise, as ``torch.nn.SiLU``. Differs from torch: ``inplace=True`` raises."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        F._no_inplace(inplace, "SiLU")

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class LeakyReLU(Module):
    """``x`` where positive, else ``negative_slope * x``, as ``torch.nn.LeakyReLU``. Differs from torch:
    ``inplace=True`` raises.

    Arguments:
        negative_slope: the slope below zero.
    """

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        F._no_inplace(inplace, "LeakyReLU")
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class ELU(Module):
    """``x`` where positive, else ``alpha * (exp(x) - 1)``, as ``torch.nn.ELU``. Differs from torch:
    ``inplace=True`` raises.

    Arguments:
        alpha: the negative side's scale.
    """

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        F._no_inplace(inplace, "ELU")
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class Tanh(Module):
    """``tanh(x)`` elementwise, as ``torch.nn.Tanh``."""

    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Sigmoid(Module):
    """``1 / (1 + exp(-x))`` elementwise, as ``torch.nn.Sigmoid``."""

    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Softmax(Module):
    """Softmax along ``dim`` (one kernel per call; a NaN makes its row NaN), as ``torch.nn.Softmax``.

    Arguments:
        dim: the dim whose entries sum to 1; None (torch's default) takes torch's implicit, deprecated
            choice with its warning: dim 0 for 0-, 1- and 3-d input, else dim 1.
    """

    _log = False

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        name = "log_softmax" if self._log else "softmax"
        dim = F._implicit_softmax_dim(name, x.ndim, 3) if self.dim is None else self.dim
        return F.log_softmax(x, dim) if self._log else F.softmax(x, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """``log(softmax(x))`` along ``dim``, computed stably in one kernel, as ``torch.nn.LogSoftmax`` (the
    same ``dim`` rule as :class:`Softmax`)."""

    _log = True


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dims (mean 0, variance 1), then scale and shift,
    as ``torch.nn.LayerNorm``.

    Arguments:
        normalized_shape: an int or the trailing shape normalised over.
        eps: added to the variance.
        elementwise_affine: learn a weight (ones) and bias (zeros) of that shape.
        bias: with ``elementwise_affine``, learn the bias too (False: a weight only).
        device, dtype: of the parameters.
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=_dt.float32) -> None:
        super().__init__()
        shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else (normalized_shape,)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        self.weight = self.bias = None
        if elementwise_affine:
            self.weight = init.ones_(_param(shape, device, dtype))
            if bias:
                self.bias = init.zeros_(_param(shape, device, dtype))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: integer indices of any shape pick rows of ``weight`` [num_embeddings, embedding_dim]
    (initialised N(0, 1), the padding row zeros), as ``torch.nn.Embedding``; an index out of range raises.

    Differs from torch: ``max_norm``, ``scale_grad_by_freq`` and ``sparse=True`` raise (see
    ``functional.embedding``).

    Arguments:
        num_embeddings: the rows.
        embedding_dim: the size of each row.
        padding_idx: a row (negative counts from the end) that starts at zero and gets no gradient.
        device, dtype: of the weight.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        if max_norm is not None:
            raise ValueError("Embedding: max_norm (renormalising weight rows in place) is not supported")
        if scale_grad_by_freq or sparse:
            raise ValueError("Embedding: scale_grad_by_freq and sparse gradients are not supported")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = F._padding_idx(padding_idx, num_embeddings, "Embedding")
        self.weight = _param((num_embeddings, embedding_dim), device, dtype)
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0.0

    def forward(self, indices) -> Tensor:
        return F.embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class Dropout(Module):
    """Inverted dropout in training mode: zero each element with probability ``p`` and scale the rest by
    1 / (1 - p); the identity in eval mode. As ``torch.nn.Dropout``; masks come from wgpar.manual_seed.

    Arguments:
        p: the probability of zeroing an element, in [0, 1].
        inplace: only False: ``inplace=True`` raises ValueError (differs from torch).
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        F._no_inplace(inplace, "Dropout")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace=False"


class Dropout2d(Module):
    """Channel dropout in training mode: zero each [N, C] plane of [N, C, H, W] (or [C, H, W]) with
    probability ``p`` and scale the rest by 1 / (1 - p); the identity in eval mode. As
    ``torch.nn.Dropout2d`` (see ``functional.dropout2d``). Differs from torch: ``inplace=True`` raises.

    Arguments:
        p: the probability of zeroing a channel, in [0, 1].
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        F._no_inplace(inplace, "Dropout2d")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout2d(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace=False"


class Flatten(Module):
    """Flatten dims ``start_dim`` .. ``end_dim`` into one (by default all but the batch dim), as ``torch.nn.Flatten``.

    Arguments:
        start_dim, end_dim: the first and last dims flattened (negative counts from the end).
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Sequential(Module):
    """Modules called in order, each on the previous one's output, as ``torch.nn.Sequential``.

    ``Sequential(a, b, c)`` names them "0", "1", "2"; ``Sequential(OrderedDict(name=module, ...))``
    keeps the names. Indexing (ints, negative ints, slices), ``len``, iteration, ``append``,
    ``extend``, ``insert`` and ``pop`` work as on a list (inserting and deleting renumber, as torch).

    Arguments:
        modules: the Modules, or one OrderedDict of them.
    """

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, _checked(m, f"Sequential entry {name!r}"))
            return
        for i, m in enumerate(modules):
            self.add_module(str(i), _checked(m, f"Sequential position {i}"))

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def _index(self, i: int) -> int:
        n = len(self._modules)
        i = operator.index(i)
        if not -n <= i < n:
            raise IndexError(f"Sequential index {i} is out of range for {n} modules")
        return i % n

    def __getitem__(self, i: int | slice) -> Module:
        if isinstance(i, slice):
            return Sequential(OrderedDict(list(self._modules.items())[i]))
        return list(self._modules.values())[self._index(i)]

    def __setitem__(self, i: int, module: Module) -> None:
        key = list(self._modules)[self._index(i)]
        self._modules[key] = _checked(module, "Sequential.__setitem__")

    def __delitem__(self, i: int | slice) -> None:
        keys = list(self._modules)
        for key in (keys[i] if isinstance(i, slice) else [keys[self._index(i)]]):
            del self._modules[key]
        self._renumber()

    def _renumber(self) -> None:
        mods = list(self._modules.values())
        self._modules.clear()
        self._modules.update((str(k), m) for k, m in enumerate(mods))

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def append(self, module: Module) -> Sequential:
        """Add ``module`` at the end (named by its position); returns self."""
        self.add_module(str(len(self._modules)), _checked(module, "Sequential.append"))
        return self

    def extend(self, modules: Iterable[Module]) -> Sequential:
        """Append every module of ``modules``; returns self."""
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        """Put ``module`` before position ``index`` (as list.insert; the modules are renumbered); returns self."""
        n = len(self._modules)
        index = operator.index(index)
        if not -n <= index <= n:
            raise IndexError(f"Sequential.insert: index {index} is out of range for {n} modules")
        mods = list(self._modules.values())
        mods.insert(index, _checked(module, "Sequential.insert"))
        self._modules.clear()
        self._modules.update((str(k), m) for k, m in enumerate(mods))
        return self

    def pop(self, index: int = -1) -> Module:
        """Remove and return the module at ``index`` (the rest renumbered)."""
        m = self[index]
        del self[index]
        return m


def _checked(m, where: str) -> Module:
    if not isinstance(m, Module):
        raise TypeError(f"{where}: Sequential takes Modules, got {type(m).__name__}")
    return m


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


class MSELoss(Module):
    """Squared error between input and target of one shape, as ``torch.nn.MSELoss``. Differs from torch: shapes
    that differ raise ValueError (torch broadcasts with a warning); no deprecated ``size_average=``/``reduce=``.

    Arguments:
        reduction: "mean", "sum" or "none".
    """

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)
