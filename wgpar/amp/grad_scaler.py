"""GradScaler: dynamic loss scaling for float16 training, with torch.amp.GradScaler's semantics.

``scaler.scale(loss).backward()`` multiplies the loss (and so every gradient) by the scale, so small
float16 gradients do not flush to zero; ``scaler.step(opt)`` divides the gradients by it on the
device (shaders/amp_unscale.wgsl, six gradients a dispatch), flagging any inf / NaN in a 4-byte
device buffer, and skips ``opt.step()`` if it is set; ``scaler.update()`` halves the scale after a
skipped step and doubles it after ``growth_interval`` clean ones.

Without a host wait: where one optimizer on one device is stepped (and its optimizer is a built-in
one), the step is recorded *guarded* (every step kernel reads the flag and writes nothing if it is
set; Optimizer._step_guarded) and the update runs on the device (shaders/amp_update.wgsl) on a
[scale, growth tracker] tensor there. Waiting for the flag instead left the GPU idle while the host
recorded the optimizer step and the next forward (GPT-2 under autocast on an H100: 192.9 ms a step
against 179.0 without the scaler). The host reads each flag later, when the GPU has long passed it,
and replays the update on its own copy of the scale (for ``get_scale``, ``state_dict``) and undoes
a skipped step's host state (step counts) at the optimizer's next step. Anything else (several
optimizers or devices, a group of ranks, ``update(new_scale)``) reads the flags at ``step`` and keeps
the scale on the host, a float rounded to float32 as torch's float32 scale tensor rounds.

Ranks that each hold a different part of one model (FSDP shards, pipeline stages, tensor-parallel
slices) must skip together, or their parameters drift apart: their found-inf flags are all-reduced
with "max" over the model's group before the step (PyTorch's ShardedGradScaler does it for FSDP).
The group is ``process_group=`` if given, else the one the distributed layer recorded on the
optimizer's parameters (``model_group_of``).
"""

from __future__ import annotations

import enum
import functools
import math
import numbers
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..autograd import differentiable as D
from ..autograd.grad_mode import no_grad
from ..optim.optimizer import Optimizer
from ..runtime import slots
from ..runtime.device import Device
from ..runtime.kernels import WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor


class OptState(enum.Enum):
    """Where an optimizer is in GradScaler's step: READY, UNSCALED (``unscale_`` ran), STEPPED (``step`` ran),
    as torch's OptState."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _f32(x: float) -> float:
    return float(np.float32(x))


# Gradients unscaled a dispatch (runtime/slots.py): one dispatch per gradient cost a GPT-2 step under autocast
# 148 dispatches, 1.39 ms of GPU time on an H200.
_UNSCALE = Kernel("amp_unscale", slots.bindings("g") + ", found: w, sc: r", slots.fields() + ", inv_scale: f32")
_UPDATE = Kernel("amp_update", "st: w, found: r", "backoff: f32, growth: f32, interval: f32")
_INV_FN = """fn inv_scale() -> f32 {
  let s = sc[0];
  let r = 1.0 / s;
  return fma(fma(-s, r, 1.0), r, r);
}"""


@functools.lru_cache(maxsize=2 * slots.SLOTS)
def _kernel(n: int, on_device: bool) -> KernelSpec:
    """The unscale kernel over ``n`` float32 gradients (the device's scale or the host's)."""
    code = slots.chain(n, lambda s: f"    let i = lw * WG + lid;\n"
                                    f"    if (i < p.n{s}) {{ g{s}[p.o{s} + i] = unscaled(g{s}[p.o{s} + i]); }}")
    return _UNSCALE.spec(("f32",) * n + ("atomic<u32>",) + (("f32",) if on_device else ()),
                         slots.unused("g", n) + (() if on_device else ("sc",)), FNS=load_source("float_fns"),
                         SLOTS=code, INV="inv_scale()" if on_device else "p.inv_scale",
                         INV_FN=_INV_FN if on_device else "")


# The attribute through which the distributed layer (which this layer may not import) tells the scaler
# that a parameter is one rank's part of a model spread over a group: PipelineSchedule sets it on its
# stages' parameters. FSDP's shards are known by the FSDPParam it attaches (``_fsdp_param``): the group
# over which its units shard and replicate.
MODEL_GROUP_ATTR = "_model_group"


def model_group_of(p: Tensor):
    """The ProcessGroup of the ranks that hold the other parts of ``p``'s model, or None."""
    group = p.__dict__.get(MODEL_GROUP_ATTR)
    if group is not None:
        return group
    ref = p.__dict__.get("_fsdp_param")  # a weak reference: a parameter does not keep its model alive
    unit = getattr(ref(), "group", None) if ref is not None else None
    return unit.comms.dp if unit is not None else None


