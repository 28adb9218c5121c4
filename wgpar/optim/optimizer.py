"""Optimizer: parameter groups, per-parameter state, zero_grad and PyTorch-shaped state_dict.

Subclasses name their non-negative hyperparameters in ``_CHECKS`` (``_validate(group)`` checks
them, raising TypeError / ValueError; a subclass with more rules extends it) and implement
``_update(p, grad, group)``: one fused kernel per parameter, built with ``step_kernel`` and launched
with ``dispatch_step``.
A guarded step (``_step_guarded``, GradScaler's) binds a device flag that every step kernel reads
first, returning without a write when it is set: the host need not wait for the flag before the
step. The host-side state (step counts, newly made buffers) is rolled back once the flag is read,
at the next step or when the state is looked at.
``state_dict()`` has PyTorch's structure: ``{"state": {index: {...}},
"param_groups": [{..hyperparameters.., "params": [index, ...]}]}``, indices
counting parameters across groups in order.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import ops
from ..autograd.grad_mode import enable_grad, no_grad
from ..errors import DeviceMismatchError
from ..nn.parameter import Parameter
from ..nn.utils import zero_grad_
from ..runtime import memory_history as _hist
from ..runtime import profiling
from ..runtime.allocator import STORAGE_USAGE
from ..runtime.kernels import WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor

ParamsT = Iterable[Parameter] | Iterable[dict[str, Any]]


class _Required:
    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


def check_number(name: str, value: Any, low: float = 0.0, high: float | None = None,
                 high_open: bool = True) -> float:
    """A real hyperparameter in [low, high) (or [low, high]); TypeError / ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r})")
    v = float(value)
    above = high is not None and (v >= high if high_open else v > high)
    if math.isnan(v) or v < low or above:
        bound = "" if high is None else f" and {'<' if high_open else '<='} {high}"
        raise ValueError(f"Invalid {name}: {value!r} (must be >= {low}{bound})")
    return v


def step_kernel(kernel: Kernel, types: tuple[str, ...], without: tuple[str, ...] = (), **fills: str) -> KernelSpec:
    """``kernel.spec`` for a fused optimizer step: what every step kernel shares
    (``shaders/optim_step.wgsl``: the entry point, the skip flag, the gradient as maximize and L2 weight
    decay make it, torch's lerp) goes in as its ``{{STEP}}`` fill; the family's file holds only its
    update. ``kernel`` declares ``skip: r`` last (the flag, u32)."""
    return kernel.spec(tuple(types) + ("u32",), without=without, STEP=load_source("optim_step"), **fills)


_guard = threading.local()  # .flag: the skip flag of the guarded step this thread is recording
# device -> the flag of unguarded steps: a 4-byte buffer outside the allocator (WebGPU zero-fills it), so
# tensor memory counts (optimizer state in memory_stats) do not see it
_zero_flags: dict = {}


