"""``memory_estimate``: what FSDP keeps on each device, per strategy, before anything runs.

It lays the model out exactly as ``fully_shard`` would (the same units, parameter owners, dim-0
padding and flat-buffer alignment), so its parameter, gradient and optimizer figures are the byte
counts ``memory_stats`` shows (the tests check that), and its ``gathered`` figure bounds what the
gathered units add during forward and backward. Activations are not included: they depend on the
batch and the model's forward, not on FSDP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ... import dtypes as _dt
from ...nn.module import Module
from ...nn.parameter import Parameter
from . import collectives as C
from .param import ShardGeometry
from .policies import PERSIST_THRESHOLD, AutoWrap, MixedPrecisionPolicy, ShardingStrategy, plan_units, shard_world_size

_STATE_COPIES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd_momentum": 1, None: 0}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device (one rank) under FSDP, next to what DataParallel would hold.

    ``params``: shards (and replicated units) between steps. ``grads``: the reduced gradients after
    backward (offloaded: until backward ends, when they move to the host). ``optimizer``: optimizer
    state. ``gathered``: the most the gathered units add at once during the step: full parameters
    and gather buffers, and in backward the full gradients and the reduce-scatter input of the unit
    being reduced (``total`` is an upper bound of the step's peak but for activations, so a
    ``set_memory_limit`` of ``total`` plus the activations fits). ``host``: host memory per rank with offload (shards,
    gradients, optimizer state). ``data_parallel``: parameters, gradients and optimizer state of a
    full replica.
    """

    world_size: int
    strategy: str
    params: int
    grads: int
    optimizer: int
    gathered: int
    host: int
    data_parallel: int

    @property
    def total(self) -> int:
        """Everything but activations, at the step's peak (parameters, gradients, state, gathered units)."""
        return self.params + self.grads + self.optimizer + self.gathered

    def __str__(self) -> str:
        mib = 1 << 20
        return (f"FSDP {self.strategy} on {self.world_size} ranks, per device: params {self.params / mib:.2f} MiB, "
                f"grads {self.grads / mib:.2f} MiB, optimizer {self.optimizer / mib:.2f} MiB, gathered "
                f"{self.gathered / mib:.2f} MiB, total {self.total / mib:.2f} MiB (+ activations); "
                f"DataParallel {self.data_parallel / mib:.2f} MiB")


@dataclass
class _Unit:
    params: list[Parameter]
    sharded: bool
    world: int
    dtype: _dt.DType
    compute: _dt.DType
    reduce: _dt.DType
    root: bool


def _owners(model: Module, unit_modules: list[Module]) -> dict[int, list[Parameter]]:
    """Parameters by owning unit (id of its module): the innermost unit enclosing every use."""
    units = {id(m) for m in unit_modules}
    chains: dict[int, list[tuple]] = {}
    objs: dict[int, Parameter] = {}
    seen: set[int] = set()
    stack = [(model, (id(model),))]
    order: list[int] = []
    while stack:
        m, chain = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        for p in m._parameters.values():
            if p is None:
                continue
            if id(p) not in objs:
                objs[id(p)] = p
                order.append(id(p))
            chains.setdefault(id(p), []).append(chain)
        for child in reversed([c for c in m._modules.values() if c is not None]):
            stack.append((child, chain + (id(child),) if id(child) in units else chain))
    owned: dict[int, list[Parameter]] = {u: [] for u in units}
    for pid in order:
        common = list(chains[pid][0])
        for chain in chains[pid][1:]:
            k = 0
            while k < min(len(common), len(chain)) and common[k] == chain[k]:
                k += 1
            common = common[:k]
        owned[common[-1]].append(objs[pid])
    return owned


