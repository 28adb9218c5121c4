"""GradScaler: dynamic loss scaling for float16 training, with torch.amp.GradScaler's semantics.

``scaler.scale(loss).backward()`` multiplies the loss (and so every gradient) by the scale, so small
float16 gradients do not flush to zero; ``scaler.step(opt)`` divides the gradients by it on the
device (shaders/amp_unscale.wgsl, one kernel per gradient), flagging any inf / NaN in a 4-byte
device buffer, reads that flag once, and skips ``opt.step()`` if it is set; ``scaler.update()``
halves the scale after a skipped step and doubles it after ``growth_interval`` clean ones.

The scale is a host float rounded to float32 exactly as torch's float32 scale tensor rounds: the one
readback per step (which torch's ``step`` also makes) already tells the host whether to skip, so
keeping the scale on the device would only add a copy per step.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..autograd import functions as F
from ..autograd.grad_mode import no_grad
from ..optim.optimizer import Optimizer
from ..runtime.kernels import WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor


class OptState(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _f32(x: float) -> float:
    return float(np.float32(x))


_UNSCALE = Kernel("amp_unscale", "g: w, found: w", "numel: u32, off: u32, inv_scale: f32")


def _kernel(gt: str) -> KernelSpec:
    return _UNSCALE.spec((gt, "atomic<u32>"), G=gt, FNS=load_source("float_fns"))


class GradScaler:
    """Dynamic loss scaling (torch.amp.GradScaler's contract, defaults and state_dict).

    Arguments:
        device: ``"wgpu"`` (accepted for torch-style calls).
        init_scale: the first scale.
        growth_factor: multiplies the scale after ``growth_interval`` steps without inf / NaN (> 1).
        backoff_factor: multiplies the scale after a step with inf / NaN gradients (< 1).
        growth_interval: clean steps between growths.
        enabled: False makes every method a pass-through (``step`` just steps).
    """

    def __init__(self, device: str = "wgpu", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if device != "wgpu":
            raise ValueError(f"GradScaler: device must be 'wgpu', got {device!r}")
        self._enabled = bool(enabled)
        if self._enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0.")
        self._scale = _f32(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._lock = threading.Lock()  # DataParallel steps one optimizer per rank thread
        self._per_optimizer: dict[int, dict[str, Any]] = {}

    # -- scaling --------------------------------------------------------------------------
    def scale(self, outputs):
        """``outputs * scale`` for a tensor, or each tensor of a (nested) list / tuple / iterable."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return F.binary("mul", outputs, self._scale)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if isinstance(outputs, Iterable):
            return map(self.scale, outputs)
        raise ValueError(f"outputs must be a Tensor or an iterable of Tensors, got {type(outputs).__name__}")

    def _state(self, optimizer: Optimizer) -> dict[str, Any]:
        with self._lock:
            return self._per_optimizer.setdefault(id(optimizer), {"stage": OptState.READY, "found_inf": {}})

    def unscale_(self, optimizer: Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place and record whether any was inf / NaN
        (on the device: no readback here). Optional before ``step`` (e.g. to clip the true gradients)."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = _f32(1.0 / self._scale)
        found: dict = {}
        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None or g.numel() == 0:
                        continue
                    if g.dtype is _dt.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    flag = found.get(g.device)
                    if flag is None:
                        flag = found[g.device] = ops.fill((1,), 0, _dt.int32, g.device)
                    _unscale(g, flag, inv_scale)
        state["found_inf"] = found
        state["stage"] = OptState.UNSCALED

    def found_inf_per_device(self, optimizer: Optimizer) -> dict:
        """The device flags (int32 [1], nonzero: an inf / NaN was seen) that ``unscale_`` left for
        ``optimizer``, by device. Ranks that hold different shards of one model (tensor parallelism)
        all-reduce them with "max" between ``unscale_`` and ``step``, so that all ranks skip together."""
        return self._state(optimizer)["found_inf"]

    def step(self, optimizer: Optimizer, *args, **kwargs):
        """``unscale_`` (unless done) then ``optimizer.step()``, skipped if any gradient was inf / NaN.

        Returns what ``optimizer.step`` returned, or None when the step was skipped. Reads one 4-byte
        flag per device back from the GPU.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        state = self._state(optimizer)
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        result = None
        state["inf"] = sum(int(flag.item()) for flag in state["found_inf"].values())
        if not state["inf"]:
            result = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return result

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Set the next scale: ``new_scale`` if given, else back off after a skipped step or grow after
        ``growth_interval`` clean ones (torch's _amp_update_scale_, in float32)."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = _f32(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
        else:
            with self._lock:
                states = [s for s in self._per_optimizer.values() if s["found_inf"]]
            if not states:
                raise AssertionError("No inf checks were recorded prior to update.")
            found = sum(s["inf"] if "inf" in s else sum(int(f.item()) for f in s["found_inf"].values())
                        for s in states)
            if found:
                self._scale = _f32(np.float32(self._scale) * np.float32(self._backoff_factor))
                self._growth_tracker = 0
            else:
                successful = self._growth_tracker + 1
                if successful == self._growth_interval:
                    grown = _f32(self._scale * self._growth_factor)
                    if math.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
                else:
                    self._growth_tracker = successful
        with self._lock:
            self._per_optimizer = {}

    # -- state ----------------------------------------------------------------------------
    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """torch's five entries (empty when disabled): scale, growth_factor, backoff_factor,
        growth_interval, _growth_tracker."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        self._scale = _f32(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])


def _unscale(g: Tensor, flag: Tensor, inv_scale: float) -> None:
    """``g *= inv_scale`` in place on the device, ORing "saw inf / NaN" into ``flag``."""
    target = g if g.is_contiguous() else ops.contiguous(g)
    dev = target.device
    n = target.numel()
    dev.dispatch(_kernel(target.dtype.storage), [target._storage.buffer, flag._storage.buffer],
                 _UNSCALE.pack(numel=n, off=target._offset, inv_scale=inv_scale),
                 grid(-(-n // WORKGROUP), dev.max_workgroups))
    if target is not g:
        ops.copy_(g, target)
    g._storage.version += 1


__all__ = ["GradScaler", "OptState"]