def dispatch_step(kspec: KernelSpec, p: Tensor, buffers: list, params: bytes) -> None:
    """Launch a fused step kernel over ``p``'s elements, one invocation each, with the skip flag."""
    dev = p.device
    flag = getattr(_guard, "flag", None)
    if flag is not None and flag.device is dev:
        skip = flag._storage.buffer
    else:
        skip = _zero_flags.get(dev)
        if skip is None:
            skip = _zero_flags[dev] = dev.create_buffer("no-skip flag", 4, STORAGE_USAGE)
    dev.dispatch(kspec, [*buffers, skip], params, grid(-(-p.numel() // WORKGROUP), dev.max_workgroups))


class Optimizer:
    """Base class of wgpar optimizers (PyTorch's ``torch.optim.Optimizer`` contract).

    Arguments:
        params: an iterable of ``wgpar.nn.Parameter``, or of dicts each with a
            ``"params"`` entry plus hyperparameters overriding ``defaults`` for that group.
        defaults: hyperparameters used where a group does not give its own.
    """

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self._pending: tuple[Any, list] | None = None  # a guarded step's flag readback and rollback records
        self.state: dict[Parameter, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, (Tensor, dict)):
            raise TypeError(f"params should be an iterable of Parameters or of dicts, got a single "
                            f"{type(params).__name__}; pass model.parameters() or a list")
        try:
            groups = list(params)
        except TypeError:
            raise TypeError(f"params should be an iterable of Parameters or of dicts, got "
                            f"{type(params).__name__}") from None
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # -- groups ---------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own hyperparameters (e.g. a new layer to fine-tune)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"a parameter group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("a parameter group needs a 'params' entry")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("parameter groups must be ordered (state_dict relies on the order); got a set, "
                            "pass a list")
        else:
            try:
                params = list(params)
            except TypeError:
                raise TypeError(f"a group's 'params' must be an iterable of Parameters, got "
                                f"{type(params).__name__}") from None
        for i, p in enumerate(params):
            if not isinstance(p, Parameter):
                raise TypeError(f"{type(self).__name__} can only optimize wgpar.nn.Parameter, but params[{i}] is "
                                f"{type(p).__name__}" + ("; wrap it with wgpar.nn.Parameter(t)" if
                                                         isinstance(p, Tensor) else ""))
            if not p.dtype.is_float:
                raise TypeError(f"{type(self).__name__}: params[{i}] has dtype {p.dtype.name}; only float "
                                "parameters can be optimized")
        if len({id(p) for p in params}) != len(params):
            raise ValueError(f"{type(self).__name__}: a parameter group contains the same parameter twice")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError(f"{type(self).__name__}: some parameters appear in more than one parameter group")
        group["params"] = params
        for k, v in self.defaults.items():
            if v is required and k not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {k}")
            group.setdefault(k, v)
        self._validate(group)
        self.param_groups.append(group)

    # (group key, name in the error) of each hyperparameter that must be a real number >= 0
    _CHECKS: tuple[tuple[str, str], ...] = ()

    def _validate(self, group: dict[str, Any]) -> None:
        for key, name in self._CHECKS:
            check_number(name, group[key])

    def _check_gradless(self, i: int, p: Parameter) -> None:
        """Raise for a parameter without device memory that has no gradient (step calls this).

        Such a parameter never gets a device gradient, so skipping it as gradient-less would
        silently train nothing: FSDP frees the parameters it replaced by shards (an optimizer built
        before ``fully_shard`` holds those), and keeps offloaded shards on the host.
        """
        if p.untyped_storage().is_freed:
            raise ValueError(
                f"{type(self).__name__}: params[{i}] (shape {p.shape}) has no device memory: its storage was freed "
                "(a parameter FSDP replaced by its shard, or a shard FSDP offloaded to the host); build the "
                "optimizer from model.parameters() after fully_shard, and step offloaded shards with a host "
                "optimizer (wgpar.distributed.fsdp.HostAdamW)")

    # -- stepping -------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: to None (the default, frees memory) or to zeros in place."""
        zero_grad_([p for group in self.param_groups for p in group["params"]], set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; one fused kernel per parameter, no readback.

        Arguments:
            closure: optional; re-evaluates the model and returns the loss (run with grad enabled).
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self._settle()
        records = getattr(_guard, "records", None)
        with no_grad(), profiling.span(f"{type(self).__name__}.step", "phase", phase="optimizer"):
            for group in self.param_groups:
                for i, p in enumerate(group["params"]):
                    if p.grad is None:
                        self._check_gradless(i, p)
                        continue
                    if records is not None:  # the host state as it was, to restore if the step is skipped
                        before = self._state.get(p)
                        records.append((p, None if before is None else dict(before)))
                    self._step_param(p, group)
        return loss

    # The optimizers whose step is only step kernels (so a guarded step skips all of it on the device).
    _GUARDABLE: set = set()

    def _guardable(self) -> bool:
        cls = type(self)
        return (cls.step is Optimizer.step and cls._step_param is Optimizer._step_param
                and cls._update in Optimizer._GUARDABLE)

    def _step_guarded(self, flag: Tensor, readback, *args, **kwargs) -> Any:
        """``step()`` whose kernels do nothing on the device if ``flag`` (int32 [1]) is nonzero there;
        ``readback`` (a Device.read_later of the flag) tells the host later, which then restores the
        state of a skipped step (``_settle``)."""
        _guard.flag, _guard.records = flag, []
        try:
            loss = self.step(*args, **kwargs)
            self._pending = (readback, _guard.records)
        finally:
            _guard.flag = _guard.records = None
        return loss

    def _settle(self) -> None:
        """Read a guarded step's flag (the GPU has long passed it) and undo its host state if skipped."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        readback, records = pending
        if readback.word() == 0:
            return
        for p, before in records:
            if before is None:
                self._state.pop(p, None)
            else:
                self._state[p] = before

    @property
    def state(self) -> dict[Parameter, dict[str, Any]]:
        """Per-parameter state (PyTorch's ``optimizer.state``); a skipped guarded step is undone first."""
        self._settle()
        return self._state

    @state.setter
    def state(self, value: dict[Parameter, dict[str, Any]]) -> None:
        self._state = value

    def _step_param(self, p: Parameter, group: dict[str, Any]) -> None:
        grad = p.grad
        if grad.shape != p.shape:
            raise RuntimeError(f"{type(self).__name__}: gradient of shape {grad.shape} for a parameter of "
                               f"shape {p.shape}")
        if grad.device is not p.device:
            raise DeviceMismatchError(f"{type(self).__name__}: parameter of shape {p.shape} is on {p.device} but "
                                      f"its gradient is on {grad.device}")
        if p.numel() == 0:
            return
        # Kernels index both as contiguous runs from an offset; a binding may not also be written.
        if not grad.is_contiguous() or grad._storage is p._storage:
            grad = ops.clone(grad)
        target = p if p.is_contiguous() else ops.contiguous(p)
        state = self.state.setdefault(p, {})
        self._update(target, grad, group, state)
        for value in state.values():  # tagged whether or not a memory history records: it may start later
            if isinstance(value, Tensor):
                value._storage.tag(_hist.OPTIMIZER_STATE)
        if target is not p:
            ops.copy_(p, target)
        p._storage.bump_version()

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [...]}`` like PyTorch (state tensors by reference)."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if self.state.get(p):
                    state[index[id(p)]] = dict(self.state[p])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()`` (state tensors are copied onto each parameter's device and dtype)."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError(f"{type(self).__name__}.load_state_dict: expected a dict with 'state' and "
                             f"'param_groups', got {type(state_dict).__name__}")
        saved_groups = list(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} parameter groups, the optimizer has "
                             f"{len(self.param_groups)}")
        by_id: dict[int, Parameter] = {}
        for i, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"loaded state dict's parameter group {i} has {len(saved['params'])} parameters, "
                                 f"the optimizer's has {len(group['params'])}")
            by_id.update({int(k): p for k, p in zip(saved["params"], group["params"])})
        new_groups = []
        for saved, group in zip(saved_groups, self.param_groups):
            g = {k: v for k, v in saved.items() if k != "params"}
            if isinstance(g.get("betas"), list):
                g["betas"] = tuple(g["betas"])
            for name, default in self.defaults.items():
                g.setdefault(name, default)
            g["params"] = group["params"]
            self._validate(g)
            new_groups.append(g)
        new_state: dict[Parameter, dict[str, Any]] = {}
        for k, entry in state_dict["state"].items():
            p = by_id.get(int(k))
            if p is None:
                raise ValueError(f"loaded state dict has state for parameter {k}, which no group lists")
            new_state[p] = {name: _load_value(name, v, p) for name, v in entry.items()}
        self.param_groups = new_groups
        self.state = new_state

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {group[k]}" for k in sorted(group) if k != "params"]
        return "\n".join(lines + [")"])


def _load_value(name: str, value: Any, p: Parameter) -> Any:
    if name == "step":
        return int(value.item()) if isinstance(value, (Tensor, np.ndarray)) else int(value)
    if isinstance(value, np.ndarray):
        value = Tensor.from_numpy(value, device=p.device, dtype=p.dtype)
    if not isinstance(value, Tensor):
        return value
    if value.shape != p.shape:
        raise ValueError(f"loaded optimizer state {name!r} has shape {value.shape}, its parameter has {p.shape}")
    # Always a private copy: the same state_dict may be loaded into several optimizers.
    if value.device is not p.device:
        value = ops.to_device(value, p.device)
        return value if value.dtype is p.dtype else ops.cast(value, p.dtype)
    return ops.clone(value) if value.dtype is p.dtype else ops.cast(value, p.dtype)
