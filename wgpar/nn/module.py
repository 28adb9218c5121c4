"""Module: PyTorch's container for parameters, buffers and sub-modules."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..tensor import Tensor
from .parameter import Parameter


class Module:
    """Base class of layers and models: assign Parameters and Modules as attributes."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # -- registration ---------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        for store in (self._parameters, self._buffers, self._modules):
            store.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor: Tensor | None) -> None:
        """A non-trainable tensor saved in state_dict (e.g. running statistics)."""
        self._buffers[name] = tensor

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._parameters[name] = param

    def add_module(self, name: str, module: Module | None) -> None:
        self._modules[name] = module

    # -- traversal ------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        stack = [(prefix, self)]
        seen = set()
        while stack:
            name, m = stack.pop(0)
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield name, m
            stack[0:0] = [(f"{name}.{k}" if name else k, c) for k, c in m._modules.items() if c is not None]

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator[Module]:
        for m in self._modules.values():
            if m is not None:
                yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for k, m in self._modules.items():
            if m is not None:
                yield k, m

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        seen = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mname, m in mods:
            for k, p in m._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mname}.{k}" if mname else k), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        for mname, m in self.named_modules(prefix):
            for k, b in m._buffers.items():
                if b is not None:
                    yield (f"{mname}.{k}" if mname else k), b

    def buffers(self) -> Iterator[Tensor]:
        for _, b in self.named_buffers():
            yield b

    # -- modes ----------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        from .utils import zero_grad_

        zero_grad_(self.parameters(), set_to_none)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)  # refuses integer parameters, as in PyTorch
        return self

    # -- devices --------------------------------------------------------------------------
    def to(self, device=None, dtype=None) -> Module:
        """Move (or convert) every parameter and buffer in place of the old ones; returns self."""
        for m in self.modules():
            for k, p in list(m._parameters.items()):
                if p is not None:
                    m._parameters[k] = Parameter(p.detach().to(device=device, dtype=dtype), p.requires_grad)
            for k, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[k] = b.to(device=device, dtype=dtype)
        return self

    @property
    def device(self):
        p = next(self.parameters(), None)
        return p.device if p is not None else None

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, Tensor]:
        """Parameters and buffers by dotted name (the tensors themselves, detached)."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for k, p in self.named_parameters():
            out[k] = p.detach()
        for k, b in self.named_buffers():
            out[k] = b.detach()
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy values (Tensors or NumPy arrays) into the existing parameters and buffers.

        Raises KeyError for missing or unexpected keys (when strict) and ValueError for a shape
        mismatch, naming the key and both shapes. Returns (missing, unexpected).
        """
        from ..autograd.grad_mode import no_grad

        own = dict(self.named_parameters()) | dict(self.named_buffers())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict for {type(self).__name__}: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        for k, target in own.items():
            if k not in state:
                continue
            value = state[k]
            shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
            if shape != target.shape:
                raise ValueError(f"load_state_dict: {k!r} has shape {shape} in the state dict but "
                                 f"{target.shape} in the model")
            if not isinstance(value, Tensor):
                value = Tensor.from_numpy(np.asarray(value), device=target.device, dtype=target.dtype)
            elif value.device is not target.device:
                value = value.to(target.device)
            with no_grad():
                target.copy_(value)
        return missing, unexpected

    # -- calling --------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for k, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({k}): {sub}")
        return "\n".join(lines) + ("\n)" if len(lines) > 1 else ")")
