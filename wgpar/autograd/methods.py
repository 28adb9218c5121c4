"""Tensor methods and operators of the registry's ops (ops/registry.py), generated and installed, and
Tensor's hook to the differentiable ops.

Each public op gets its method (``x.exp()``, ``x.maximum(y)``), its operators (``__add__`` and the
reflected ``__radd__``, ``__neg__``) and, where it has one, its in-place forms (``x.add_(y)``,
``__iadd__``); all of them call the differentiable ops of autograd/functions.py.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ops.registry import OPS, Op
from ..tensor import Tensor, install_ops
from . import functions as F

_NOT_REFLECTED = {"eq", "ne", "lt", "le", "gt", "ge"}  # Python swaps a comparison's operands itself


def function(op: Op) -> Callable:
    """The differentiable function of ``op``: ``f(x)`` or ``f(a, b)`` (``f(a, b, alpha=1)`` with alpha)."""
    name = op.name
    if op.arity == 1:
        def f(x: Tensor) -> Tensor:
            return F.unary(name, x)
    elif op.alpha:
        def f(a, b, alpha=1) -> Tensor:
            return F.binary(name, a, b if alpha == 1 else b * alpha)
    else:
        def f(a, b) -> Tensor:
            return F.binary(name, a, b)
    f.__name__ = f.__qualname__ = op.api
    args = "x: a tensor." if op.arity == 1 else "a, b: tensors (broadcast together) or Python / NumPy numbers."
    if op.alpha:
        args += "\n    alpha: b is scaled by it first."
    f.__doc__ = (f"Elementwise {op.api}: ``{op.expr}`` in WGSL (its entry in wgpar/ops/registry.py).\n\n"
                 f"Arguments:\n    {args}\n")
    return f


def _method(name: str, f: Callable, doc: str) -> Callable:
    f.__name__ = name
    f.__qualname__ = f"Tensor.{name}"
    f.__doc__ = doc
    return f


def methods(op: Op) -> dict[str, Callable]:
    """Every Tensor attribute ``op`` defines, by name."""
    name, api = op.name, op.api
    out = {api: _method(api, function(op), f"Elementwise {api} of this tensor (see wgpar.{api}).")}
    if op.dunder and op.arity == 1:
        out[f"__{op.dunder}__"] = _method(f"__{op.dunder}__", lambda self: F.unary(name, self), f"{api}(self)")
    elif op.dunder:
        out[f"__{op.dunder}__"] = _method(f"__{op.dunder}__", lambda self, o: F.binary(name, self, o),
                                          f"{api}(self, other)")
        if op.dunder not in _NOT_REFLECTED:
            out[f"__r{op.dunder}__"] = _method(f"__r{op.dunder}__", lambda self, o: F.binary(name, o, self),
                                               f"{api}(other, self)")
    if op.inplace:
        if op.alpha:
            def inplace(self, o, alpha=1):
                return F.inplace(name, self, o if alpha == 1 else o * alpha)
        else:
            def inplace(self, o):
                return F.inplace(name, self, o)
        out[f"{api}_"] = _method(f"{api}_", inplace, f"In-place {api}: self = {api}(self, other).")
        out[f"__i{op.dunder}__"] = _method(f"__i{op.dunder}__", lambda self, o: F.inplace(name, self, o),
                                           f"self = {api}(self, other), in place")
    return out


def install() -> None:
    """Connect Tensor to this layer: its hook (``tensor.install_ops``) to the differentiable ops, and
    the methods and operators of every public op of the registry."""
    install_ops(F)
    for op in OPS.values():
        if op.api:
            for attr, fn in methods(op).items():
                setattr(Tensor, attr, fn)