def memory_estimate(model: Module, world_size: int | None = None,
                    strategy: ShardingStrategy | str = ShardingStrategy.FULL_SHARD, *, auto_wrap: AutoWrap = None,
                    optimizer: str | None = "adamw", mp_policy: MixedPrecisionPolicy | None = None,
                    offload: bool = False, prefetch: int = 1, persist_threshold: int = PERSIST_THRESHOLD,
                    shard_size: int | None = None) -> MemoryEstimate:
    """Per-device memory of training ``model`` with FSDP on ``world_size`` ranks (see MemoryEstimate).

    Arguments:
        model: an unsharded model (laid out with ``auto_wrap`` as the FSDP wrapper would), or a model
            already sharded with ``fully_shard`` (its own units; ``world_size`` may be left out).
        world_size: number of ranks.
        strategy: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD (``shard_size``: default half).
        optimizer: "adamw" / "adam" (two moments), "sgd_momentum" (one buffer), "sgd" or None (none).
        mp_policy, offload, prefetch, persist_threshold: as for ``fully_shard``.
    """
    if not isinstance(model, Module):
        raise TypeError(f"memory_estimate: expected a wgpar.nn.Module, got {type(model).__name__} (wrap a list of "
                        "layers in nn.Sequential or nn.ModuleList inside a module)")
    strategy = ShardingStrategy.parse(strategy)
    if optimizer not in _STATE_COPIES:
        raise ValueError(f"memory_estimate: optimizer must be one of {sorted(k for k in _STATE_COPIES if k)} or None, "
                         f"got {optimizer!r}")
    groups = _sharded_groups(model)
    if groups:
        units = [_Unit([fp.unsharded for fp in g.params], g.sharded, g.world, g.dtype, g.compute_dtype,
                       g.reduce_dtype, g.owner is not None and g.owner.module is model) for g in groups]
        world_size = groups[0].comms.dp.world_size if world_size is None else world_size
        offload = any(g.offload is not None for g in groups)
    else:
        if world_size is None or world_size < 1:
            raise ValueError(f"memory_estimate: world_size must be a positive number of ranks, got {world_size!r}")
        shard_world = shard_world_size(strategy, world_size, shard_size)  # refuses what fully_shard refuses
        unit_modules = [m for _, m in plan_units(model, auto_wrap)]
        owned = _owners(model, unit_modules)
        units = []
        for m in unit_modules:
            ps = owned[id(m)]
            if not ps:
                continue
            dtype = ps[0].dtype
            numel = sum(p.numel() for p in ps)
            sharded = offload or (shard_world > 1 and numel >= persist_threshold)
            compute = mp_policy.param_dtype if mp_policy is not None and mp_policy.param_dtype else dtype
            reduce = mp_policy.reduce_dtype if mp_policy is not None and mp_policy.reduce_dtype else dtype
            units.append(_Unit(ps, sharded, shard_world if sharded else 1, dtype, compute, reduce, m is model))
    params = grads = opt = host = 0
    copies = _STATE_COPIES[optimizer]
    # Per non-root unit: full parameters (F), their gather buffers while in flight (T), and in backward its
    # full gradients (G) plus the reduce-scatter input (R), alive together while the unit's reduction starts.
    fulls: list[int] = []
    transients: list[int] = []
    reducing: list[int] = []
    root = 0
    for u in units:
        b, cb, rb = u.dtype.itemsize, u.compute.itemsize, u.reduce.itemsize
        trainable = [p for p in u.params if p.requires_grad]
        full = sum(p.numel() for p in u.params) * cb
        full_grads = sum(p.numel() for p in trainable) * cb
        if u.sharded:
            geoms = [ShardGeometry(tuple(p.shape), u.world, 0) for p in u.params]
            chunk = C.align(sum(g.shard_numel for g in geoms))
            shard_numel = sum(g.shard_numel for g, p in zip(geoms, u.params) if p.requires_grad)
            unit_grads = C.align(shard_numel) * rb if rb == b else shard_numel * b
            unit_params, unit_opt = chunk * b, copies * shard_numel * b
            send = chunk * cb if cb != b or offload else 0  # a cast (or uploaded) copy of the shards
            transient = u.world * chunk * cb + send
            reduce_in = u.world * C.align(shard_numel) * rb
        else:
            numel = sum(p.numel() for p in trainable)
            unit_params = sum(p.numel() for p in u.params) * b
            unit_grads = C.align(numel) * rb if rb == b else numel * b
            unit_opt = copies * numel * b
            transient = reduce_in = 0  # the all-reduce works in the buffer that becomes the gradients
            full = full if cb != b else 0  # without a cast forward uses the replicated parameters themselves
        if offload and u.sharded:
            # Shards and state live on the host; the reduced gradients wait on the device until backward ends.
            host += unit_params + unit_grads + unit_opt
            unit_params = unit_opt = 0
        params += unit_params
        grads += unit_grads
        opt += unit_opt
        if u.root:
            # Gathered from its forward to the end of backward, its gradients from where backward reaches it.
            root = full + full_grads + max(transient, reduce_in)
        else:
            fulls.append(full)
            transients.append(transient)
            reducing.append(full_grads + reduce_in)
    ahead = sum(sorted(transients, reverse=True)[:prefetch])  # prefetched gathers in flight
    if strategy is ShardingStrategy.SHARD_GRAD_OP:
        # Every unit stays gathered from its forward to the end of backward.
        gathered = root + sum(fulls) + max(reducing, default=0) + max(transients, default=0) + ahead
    else:
        # The unit computing holds its parameters and, while its gather lands, the gather buffers.
        forward = max((f + t for f, t in zip(fulls, transients)), default=0) + ahead
        # Backward may gather the next unit (and prefetch more) before the one just done starts its reduction.
        gathered = root + max((f + r for f, r in zip(fulls, reducing)), default=0) + forward
    total_numel = sum(p.numel() for p in model.parameters()) if not groups else sum(
        math.prod(p.shape) for u in units for p in u.params)
    trainable_numel = sum(p.numel() for u in units for p in u.params if p.requires_grad)
    itemsize = units[0].dtype.itemsize if units else 4
    dp = (total_numel + trainable_numel * (1 + copies)) * itemsize
    return MemoryEstimate(world_size, strategy.name, params, grads, opt, gathered, host, dp)


def _sharded_groups(model: Module) -> list:
    out = []
    for m in model.modules():
        st = m.__dict__.get("_fsdp_state")
        if st is not None and st.group is not None:
            out.append(st.group)
    return out
