"""Module: PyTorch's container for parameters, buffers and sub-modules."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..hooks import RemovableHandle, add_hook
from ..runtime import memory_history as _hist
from ..tensor import Tensor
from .parameter import Parameter


class Module:
    """Base class of layers and models: assign Parameters and Modules as attributes."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        # Per module, id -> (hook, with_kwargs); see register_forward_pre_hook / register_forward_hook.
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        # Set by the first registration: one attribute test is all a module without hooks pays per call.
        object.__setattr__(self, "_has_forward_hooks", False)

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
            if isinstance(value, (list, tuple, dict)):
                _warn_if_holds_modules(self, name, value)
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
        """Register ``param`` (or None: a declared, absent parameter) under ``name``."""
        self._parameters[name] = param

    def add_module(self, name: str, module: Module | None) -> None:
        """Register ``module`` as the child ``name`` (as assigning the attribute does)."""
        self._modules[name] = module

    # -- traversal ------------------------------------------------------------------------
    def named_modules(self, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """(dotted name, module) for self ("") and every sub-module, depth first, each module once (under
        every name it has with ``remove_duplicate=False``, as torch's)."""
        stack = [(prefix, self)]
        seen = set()
        while stack:
            name, m = stack.pop(0)
            if remove_duplicate and id(m) in seen:
                continue
            seen.add(id(m))
            yield name, m
            stack[0:0] = [(f"{name}.{k}" if name else k, c) for k, c in m._modules.items() if c is not None]

    def modules(self) -> Iterator[Module]:
        """Self and every sub-module, as ``named_modules``."""
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator[Module]:
        """The direct sub-modules."""
        for m in self._modules.values():
            if m is not None:
                yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """(name, module) of the direct sub-modules."""
        for k, m in self._modules.items():
            if m is not None:
                yield k, m

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) of every parameter, each once (a shared one under its first name), or
        under every name it has with ``remove_duplicate=False`` (as torch's)."""
        seen = set()
        mods = self.named_modules(prefix, remove_duplicate) if recurse else [(prefix, self)]
        for mname, m in mods:
            for k, p in m._parameters.items():
                if p is None or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                yield (f"{mname}.{k}" if mname else k), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Every parameter once (what an optimizer takes); only self's with ``recurse=False``."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """(dotted name, buffer) of every registered buffer that is not None, each once, or under every name
        it has with ``remove_duplicate=False`` (as torch's)."""
        seen = set()
        for mname, m in self.named_modules(prefix, remove_duplicate):
            for k, b in m._buffers.items():
                if b is None or (remove_duplicate and id(b) in seen):
                    continue
                seen.add(id(b))
                yield (f"{mname}.{k}" if mname else k), b

    def buffers(self) -> Iterator[Tensor]:
        """Every registered buffer that is not None."""
        for _, b in self.named_buffers():
            yield b

    # -- modes ----------------------------------------------------------------------------
    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn(module)`` on every sub-module (children first, recursively), then on self; returns
        self. Typically used to initialise weights: ``model.apply(init_fn)``.

        Arguments:
            fn: the function to call on each module.
        """
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def train(self, mode: bool = True) -> Module:
        """Set training mode (``mode=False``: eval mode) on self and every sub-module; returns self."""
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        """Eval mode (dropout off, batch norm on its running statistics); returns self."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: to None (the default), or to zeros in place."""
        from .utils import zero_grad_

        zero_grad_(self.parameters(), set_to_none)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set ``requires_grad`` on every parameter (False freezes them); returns self."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)  # refuses integer parameters, as in PyTorch
        return self

    # -- devices --------------------------------------------------------------------------
    def to(self, device=None, dtype=None) -> Module:
        """Move and/or convert every parameter and buffer in place; returns self (as torch.nn.Module.to).

        ``m.to(dev)``, ``m.to(wgpar.float16)``, ``m.to(dev, dtype)``. Parameters stay the same objects
        (their data is replaced, as torch's ``param.data = ...``), so optimizers built before keep working
        and a parameter shared by several modules (tied weights) stays one parameter. ``dtype`` converts
        floating-point tensors only; integer buffers keep their type. Gradients move and convert with
        their parameters.

        Arguments:
            device: a Device, an index or ``"wgpu:N"`` (or a dtype, when it is the only argument).
            dtype: a floating-point dtype.
        """
        if dtype is None and device is not None and _dt.is_dtype(device):
            device, dtype = None, device
        if dtype is not None:
            dtype = _dt.as_dtype(dtype)
            if not dtype.is_float:
                raise TypeError(f"Module.to only accepts floating point dtypes, got {dtype.name}")

        def convert(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype if t.dtype.is_float else None)

        done: set[int] = set()
        for m in self.modules():
            for p in m._parameters.values():
                if p is None or id(p) in done:
                    continue
                done.add(id(p))
                _replace_data(p, convert(p.detach()))
                if p.grad is not None:
                    p.grad = convert(p.grad)
                    p.grad._storage.tag(_hist.GRADIENT)
            for k, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[k] = convert(b)
        return self

    def cuda(self, device=None) -> Module:
        """Raises ValueError: wgpar has no CUDA device; the message says how to choose an adapter
        (``wgpar.device(i)``, ``WGPAR_ADAPTER``) and ``to(device)`` moves a module to it."""
        from ..runtime.adapters import NO_CUDA

        raise ValueError(f"{type(self).__name__}.cuda(): {NO_CUDA}; .to(device) moves a module to it")

    def half(self) -> Module:
        """Convert floating-point parameters and buffers to float16 in place (``to(wgpar.float16)``)."""
        return self.to(dtype=_dt.float16)

    def float(self) -> Module:
        """Convert floating-point parameters and buffers to float32 in place (``to(wgpar.float32)``)."""
        return self.to(dtype=_dt.float32)

    @property
    def device(self):
        """The device of the module's first parameter, None if it has none (torch Modules have no such attribute)."""
        p = next(self.parameters(), None)
        return p.device if p is not None else None

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, Tensor]:
        """Parameters and buffers by dotted name (the tensors themselves, detached). A shared (tied) one
        appears under every name it has, as in torch, so torch's state dicts and wgpar's match."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for k, p in self.named_parameters(remove_duplicate=False):
            out[k] = p.detach()
        for k, b in self.named_buffers(remove_duplicate=False):
            out[k] = b.detach()
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy values (Tensors or NumPy arrays) into the existing parameters and buffers.

        A shared (tied) tensor loads from any of its names: a dict with all of them (torch's layout) or
        one of them (what named_parameters lists) both load; names of one tensor that hold different
        values raise ValueError naming them. Raises KeyError for missing or unexpected keys (when strict)
        and ValueError for a shape mismatch, naming the key and both shapes. Returns (missing, unexpected).
        """
        from ..autograd.grad_mode import no_grad

        names: dict[int, list[str]] = {}
        tensors: dict[int, Tensor] = {}
        for k, t in [*self.named_parameters(remove_duplicate=False), *self.named_buffers(remove_duplicate=False)]:
            names.setdefault(id(t), []).append(k)
            tensors[id(t)] = t
        known = {k for ks in names.values() for k in ks}
        missing = [k for ks in names.values() if not any(k in state for k in ks) for k in ks]
        unexpected = [k for k in state if k not in known]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict for {type(self).__name__}: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        for key, ks in names.items():
            target = tensors[key]
            given = [k for k in ks if k in state]
            values = []
            for k in given:
                value = state[k]
                shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
                if shape != target.shape:
                    raise ValueError(f"load_state_dict: {k!r} has shape {shape} in the state dict but "
                                     f"{target.shape} in the model")
                values.append(value)
            if len(values) > 1 and any(v is not values[0] for v in values[1:]):
                host = [v.numpy() if isinstance(v, Tensor) else np.asarray(v) for v in values]
                if not all(np.array_equal(host[0], h, equal_nan=True) for h in host[1:]):
                    raise ValueError(f"load_state_dict: {given} name one shared parameter of "
                                     f"{type(self).__name__} but hold different values")
            if not values:
                continue
            value = values[0]
            if not isinstance(value, Tensor):
                value = Tensor.from_numpy(np.asarray(value), device=target.device, dtype=target.dtype)
            elif value.device is not target.device:
                value = value.to(target.device)
            with no_grad():
                target.copy_(value)
        return missing, unexpected

    # -- calling --------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        """The computation; subclasses define it and callers call the module (which runs the hooks)."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def __call__(self, *args, **kwargs):
        if self._has_forward_hooks:
            return self._call_with_hooks(args, kwargs)
        return self.forward(*args, **kwargs)

    def _call_with_hooks(self, args: tuple, kwargs: dict):
        # Snapshots: a hook may remove itself or another one; that counts from the next call (as in torch).
        for hook, with_kwargs in tuple(self._forward_pre_hooks.values()):
            if with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(f"forward pre-hook {_hook_name(hook)} of {type(self).__name__} must "
                                           f"return None or a tuple (new_args, new_kwargs), got {result!r}")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        output = self.forward(*args, **kwargs)
        for hook, with_kwargs in tuple(self._forward_hooks.values()):
            result = hook(self, args, kwargs, output) if with_kwargs else hook(self, args, output)
            if result is not None:
                output = result
        return output

    def register_forward_pre_hook(self, hook: Callable[..., Any], *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """Run ``hook(module, args)`` before every ``forward`` (as ``torch.nn.Module``'s does).

        The hook may return None (args unchanged) or new positional args (a non-tuple is wrapped in
        a 1-tuple). With ``with_kwargs`` it is called as ``hook(module, args, kwargs)`` and returns
        None or ``(new_args, new_kwargs)``. Hooks run in registration order, in ``__call__`` (not in
        ``forward``); an exception in one propagates and ``forward`` does not run.

        Arguments:
            hook: the callable.
            prepend: run before the pre-hooks already registered instead of after them.
            with_kwargs: pass (and let the hook replace) the keyword arguments too.

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        object.__setattr__(self, "_has_forward_hooks", True)
        return add_hook(self._forward_pre_hooks, (hook, with_kwargs), prepend)

    def register_forward_hook(self, hook: Callable[..., Any], *, prepend: bool = False,
                              with_kwargs: bool = False) -> RemovableHandle:
        """Run ``hook(module, args, output)`` after every ``forward`` (as ``torch.nn.Module``'s does).

        ``args`` are the positional args forward received (after the pre-hooks). The hook may return
        None (output unchanged) or a replacement output, which later hooks and the caller see. With
        ``with_kwargs`` it is called as ``hook(module, args, kwargs, output)``.

        Arguments:
            hook: the callable.
            prepend: run before the forward hooks already registered instead of after them.
            with_kwargs: pass the keyword arguments too.

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        object.__setattr__(self, "_has_forward_hooks", True)
        return add_hook(self._forward_hooks, (hook, with_kwargs), prepend)

    def extra_repr(self) -> str:
        """The text inside the parentheses of the module's repr (its settings)."""
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for k, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({k}): {sub}")
        return "\n".join(lines) + ("\n)" if len(lines) > 1 else ")")


def _replace_data(p: Tensor, new: Tensor) -> None:
    """Point ``p`` at ``new``'s memory (torch's ``param.data = new``): same object, new storage."""
    if new is p:
        return
    p._storage, p._shape, p._strides, p._offset = new._storage, new._shape, new._strides, new._offset
    if isinstance(p, Parameter):  # its new memory is a parameter's on the memory timeline
        p._storage.tag(_hist.PARAMETER)


_WARNED: set[tuple[str, str]] = set()


def _warn_if_holds_modules(owner: Module, name: str, value: list | tuple | dict) -> None:
    """Warn (once per class and attribute) that Modules kept in a plain container are not registered:
    their parameters would be missing from parameters(), state_dict(), to() and train(), silently."""
    items = value.values() if isinstance(value, dict) else value
    if not any(isinstance(v, Module) for v in items):
        return
    key = (type(owner).__qualname__, name)
    if key in _WARNED:
        return
    _WARNED.add(key)
    kind = type(value).__name__
    container = "nn.ModuleDict" if isinstance(value, dict) else "nn.ModuleList (or nn.Sequential)"
    warnings.warn(f"{type(owner).__name__}.{name} is a {kind} holding Modules: they are not registered, so their "
                  f"parameters are missing from parameters(), state_dict(), to() and train(); use {container}",
                  UserWarning, stacklevel=3)


def _hook_name(hook) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)