class GradScaler:
    """Dynamic loss scaling (torch.amp.GradScaler's contract, defaults and state_dict).

    Arguments:
        device: ``"wgpu"`` (accepted for torch-style calls).
        init_scale: the first scale.
        growth_factor: multiplies the scale after ``growth_interval`` steps without inf / NaN (> 1).
        backoff_factor: multiplies the scale after a step with inf / NaN gradients (< 1).
        growth_interval: clean steps between growths.
        enabled: False makes every method a pass-through (``step`` just steps).
        process_group: this rank's ProcessGroup over the ranks that hold the other parts of the model
            (tensor parallelism, or any split the library does not record): ``unscale_`` all-reduces the
            found-inf flag over it with "max", so every rank skips (and backs off) together. Needs one
            scaler per rank. Default: the group recorded on the optimizer's parameters (FSDP shards,
            pipeline stages), so one scaler may serve every thread rank; none for a whole model.
    """

    def __init__(self, device: str = "wgpu", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True,
                 process_group=None) -> None:
        if device != "wgpu":
            raise ValueError(f"GradScaler: device must be 'wgpu', got {device!r}")
        self._enabled = bool(enabled)
        if self._enabled:
            if isinstance(init_scale, bool) or not isinstance(init_scale, numbers.Real) or \
                    not (math.isfinite(init_scale) and init_scale > 0):
                raise ValueError(f"GradScaler: init_scale must be a positive finite number, got {init_scale!r}")
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0.")
        if process_group is not None and not isinstance(getattr(process_group, "device", None), Device):
            raise TypeError(f"GradScaler: process_group must be this rank's ProcessGroup, got "
                            f"{type(process_group).__name__}")
        self._process_group = process_group
        self._scale = _f32(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._lock = threading.Lock()  # DataParallel steps one optimizer per rank thread
        self._per_optimizer: dict[int, dict[str, Any]] = {}
        self._device_state: Tensor | None = None  # [scale, growth tracker] float32 while updates run on a device
        self._unread: list = []  # the flags (Readback) of device updates not yet replayed on the host

    # -- the scale on the device ------------------------------------------------------------
    def _replay(self, waiting: bool = True) -> None:
        """Bring the host's scale up to the device's: read the flags of the device's updates (steps the
        GPU has long finished) and apply the same float32 rule; ``waiting=False``: only those already read
        (the optimizer reads each at its next step), so the list stays short without a wait."""
        while self._unread and (waiting or self._unread[0].done):
            self._apply(self._unread.pop(0).word() != 0)

    def _leave_device(self) -> None:
        """Keep the scale on the host from now on (until a single-device update puts it back)."""
        self._replay()
        self._device_state = None

    def _apply(self, found_inf: bool) -> None:
        """torch's _amp_update_scale_ in float32: what shaders/amp_update.wgsl does on the device."""
        if found_inf:
            self._scale = _f32(np.float32(self._scale) * np.float32(self._backoff_factor))
            self._growth_tracker = 0
            return
        successful = self._growth_tracker + 1
        if successful == self._growth_interval:
            with np.errstate(over="ignore"):
                grown = float(np.float32(self._scale) * np.float32(self._growth_factor))
            if math.isfinite(grown):
                self._scale = grown
            self._growth_tracker = 0
        else:
            self._growth_tracker = successful

    # -- scaling --------------------------------------------------------------------------
    def scale(self, outputs):
        """``outputs * scale`` for a tensor, or each tensor of a (nested) list / tuple / iterable."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            st = self._device_state
            if st is not None and outputs.device is st.device:
                scale = ops.clone(ops.getitem(st, 0))  # its own copy: the update rewrites st later
                if outputs.dtype is not _dt.float32:
                    scale = ops.cast(scale, outputs.dtype)
                return D.binary("mul", outputs, scale)
            if st is not None:
                self._leave_device()
            return D.binary("mul", outputs, self._scale)
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
        found: dict = {}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        model_group = self._model_group(params)
        devices = {p.grad.device for p in params if p.grad is not None and p.grad.numel()}
        st = self._device_state
        if st is not None and (model_group is not None or devices - {st.device}):
            self._leave_device()
            st = None
        inv_scale = _f32(1.0 / self._scale)
        if model_group is not None:  # every rank all-reduces, also one whose gradients are all None
            found[model_group.device] = ops.fill((1,), 0, _dt.int32, model_group.device)
        with no_grad():
            per_device: dict = {}
            for p in params:
                g = p.grad
                if g is None or g.numel() == 0:
                    continue
                if g.dtype is _dt.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                if model_group is not None and g.device is not model_group.device:
                    raise ValueError(f"GradScaler: a gradient of shape {g.shape} is on {g.device} but rank "
                                     f"{model_group.rank}'s group is on {model_group.device}: give each rank "
                                     "its own GradScaler(process_group=that rank's group)")
                if g.device not in found:
                    found[g.device] = ops.fill((1,), 0, _dt.int32, g.device)
                per_device.setdefault(g.device, []).append(g)
            for dev, grads in per_device.items():
                _unscale(grads, found[dev], inv_scale, st)
            if model_group is not None:
                model_group.all_reduce(found[model_group.device], "max", label="GradScaler found_inf")
        state["found_inf"] = found
        state["guard"] = model_group is None and self._process_group is None and len(found) == 1 and \
            optimizer._guardable()
        state["stage"] = OptState.UNSCALED

    def _model_group(self, params: list[Tensor]):
        """The group whose ranks must agree on skipping this optimizer's step (None: a whole model)."""
        if self._process_group is not None:
            return self._process_group
        groups = {id(g): g for g in (model_group_of(p) for p in params) if g is not None}
        if len(groups) > 1:
            raise ValueError(f"GradScaler: the optimizer's parameters belong to {len(groups)} different "
                             "distributed groups; pass process_group= (the group spanning every part of the "
                             "model)")
        return next(iter(groups.values()), None)

    def found_inf_per_device(self, optimizer: Optimizer) -> dict:
        """The device flags (int32 [1], nonzero: an inf / NaN was seen) that ``unscale_`` left for
        ``optimizer``, by device; already all-reduced over the model's group (``process_group``)."""
        return self._state(optimizer)["found_inf"]

    def step(self, optimizer: Optimizer, *args, **kwargs):
        """``unscale_`` (unless done) then ``optimizer.step()``, skipped if any gradient was inf / NaN.

        Returns what ``optimizer.step`` returned, or None when the step was skipped. One optimizer on
        one device: the step is guarded on the device, nothing is read back now (what it returns is
        ``optimizer.step``'s either way); otherwise one 4-byte flag per device is read back.
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
        if state["guard"]:
            (dev, flag), = state["found_inf"].items()
            state["readback"] = dev.read_later(flag._storage.buffer, 4 * flag._offset, 4)
            result = optimizer._step_guarded(flag, state["readback"], *args, **kwargs)
        else:
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
            self._leave_device()
            self._scale = _f32(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
        else:
            with self._lock:
                states = [s for s in self._per_optimizer.values() if s["found_inf"]]
            if not states:
                raise AssertionError("No inf checks were recorded prior to update.")
            if len(states) == 1 and "readback" in states[0]:
                self._update_on_device(states[0])
            else:
                self._leave_device()
                self._apply(sum(_found(s) for s in states) > 0)
        with self._lock:
            self._per_optimizer = {}

    def _update_on_device(self, state: dict[str, Any]) -> None:
        (dev, flag), = state["found_inf"].items()
        st = self._device_state
        if st is None or st.device is not dev:
            self._leave_device()
            st = self._device_state = Tensor.from_numpy(
                np.array([self._scale, self._growth_tracker], np.float32), device=dev)
        dev.dispatch(_UPDATE.spec(("f32", "u32")), [st._storage.buffer, flag._storage.buffer],
                     _UPDATE.pack(backoff=self._backoff_factor, growth=self._growth_factor,
                                  interval=float(self._growth_interval)), (1, 1, 1))
        st._storage.bump_version()
        self._replay(waiting=False)
        self._unread.append(state["readback"])

    # -- state ----------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale factor as a Python float (1.0 when disabled), as
        ``torch.amp.GradScaler.get_scale``. After updates on the device it reads their flags back (as
        torch's reads its scale tensor)."""
        self._replay()
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        """The factor the scale is multiplied by after ``growth_interval`` steps without inf/NaN."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor.

        Arguments:
            new_factor: the new factor.
        """
        self._replay()  # updates already made used the old factor
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        """The factor the scale is multiplied by after a step with inf/NaN gradients."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor.

        Arguments:
            new_factor: the new factor.
        """
        self._replay()
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        """How many consecutive steps without inf/NaN grow the scale."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval.

        Arguments:
            new_interval: the new interval, in steps.
        """
        self._replay()
        self._growth_interval = int(new_interval)

    def is_enabled(self) -> bool:
        """Whether the scaler scales (``enabled=False`` makes every method a pass-through)."""
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """torch's five entries (empty when disabled): scale, growth_factor, backoff_factor,
        growth_interval, _growth_tracker."""
        if not self._enabled:
            return {}
        self._replay()
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore scale, factors, interval and growth tracker from ``state_dict()``, as torch's (a disabled
        scaler ignores it).

        Raises RuntimeError for an empty dict, KeyError for a missing key, ValueError for a scale that is
        not positive and finite.

        Arguments:
            state_dict: what ``state_dict()`` returned (``scale`` may be a number or a tensor).
        """
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        missing = [k for k in _STATE_KEYS if k not in state_dict]
        if missing:
            raise KeyError(f"GradScaler.load_state_dict: the state dict lacks {missing} (it has "
                           f"{sorted(state_dict)}; GradScaler.state_dict() gives all of {list(_STATE_KEYS)})")
        scale = state_dict["scale"]
        scale = scale.item() if isinstance(scale, Tensor) else scale
        self._leave_device()
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"GradScaler.load_state_dict: 'scale' must be a positive finite number, got {scale!r}")
        self._scale = _f32(scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])


_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _found(state: dict[str, Any]) -> int:
    """Whether an optimizer's gradients had inf / NaN (its flags read back now if not yet)."""
    if "inf" in state:
        return state["inf"]
    if "readback" in state:
        return state["readback"].word()
    return sum(int(f.item()) for f in state["found_inf"].values())


