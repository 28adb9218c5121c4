"""Tensor methods and operators of the registry's ops (ops/registry.py), generated and installed, and
Tensor's hook to the differentiable ops (differentiable.py, composites.py, einsum.py).

Each public op gets its method (``x.exp()``, ``x.maximum(y)``), its operators (``__add__`` and the
reflected ``__radd__``, ``__neg__``) and, where it has one, its in-place forms (``x.add_(y)``,
``__iadd__``); all of them call the differentiable ops of autograd/differentiable.py.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from ..creation import full, tensor
from ..ops.registry import OPS, Op
from ..tensor import Tensor, install_ops
from . import composites as C
from . import differentiable as D
from .einsum import einsum

_NOT_REFLECTED = {"eq", "ne", "lt", "le", "gt", "ge"}  # Python swaps a comparison's operands itself


def function(op: Op) -> Callable:
    """The differentiable function of ``op``: ``f(x)`` or ``f(a, b)`` (``f(a, b, alpha=1)`` with alpha)."""
    name = op.name
    if op.arity == 1:
        def f(x: Tensor) -> Tensor:
            return D.unary(name, x)
    elif op.alpha:
        def f(a, b, alpha=1) -> Tensor:
            return D.binary(name, a, b if alpha == 1 else b * alpha)
    else:
        def f(a, b) -> Tensor:
            return D.binary(name, a, b)
    f.__name__ = f.__qualname__ = op.api
    args = "x: a tensor." if op.arity == 1 else "a, b: tensors (broadcast together) or Python / NumPy numbers."
    if op.alpha:
        args += "\n    alpha: b is scaled by it first."
    f.__doc__ = (f"{_summary(op)}.\n\nElementwise; in WGSL ``{op.expr}`` (its entry in wgpar/ops/registry.py)."
                 f"\n\nArguments:\n    {args}\n")
    return f


def _summary(op: Op) -> str:
    return op.doc or f"Elementwise {op.api}"


def _method(name: str, f: Callable, doc: str) -> Callable:
    f.__name__ = name
    f.__qualname__ = f"Tensor.{name}"
    f.__doc__ = doc
    return f


def methods(op: Op) -> dict[str, Callable]:
    """Every Tensor attribute ``op`` defines, by name."""
    name, api = op.name, op.api
    what = _summary(op)
    out = {api: _method(api, function(op), f"{what}; elementwise, self as {'x' if op.arity == 1 else 'a'} "
                                            f"(wgpar.{api}).")}
    if op.dunder and op.arity == 1:
        out[f"__{op.dunder}__"] = _method(f"__{op.dunder}__", lambda self: D.unary(name, self), f"{api}(self)")
    elif op.dunder:
        out[f"__{op.dunder}__"] = _method(f"__{op.dunder}__", lambda self, o: D.binary(name, self, o),
                                          f"{api}(self, other)")
        if op.dunder not in _NOT_REFLECTED:
            out[f"__r{op.dunder}__"] = _method(f"__r{op.dunder}__", lambda self, o: D.binary(name, o, self),
                                               f"{api}(other, self)")
    if op.inplace:
        if op.alpha:
            def inplace(self, o, alpha=1):
                return D.inplace(name, self, o if alpha == 1 else o * alpha)
        else:
            def inplace(self, o):
                return D.inplace(name, self, o)
        note = "in place, outside the autograd graph (a parameter under no_grad, a buffer); returns self"
        out[f"{api}_"] = _method(f"{api}_", inplace, f"self = {api}(self, other), {note}. {what}.")
        out[f"__i{op.dunder}__"] = _method(f"__i{op.dunder}__", lambda self, o: D.inplace(name, self, o),
                                           f"self = {api}(self, other), {note}.")
    return out


def _dims_arg(dims: tuple):
    """A method's dims given as ints or as one sequence (``x.flip(0, 1)``, ``x.flip((0, 1))``)."""
    return dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims


def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """At most ``chunks`` views along ``dim``, of ceil(n / chunks) entries each (wgpar.chunk)."""
    return C.chunk(self, chunks, dim)


def split(self, split_size, dim: int = 0) -> tuple[Tensor, ...]:
    """Views along ``dim`` of ``split_size`` entries each, or of the listed sizes (wgpar.split)."""
    return C.split(self, split_size, dim)


def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices along ``dim``, that dim removed (wgpar.unbind)."""
    return C.unbind(self, dim)


def tril(self, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims, zeros above ``diagonal`` (wgpar.tril)."""
    return C.tril(self, diagonal)


