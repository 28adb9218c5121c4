"""Host optimizers for offloaded shards (``OffloadPolicy``): SGD, Adam and AdamW stepped with NumPy.

They keep wgpar's (and PyTorch's) semantics, hyperparameters and ``state_dict`` layout, and take
``model.parameters()`` of an offloaded model (``OffloadedShard`` objects, whose values and
gradients are host arrays). A unit's shards lie one after another in one flat host array, and so
do their gradients and this optimizer's state, so parameters that are neighbours in all three
(the usual case: a unit's parameters in order) are updated as one run: one vectorised update per
unit, in float32, in the same order of operations as the WGSL kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...optim.adam import Adam, AdamW
from ...optim.sgd import SGD
from .param import OffloadedShard


class _Run:
    __slots__ = ("params", "data", "grad", "state", "step")

    def __init__(self, params, data, grad, state, step) -> None:
        self.params = params
        self.data = data
        self.grad = grad
        self.state = state
        self.step = step


class _HostStepping:
    """Mixed into SGD / Adam: the update runs on the host over runs of neighbouring shards."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        params = param_group.get("params")
        params = [params] if isinstance(params, OffloadedShard) else list(params or ())
        for i, p in enumerate(params):
            if not isinstance(p, OffloadedShard):
                raise TypeError(f"{type(self).__name__} steps shards that FSDP offloaded to the host (OffloadPolicy); "
                                f"params[{i}] is a {type(p).__name__} of shape {tuple(p.shape)} on "
                                f"{getattr(p, 'device', '?')}: use the device optimizer for it")
        super().add_param_group({**param_group, "params": params})

    def _check_gradless(self, i: int, p) -> None:
        pass  # offloaded shards have no device memory by design

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.clear_host_grad(set_to_none)

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        raise NotImplementedError

    def _state_arrays(self, p: OffloadedShard, names: tuple[str, ...]) -> dict[str, Any]:
        """This parameter's state, its arrays views into per-unit flat arrays (made on first use)."""
        state = self.state.setdefault(p, {"step": 0})
        missing = [name for name in names if name not in state]
        if missing:
            flats = self.__dict__.setdefault("_flat_state", {})
            key = id(p.host_flat)
            if key not in flats or flats[key][0] is not p.host_flat:
                flats[key] = (p.host_flat, {})
            arrays = flats[key][1]
            n, off = p.numel(), p.host_offset
            for name in missing:
                if name not in arrays:
                    arrays[name] = np.zeros_like(p.host_flat)
                state[name] = arrays[name][off:off + n].reshape(p.shape)
        return state

    def _runs(self, group: dict[str, Any]) -> list[_Run]:
        runs: list[_Run] = []
        names = self._state_names(group)
        for p in group["params"]:
            if p.host_grad is None:
                continue
            state = self._state_arrays(p, names)
            last = runs[-1] if runs else None
            n = p.numel()
            if (last is not None and last.step == state["step"] and _follows(last.data, p.host_flat, p.host_offset)
                    and _follows(last.grad, p.host_grad_flat, p.host_grad_offset)
                    and all(_follows(last.state[k], _base(state[k]), p.host_offset) for k in last.state)):
                last.params.append(p)
                last.data = _extend(last.data, n)
                last.grad = _extend(last.grad, n)
                last.state = {k: _extend(v, n) for k, v in last.state.items()}
                continue
            runs.append(_Run([p], p.host_flat[p.host_offset:p.host_offset + n],
                             p.host_grad_flat[p.host_grad_offset:p.host_grad_offset + n],
                             {k: _base(state[k])[p.host_offset:p.host_offset + n] for k in names},
                             state["step"]))
        return runs

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every offloaded shard that has a gradient, on the host."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for run in self._runs(group):
                self._host_update(run, group)
                for p in run.params:
                    self.state[p]["step"] = run.step + 1
                    p._storage.bump_version()  # gathered copies of these shards are stale now
        return loss

    def _host_update(self, run: _Run, group: dict[str, Any]) -> None:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()`` (arrays copied into this optimizer's flat state, on the host)."""
        saved = state_dict.get("state", {}) if isinstance(state_dict, dict) else {}
        super().load_state_dict({**state_dict, "state": {}})
        params = [p for group in self.param_groups for p in group["params"]]
        self.state = {}
        for k, entry in saved.items():
            p = params[int(k)]
            state = self._state_arrays(p, tuple(n for n in entry if n != "step"))
            for name, value in entry.items():
                if name == "step":
                    state["step"] = int(np.asarray(value.numpy() if hasattr(value, "numpy") else value).item())
                elif name in state:
                    arr = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
                    if arr.shape != p.shape:
                        raise ValueError(f"loaded optimizer state {name!r} has shape {arr.shape}, its parameter "
                                         f"has {p.shape}")
                    state[name][...] = arr


def _base(view: np.ndarray) -> np.ndarray:
    while view.base is not None:
        view = view.base
    return view


def _follows(run_view: np.ndarray, flat: np.ndarray | None, offset: int) -> bool:
    """Whether ``flat[offset:]`` starts right where ``run_view`` (a slice of a flat array) ends."""
    if flat is None or _base(run_view) is not _base(flat):
        return False
    end = run_view.__array_interface__["data"][0] + run_view.nbytes
    return flat.__array_interface__["data"][0] + offset * flat.itemsize == end


def _extend(view: np.ndarray, n: int) -> np.ndarray:
    base = _base(view)
    start = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // base.itemsize
    return base[start:start + view.size + n]


class HostSGD(_HostStepping, SGD):
    """``optim.SGD`` for offloaded shards, stepped on the host (same arguments and semantics)."""

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",) if float(group["momentum"]) != 0 else ()

    def _host_update(self, run: _Run, group: dict[str, Any]) -> None:
        w, g = run.data, run.grad
        if group["maximize"]:
            g = -g
        wd = float(group["weight_decay"])
        if wd != 0:
            g = g + np.float32(wd) * w
        momentum = float(group["momentum"])
        if momentum != 0:
            buf = run.state["momentum_buffer"]
            if run.step == 0:
                buf[...] = g
            else:
                buf *= np.float32(momentum)
                buf += np.float32(1.0 - float(group["dampening"])) * g
            g = g + np.float32(momentum) * buf if group["nesterov"] else buf
        w += np.float32(-float(group["lr"])) * g


class HostAdam(_HostStepping, Adam):
    """``optim.Adam`` for offloaded shards, stepped on the host (same arguments and semantics)."""

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")

    def _host_update(self, run: _Run, group: dict[str, Any]) -> None:
        f32 = np.float32
        w, g = run.data, run.grad
        step = run.step + 1
        lr, wd, eps = float(group["lr"]), float(group["weight_decay"]), float(group["eps"])
        beta1, beta2 = (float(b) for b in group["betas"])
        if group["maximize"]:
            g = -g
        if wd != 0 and not group["decoupled_weight_decay"]:
            g = g + f32(wd) * w
        if group["decoupled_weight_decay"]:
            w *= f32(1 - lr * wd)
        m, v = run.state["exp_avg"], run.state["exp_avg_sq"]
        t = 1 - beta1
        d = g - m  # torch.lerp(m, g, t), two-sided as the kernel does
        if t < 0.5:
            d *= f32(t)
            m += d
        else:
            d *= f32(1 - t)
            np.subtract(g, d, out=m)
        v *= f32(beta2)
        gg = g * f32(1 - beta2)
        gg *= g
        v += gg
        vd = v
        if group["amsgrad"]:
            vmax = run.state["max_exp_avg_sq"]
            np.maximum(vmax, v, out=vmax)
            vd = vmax
        denom = np.sqrt(vd)
        denom /= f32(math.sqrt(1 - beta2 ** step))
        denom += f32(eps)
        upd = m * f32(-lr / (1 - beta1 ** step))
        upd /= denom
        w += upd


class HostAdamW(HostAdam, AdamW):
    """``optim.AdamW`` for offloaded shards, stepped on the host (same arguments and semantics)."""


__all__ = ["HostSGD", "HostAdam", "HostAdamW"]