def _unscale(grads: list[Tensor], flag: Tensor, inv_scale: float, device_state: Tensor | None = None) -> None:
    """``g *= 1 / scale`` in place for each float32 gradient (all on ``flag``'s device; the host's ``inv_scale``,
    or the reciprocal of the ``device_state``'s scale), ORing "saw inf / NaN" into ``flag``: several gradients
    a dispatch (runtime/slots.py), a strided one through a contiguous copy."""
    dev = flag.device
    flats = [g if g.is_contiguous() else ops.contiguous(g) for g in grads]
    for batch in slots.batches(flats, slots.slots_for(dev, 2)):
        words, groups = slots.words(batch, [-(-t.numel() // WORKGROUP) for t in batch])
        bufs = [t._storage.buffer for t in batch] + [flag._storage.buffer]
        if device_state is not None:
            bufs.append(device_state._storage.buffer)
        n = sum(t.numel() for t in batch)  # one multiply an element, read and written
        dev.dispatch(_kernel(len(batch), device_state is not None), bufs, _UNSCALE.pack(**words, inv_scale=inv_scale),
                     grid(groups, dev.max_workgroups), n, 8 * n)
    for g, f in zip(grads, flats):
        if f is not g:
            ops.copy_(g, f)
        g._storage.bump_version()


__all__ = ["GradScaler", "OptState"]
