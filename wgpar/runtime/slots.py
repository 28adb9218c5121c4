"""Several tensors in one dispatch, one storage binding each (PyTorch's multi_tensor_apply on WebGPU).

A kernel over a list of small tensors (GradScaler's unscale, clip_grad_norm_'s passes) would otherwise
take one dispatch per tensor: a GPT-2 step's 148 gradients cost about 10 us of GPU time each for a few
thousand elements. Here a dispatch takes up to ``SLOTS`` tensors, bound as ``<name>0``, ``<name>1``, ...
(WebGPU's default limit is 8 storage buffers a stage: the slots and two more bindings). Slot s holds
``p.n<s>`` elements from element ``p.o<s>`` of its binding and the workgroups up to ``p.w<s>`` (a running
count); :func:`chain` writes the WGSL that picks a workgroup's slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (tensors sit above the runtime)
    from ..tensor import Tensor

SLOTS = 6


def slots_for(dev, others: int) -> int:
    """How many slots a kernel with ``others`` storage bindings besides them may use on ``dev``."""
    limit = int(dev.limits.get("max-storage-buffers-per-shader-stage", 8))
    return max(1, min(SLOTS, limit - others))


def bindings(name: str, access: str = "w") -> str:
    """The slots' binding declarations for a Kernel: ``"g0: w, g1: w, ..."`` (``access`` "r": read-only)."""
    return ", ".join(f"{name}{s}: {access}" for s in range(SLOTS))


def fields(*names: str) -> str:
    """The slots' Params fields (u32): n, o, w and ``names`` (per-slot extras) for each slot."""
    return ", ".join(f"{f}{s}: u32" for s in range(SLOTS) for f in ("n", "o", "w") + names)


def unused(name: str, n: int) -> tuple[str, ...]:
    """The bindings of the slots a batch of ``n`` tensors leaves out (Kernel.spec's ``without``)."""
    return tuple(f"{name}{s}" for s in range(n, SLOTS))


def batches(tensors: Sequence[Tensor], slots: int) -> list[list[Tensor]]:
    """Consecutive runs of at most ``slots`` contiguous tensors, no two viewing one buffer (a buffer bound
    twice in a dispatch with write access is invalid)."""
    out: list[list[Tensor]] = []
    cur: list[Tensor] = []
    for t in tensors:
        if len(cur) == slots or any(c._storage is t._storage for c in cur):
            out.append(cur)
            cur = []
        cur.append(t)
    if cur:
        out.append(cur)
    return out


def words(batch: Sequence[Tensor], groups: Sequence[int], **extra: Sequence[int]) -> tuple[dict, int]:
    """The slots' Params words for ``batch`` (slot s taking ``groups[s]`` workgroups; ``extra``: per-slot
    lists of the fields named to :func:`fields`), unused slots zero; and the workgroups in all."""
    out: dict = {}
    end = 0
    for s in range(SLOTS):
        live = s < len(batch)
        end += groups[s] if live else 0
        out.update({f"n{s}": batch[s].numel() if live else 0, f"o{s}": batch[s]._offset if live else 0,
                    f"w{s}": end})
        out.update({f"{k}{s}": v[s] if live else 0 for k, v in extra.items()})
    return out, end


def chain(n: int, body: Callable[[int], str]) -> str:
    """WGSL: ``if (w < p.w0) { body(0) } else if (w < p.w1) { body(1) } ...`` over ``n`` slots, w the flat
    workgroup index (uniform: workgroup barriers may follow the chain). In ``body(s)``, ``lw`` is w's index
    among slot s's workgroups."""
    return " else ".join(f"if (w < p.w{s}) {{\n    let lw = w - {f'p.w{s - 1}' if s else '0u'};\n{body(s)}\n  }}"
                         for s in range(n))
