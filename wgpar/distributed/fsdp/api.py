"""``fully_shard``: per-module sharding like PyTorch FSDP2, written against one rank's ProcessGroup.

Apply it bottom-up on every rank, each block first and the root last::

    for block in model.blocks:
        fully_shard(block, group)
    fully_shard(model, group)
    opt = optim.AdamW(model.parameters())   # the shards: optimizer state is 1/N per rank

Each call makes one unit: the parameters of the module's sub-tree that no inner unit owns, sharded
on dim 0 over the group (``param.py``), gathered with one collective per unit around the module's
forward and again for its backward, their gradients reduce-scattered into the shards
(``param_group.py``, ``state.py``). The module's class becomes an ``FSDPModule`` subclass (as in
FSDP2), which adds ``unshard``, ``reshard``, ``no_sync`` and the other methods below.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator

import numpy as np

from ... import dtypes as _dt
from ... import ops
from ...autograd.grad_mode import no_grad
from ...nn.module import Module
from ...nn.parameter import Parameter
from ...tensor import Tensor
from ..group import ProcessGroup
from ..mesh import DeviceMesh
from . import checkpoint as _ckpt
from .param_group import Comms, FSDPParamGroup
from .policies import (
    PERSIST_THRESHOLD,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardingStrategy,
    is_container,
    shard_world_size,
)
from .sharing import claim
from .state import FSDPState, state_of

_unit_counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_hybrid: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_classes: dict[type, type] = {}


class FSDPModule:
    """Mixed into a module's class by ``fully_shard`` (the class becomes ``FSDP<Name>``)."""

    @property
    def fsdp_state(self) -> FSDPState:
        """This module's FSDP state (its parameter groups and hooks)."""
        return self.__dict__["_fsdp_state"]

    def fsdp_groups(self) -> list[FSDPParamGroup]:
        """The units in this module's sub-tree (this one first), each with its parameters."""
        out = []
        for m in self.modules():
            st = state_of(m)
            if st is not None and st.group is not None:
                out.append(st.group)
        return out

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except BaseException:
            st = self.fsdp_state
            if st.is_root:
                st.forward_failed()
            raise

    def _states(self) -> Iterator[FSDPState]:
        for m in self.modules():
            st = state_of(m)
            if st is not None:
                yield st

    def unshard(self, async_op: bool = False) -> None:
        """Gather this unit's parameters now (``async_op``: start it; forward waits for it)."""
        grp = self.fsdp_state.group
        if grp is not None:
            grp.unshard(async_op)

    def reshard(self) -> None:
        """Free this unit's gathered parameters (a no-op when they are sharded)."""
        grp = self.fsdp_state.group
        if grp is not None:
            grp.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """False: backward passes accumulate full (unsharded) gradients locally, without communication;
        the next backward with True reduces everything accumulated."""
        for st in self._states() if recurse else [self.fsdp_state]:
            if st.group is not None:
                st.group.sync = bool(requires_gradient_sync)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients without communication (gradient accumulation)."""
        groups = self.fsdp_groups()
        prev = [g.sync for g in groups]
        self.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            for g, s in zip(groups, prev):
                g.sync = s

    def set_prefetch(self, units: int) -> None:
        """How many units' gathers may run ahead of the unit computing (0: none), forward and backward."""
        _check_prefetch(units)
        for st in self._states():
            st.prefetch = units

    def set_reshard_after_forward(self, reshard_after_forward: bool, *, recurse: bool = True) -> None:
        """True: FULL_SHARD (free gathered parameters after forward); False: SHARD_GRAD_OP."""
        for st in self._states() if recurse else [self.fsdp_state]:
            if st.group is not None:
                st.group.reshard_after_forward = bool(reshard_after_forward)

    def set_gradient_divide_factor(self, factor: float | None) -> None:
        """Divide summed gradients by ``factor`` (default None: the number of data-parallel ranks, the
        mean). The single-controller ``FSDP`` sets 1 and weights each rank's loss by its batch share."""
        if factor is not None and not float(factor) > 0:
            raise ValueError(f"the gradient divide factor must be positive, got {factor!r}")
        for st in self._states():
            st.divide = None if factor is None else float(factor)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Scale every shard's gradient so that the whole model's gradient norm is at most ``max_norm``.

        ``nn.utils.clip_grad_norm_(model.parameters())`` would see this rank's shards only, and each
        rank would clip by another norm; this sums the shards' contributions over the ranks (rows
        held by several ranks, replicated units and HYBRID_SHARD's replicas, count once). A
        collective: every rank calls it, after backward.

        Arguments:
            max_norm: the largest norm allowed.
            norm_type: 2.0 (default), or ``float("inf")`` for the largest absolute entry.

        Returns the total norm (before clipping) as a 0-d tensor on this rank's device.
        """
        groups = self.fsdp_groups()
        if not groups:
            raise RuntimeError("clip_grad_norm_: this module's sub-tree has no FSDP parameters")
        if norm_type not in (2.0, float("inf")):
            raise ValueError(f"clip_grad_norm_: norm_type must be 2.0 or inf, got {norm_type!r}")
        dp = groups[0].comms.dp
        inf = norm_type == float("inf")
        with no_grad():
            parts: list[Tensor] = []
            host = 0.0
            for g in groups:
                # Each value is held by `copies` ranks: weight its contribution so the sum counts it once.
                copies = (g.comms.replicate.world_size if g.sharded and g.comms.replicate is not None
                          else 1 if g.sharded else dp.world_size)
                for fp in g.params:
                    p = fp.registered
                    h = getattr(p, "host_grad", None)
                    if h is not None:
                        host = max(host, float(np.abs(h).max(initial=0.0))) if inf else \
                            host + float(np.square(h, dtype=np.float64).sum()) / copies
                    elif p.grad is not None:
                        a = ops.unary("abs", p.grad.float())
                        parts.append(ops.reduce("max", a) if inf else ops.reduce("sum", a * a) * (1.0 / copies))
            total = ops.fill((), host, _dt.float32, dp.device)
            for t in parts:
                total = ops.binary("maximum", total, t) if inf else total + t
            total = dp.all_reduce(ops.reshape(total, (1,)), "max" if inf else "sum", label="fsdp:clip_grad_norm")
            norm = ops.reshape(total if inf else ops.unary("sqrt", total), ())
            coef = ops.clamp(ops.binary("div", float(max_norm), ops.binary("add", norm, 1e-6)), max=1.0)
            for g in groups:
                for fp in g.params:
                    p = fp.registered
                    if getattr(p, "host_grad", None) is not None:
                        p.host_grad *= np.float32(coef.item())
                    elif p.grad is not None:
                        ops.inplace("mul", p.grad, coef)
        return norm

    def state_dict(self) -> dict[str, Tensor]:
        """The whole model's parameters and buffers, full size, as Tensors on this rank's device.

        A collective (one gather per sharded unit): every rank calls it, as with PyTorch FSDP's full
        state dict. The shards alone under the full names would save a partial model without a word;
        ``sharded_state_dict`` gives this rank's rows without communication, ``full_state_dict`` NumPy
        arrays on the host (``rank0_only`` too).
        """
        return _ckpt.full_tensor_state_dict(self)

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list[str], list[str]]:
        """Load whole tensors (what ``state_dict`` returns, or a single-device model's): each rank writes the
        rows it holds; no communication. Returns (missing, unexpected) like ``Module.load_state_dict``."""
        return _ckpt.load_full_state_dict(self, state, strict)

    def lazy_init(self) -> None:
        """Make this module the root now (the first forward does it otherwise)."""
        self.fsdp_state.lazy_init()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``Module.zero_grad``, also clearing offloaded shards' host gradients and gradients accumulated
        under ``no_sync``.

        Arguments:
            set_to_none: set gradients to None (default, as torch) rather than zero them.
        """
        super().zero_grad(set_to_none)
        for grp in self.fsdp_groups():
            for fp in grp.params:
                if hasattr(fp.registered, "clear_host_grad"):
                    fp.registered.clear_host_grad(set_to_none)
                fp.unsharded.grad = None  # gradients accumulated under no_sync


def _check_prefetch(units: int) -> int:
    if isinstance(units, bool) or not isinstance(units, int) or units < 0:
        raise ValueError(f"prefetch must be a number of units >= 0, got {units!r}")
    return units


def hybrid_groups(group: ProcessGroup, shard_size: int) -> tuple[ProcessGroup, ProcessGroup]:
    """(shard group, replicate group) of this rank for HYBRID_SHARD, made once per group and size.

    Ranks ``[k * shard_size, (k + 1) * shard_size)`` shard together; ranks with the same position in
    their shard group replicate: the dims of a ``DeviceMesh(group, (replicas, shard_size),
    mesh_dim_names=("replicate", "shard"))``.
    """
    n = group.world_size
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1 or n % shard_size:
        raise ValueError(f"HYBRID_SHARD: shard_size must divide the group's {n} ranks, got {shard_size!r}")
    cache = _hybrid.setdefault(group, {})
    if shard_size not in cache:
        # The sub-groups, not the mesh: the mesh holds ``group``, which would keep this weak key alive.
        mesh = DeviceMesh(group, (n // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))
        cache[shard_size] = (mesh["shard"], mesh["replicate"])
    return cache[shard_size]


def _comms(group: ProcessGroup, strategy: ShardingStrategy, shard_size: int | None) -> Comms:
    size = shard_world_size(strategy, group.world_size, shard_size)
    if strategy is ShardingStrategy.NO_SHARD:
        return Comms(group, None)
    if strategy is ShardingStrategy.HYBRID_SHARD:
        shard, rep = hybrid_groups(group, size)
        return Comms(group, shard, rep)
    return Comms(group, group)


def _check_mp(mp: MixedPrecisionPolicy | None, group: ProcessGroup) -> None:
    if mp is None:
        return
    if not isinstance(mp, MixedPrecisionPolicy):
        raise TypeError(f"mp_policy must be a MixedPrecisionPolicy, got {type(mp).__name__}")
    wants = [f for f in ("param_dtype", "reduce_dtype", "output_dtype") if getattr(mp, f) is _dt.float16]
    if wants and not group.device.has_f16:
        raise TypeError(f"MixedPrecisionPolicy({', '.join(f'{w}=float16' for w in wants)}) on rank {group.rank}: "
                        f"{group.device} has no shader-f16 feature, so it cannot compute in float16; use "
                        "param_dtype=None (float32) on this adapter")


def _sync_values(entries, group: ProcessGroup, unit: str) -> None:
    """Overwrite the claimed parameters with rank 0's values (one broadcast for the unit)."""
    own = [e for e in entries if isinstance(e.value, Tensor)]
    if not own or group.world_size == 1:
        return
    with no_grad():
        flat = ops.cat([ops.reshape(ops.contiguous(e.value.to(group.device)), (-1,)).to(dtype=_dt.float32)
                        for e in own])
        group.broadcast(flat, 0, label=f"fsdp:sync:{unit}")
        off = 0
        for e in own:
            n = int(np.prod(e.shape))
            piece = ops.reshape(ops.getitem(flat, slice(off, off + n)), e.shape)
            off += n
            if e.original is not None and e.value is e.original:
                ops.copy_(e.original, piece)
            else:
                e.value = piece.to(dtype=e.dtype)


def fully_shard(module: Module, group: ProcessGroup, *,
                strategy: ShardingStrategy | str = ShardingStrategy.FULL_SHARD,
                reshard_after_forward: bool | None = None, mp_policy: MixedPrecisionPolicy | None = None,
                offload_policy: OffloadPolicy | None = None, shard_size: int | None = None, prefetch: int = 1,
                persist_threshold: int = PERSIST_THRESHOLD, sync_module_states: bool = False) -> Module:
    """Shard ``module``'s parameters (those no inner unit owns) over ``group``: one FSDP unit.

    Arguments:
        module: the module; apply ``fully_shard`` to inner blocks first, the root last. Its parameters
            must hold the same values on every rank (build them after ``wgpar.manual_seed`` with one seed on
            every rank, thread ranks included: each has its own generator; load one state; or pass
            ``sync_module_states``); their memory is freed once sharded.
        group: this rank's ProcessGroup (``run_spmd`` passes it; ``ctx.comm(rank)``).
        strategy: FULL_SHARD (default), SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD (see ShardingStrategy).
        reshard_after_forward: overrides the strategy's choice (True: FULL_SHARD's, False: SHARD_GRAD_OP's).
        mp_policy: MixedPrecisionPolicy (e.g. gather and compute in float16, reduce in float32).
        offload_policy: OffloadPolicy: shards, gradients and optimizer state in host memory.
        shard_size: HYBRID_SHARD's shard group size (default: half the ranks).
        prefetch: units whose gathers may run ahead of the computing one (the root's value counts; 0: off).
        persist_threshold: a unit with fewer parameters than this stays replicated (no gathers; one
            all-reduce of its gradients); 0 shards every unit. Ignored with offload.
        sync_module_states: broadcast rank 0's values of the claimed parameters first.

    Returns ``module``, now an ``FSDPModule``.
    """
    return _fully_shard(module, group, strategy=strategy, reshard_after_forward=reshard_after_forward,
                        mp_policy=mp_policy, offload_policy=offload_policy, shard_size=shard_size,
                        prefetch=prefetch, persist_threshold=persist_threshold,
                        sync_module_states=sync_module_states)


def _fully_shard(module: Module, group: ProcessGroup, *, strategy, reshard_after_forward, mp_policy,
                 offload_policy, shard_size, prefetch, persist_threshold, sync_module_states,
                 values: Callable[[Parameter], np.ndarray | None] | None = None) -> Module:
    if not isinstance(module, Module):
        raise TypeError(f"fully_shard shards a wgpar.nn.Module, got {type(module).__name__}")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"fully_shard needs this rank's ProcessGroup, got {type(group).__name__}")
    if is_container(module):
        raise TypeError(f"fully_shard: a {type(module).__name__} is a container whose forward never runs, so its "
                        "parameters would never be gathered; shard each of its elements (and the parent)")
    if state_of(module) is not None:
        raise RuntimeError(f"fully_shard: this {type(module).__name__} is already sharded")
    strategy = ShardingStrategy.parse(strategy)
    _check_prefetch(prefetch)
    _check_mp(mp_policy, group)
    if offload_policy is not None and not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"offload_policy must be an OffloadPolicy, got {type(offload_policy).__name__}")
    if offload_policy is not None and strategy is ShardingStrategy.NO_SHARD:
        raise ValueError("OffloadPolicy needs sharded parameters; NO_SHARD keeps them whole on every device")
    if isinstance(persist_threshold, bool) or not isinstance(persist_threshold, int) or persist_threshold < 0:
        raise ValueError(f"persist_threshold must be a number of parameters >= 0, got {persist_threshold!r}")
    if reshard_after_forward is None:
        reshard_after_forward = strategy is not ShardingStrategy.SHARD_GRAD_OP
    count = _unit_counts.get(group, 0)
    _unit_counts[group] = count + 1
    name = f"{type(module).__name__}#{count}"  # until the root names it by its path
    comms = _comms(group, strategy, shard_size)
    entries = claim(module, values)
    if sync_module_states:
        _sync_values(entries, group, name)
    numel = sum(int(np.prod(e.shape)) for e in entries)
    replicate = offload_policy is None and (
        comms.shard is None or comms.shard.world_size == 1 or numel < persist_threshold)
    unit_comms = Comms(group, None) if replicate else comms
    grp = FSDPParamGroup(name, entries, unit_comms, group.device, mp_policy, offload_policy,
                         bool(reshard_after_forward)) if entries else None
    cls = type(module)
    if cls not in _classes:
        _classes[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    module.__class__ = _classes[cls]
    state = FSDPState(module, grp, group.world_size, mp_policy, prefetch)
    object.__setattr__(module, "_fsdp_state", state)
    return module