def triu(self, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims, zeros below ``diagonal`` (wgpar.triu)."""
    return C.triu(self, diagonal)


def flip(self, *dims) -> Tensor:
    """A copy with the entries reversed along ``dims`` (ints or one sequence; wgpar.flip)."""
    return C.flip(self, _dims_arg(dims))


def roll(self, shifts, dims=None) -> Tensor:
    """A copy shifted by ``shifts`` along ``dims``, wrapping around (wgpar.roll)."""
    return C.roll(self, shifts, dims)


def prod(self, dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """The product over ``dim`` (None: every element); exact gradients with zeros (wgpar.prod)."""
    return C.prod(self, dim, keepdim, dtype)


def median(self, dim=None, keepdim: bool = False):
    """The median (the lower middle value): 0-d without ``dim``, else (values, indices) along it (wgpar.median)."""
    return C.median(self, dim, keepdim)


def any(self, dim=None, keepdim: bool = False) -> Tensor:
    """Whether any element (over ``dim``) is nonzero, as bool (wgpar.any)."""
    return C.any_(self, dim, keepdim)


def all(self, dim=None, keepdim: bool = False) -> Tensor:
    """Whether every element (over ``dim``) is nonzero, as bool (wgpar.all)."""
    return C.all_(self, dim, keepdim)


def norm(self, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """The p-norm over ``dim`` (None: every element); "nuc" raises (wgpar.norm, wgpar.linalg.vector_norm)."""
    return C.norm(self, p, dim, keepdim, dtype)


def logsumexp(self, dim, keepdim: bool = False) -> Tensor:
    """log(sum(exp(self))) over ``dim``, stably (wgpar.logsumexp)."""
    return C.logsumexp(self, dim, keepdim)


def outer(self, vec2: Tensor) -> Tensor:
    """The outer product with another 1-d tensor (wgpar.outer)."""
    return C.outer(self, vec2)


def diag(self, diagonal: int = 0) -> Tensor:
    """1-d: the matrix with self on a diagonal; 2-d: a copy of a diagonal (wgpar.diag)."""
    return C.diag(self, diagonal)


def isclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """Where self and other are close, as bool (wgpar.isclose)."""
    return C.isclose(self, other, rtol, atol, equal_nan)


def allclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """Whether self and other are close everywhere, a Python bool (reads one value back; wgpar.allclose)."""
    return C.allclose(self, other, rtol, atol, equal_nan)


def cumsum(self, dim: int, dtype=None) -> Tensor:
    """The running sum along ``dim``; int32 and bool give int32 that wraps (PyTorch: int64; wgpar.cumsum)."""
    return C.cumsum(self, dim, dtype)


def cumprod(self, dim: int, dtype=None) -> Tensor:
    """The running product along ``dim``, exact gradients with zeros; int32 wraps (PyTorch: int64;
    wgpar.cumprod)."""
    return C.cumprod(self, dim, dtype)


def gather(self, dim: int, index, *, sparse_grad: bool = False) -> Tensor:
    """Entries along ``dim`` picked by an int32 index of the same number of dims (wgpar.gather)."""
    return C.gather(self, dim, index, sparse_grad=sparse_grad)


def scatter(self, dim: int, index, src=None, *, value=None, reduce=None) -> Tensor:
    """A copy with ``src`` (a tensor or a number) written at ``index`` along ``dim``; of repeated indices the
    last wins (PyTorch: undefined; wgpar.scatter)."""
    return C.scatter(self, dim, index, src, value=value, reduce=reduce)


def scatter_(self, dim: int, index, src=None, *, value=None, reduce=None) -> Tensor:
    """``scatter`` in place, outside the autograd graph; returns self."""
    return C.scatter_(self, dim, index, src, value=value, reduce=reduce)


def scatter_add(self, dim: int, index, src) -> Tensor:
    """A copy with ``src`` added at ``index`` along ``dim``, repeated indices in index order (wgpar.scatter_add)."""
    return C.scatter_add(self, dim, index, src)


def scatter_add_(self, dim: int, index, src) -> Tensor:
    """``scatter_add`` in place, outside the autograd graph; returns self."""
    return C.scatter_add_(self, dim, index, src)


def index_add(self, dim: int, index, source, *, alpha=1) -> Tensor:
    """A copy with ``alpha * source`` added at the 1-d ``index`` along ``dim`` (wgpar.index_add)."""
    return C.index_add(self, dim, index, source, alpha=alpha)


def index_add_(self, dim: int, index, source, *, alpha=1) -> Tensor:
    """``index_add`` in place, outside the autograd graph; returns self."""
    return C.index_add_(self, dim, index, source, alpha=alpha)


def nonzero(self, *, as_tuple: bool = False):
    """The int32 positions of the nonzero entries, [count, ndim] or one tensor per dim; reads the count back
    (a host sync; wgpar.nonzero)."""
    return C.nonzero(self, as_tuple=as_tuple)


def argwhere(self) -> Tensor:
    """``nonzero()``: the [count, ndim] int32 positions of the nonzero entries (wgpar.argwhere)."""
    return C.argwhere(self)


def masked_select(self, mask) -> Tensor:
    """The entries where the bool ``mask`` (broadcast) is True, 1-d; reads the count back (wgpar.masked_select)."""
    return C.masked_select(self, mask)


def clamp_min(self, min) -> Tensor:
    """``clamp(self, min=min)``: values below ``min`` (a number or tensor) raised to it; NaN stays NaN."""
    return D.clamp(self, min, None)


def clamp_max(self, max) -> Tensor:
    """``clamp(self, max=max)``: values above ``max`` (a number or tensor) lowered to it; NaN stays NaN."""
    return D.clamp(self, None, max)


def _new(self, size, value, dtype, device, requires_grad) -> Tensor:
    size = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    return full(tuple(size), value, dtype=self.dtype if dtype is None else dtype,
                device=self.device if device is None else device, requires_grad=requires_grad)


def new_zeros(self, *size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Zeros of ``size`` with this tensor's dtype and device unless given (as PyTorch)."""
    return _new(self, size, 0, dtype, device, requires_grad)


def new_ones(self, *size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Ones of ``size`` with this tensor's dtype and device unless given (as PyTorch)."""
    return _new(self, size, 1, dtype, device, requires_grad)


def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` everywhere in a tensor of ``size``, this tensor's dtype and device unless given."""
    return _new(self, (size,), fill_value, dtype, device, requires_grad)


def new_tensor(self, data, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A copy of ``data`` (a list, array, number or tensor) with this tensor's dtype and device unless given
    (as PyTorch: not the dtype the data would infer)."""
    return tensor(data, device=self.device if device is None else device,
                  dtype=self.dtype if dtype is None else dtype, requires_grad=requires_grad)


def _get_data(self) -> Tensor:
    """A tensor outside the autograd graph sharing this one's storage (as PyTorch's ``.data``): writes
    through it change this tensor without the version check that guards backward, so ``detach()``
    is the safer spelling. Assigning ``t.data = other`` makes ``t`` a view of ``other``'s storage
    (shape, strides and dtype included), keeping ``t``'s graph state and ``.grad``."""
    return self.detach()


def _set_data(self, other: Tensor) -> None:
    if not isinstance(other, Tensor):
        raise TypeError(f"Tensor.data must be set to a wgpar.Tensor, got {type(other).__name__}")
    self._storage, self._shape, self._strides, self._offset = (other._storage, other._shape, other._strides,
                                                               other._offset)
    self.__dict__.pop("_known_range", None)  # the value range known for the old storage


_HAND_WRITTEN = [chunk, split, unbind, tril, triu, flip, roll, prod, any, all, norm, logsumexp, outer, diag, isclose,
                 allclose, cumsum, cumprod, gather, scatter, scatter_, scatter_add,
                 scatter_add_, index_add, index_add_, nonzero, argwhere, masked_select, median,
                 clamp_min, clamp_max, new_zeros, new_ones, new_full, new_tensor]


def install() -> None:
    """Connect Tensor to this layer: its hook (``tensor.install_ops``) to the differentiable ops, and
    the methods and operators of every public op of the registry."""
    install_ops(SimpleNamespace(**{n: getattr(D, n) for n in D.__all__}, **{n: getattr(C, n) for n in C.__all__},
                                einsum=einsum))
    for op in OPS.values():
        if op.api:
            for attr, fn in methods(op).items():
                setattr(Tensor, attr, fn)
    for fn in _HAND_WRITTEN:
        _method(fn.__name__, fn, fn.__doc__)
        setattr(Tensor, fn.__name__, fn)
    Tensor.data = property(_get_data, _set_data, doc=_get_data.__doc__)
