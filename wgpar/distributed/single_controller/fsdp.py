"""``FSDP(model, ctx)``: the single-controller form, one line for a whole model (like ``DataParallel``).

The driver thread holds the wrapper; every step is handed to the ranks' threads with
``MultiAdapterContext.run``. Construction reads the model's values to the host once, makes each
rank a structural copy whose parameters have no memory, and applies ``fully_shard`` bottom-up on
every rank (units chosen by ``auto_wrap``) with each rank's rows taken from the host copy, so the
model's memory ends up split across the devices (the original's memory is freed as it is sharded).
Batches are split and each rank's loss weighted by its share by the driver (``driver.py``, as for
``DataParallel``; gradients are summed, not averaged), so training equals single-device training on
the whole batch.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import ops
from ...nn.module import Module
from ...nn.parameter import Parameter
from ...tensor import Tensor
from ..fsdp import checkpoint as ckpt
from ..fsdp.api import _fully_shard
from ..fsdp.param import freed_tensor
from ..fsdp.policies import (
    PERSIST_THRESHOLD,
    AutoWrap,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardingStrategy,
    plan_units,
)
from .context import MultiAdapterContext
from .driver import DataDriver


def _empty_replica(module: Module, device) -> Module:
    """A structural copy of ``module`` whose parameters have no memory (FSDP fills their shards) and
    whose buffers are copied to ``device``."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = Parameter(freed_tensor(tuple(p.shape), p.dtype, device), p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = ops.to_device(b, device) if b.device is not device else ops.clone(b)
    return copy.deepcopy(module, memo)


class FSDP(DataDriver):
    """Fully sharded data-parallel training of ``module`` over the ranks of a MultiAdapterContext.

    ``fsdp(x, *rest)`` returns the per-rank outputs (every tensor or array argument split along dim 0,
    which must be the batch size, ``x``'s; as ``DataParallel``);
    ``fsdp.loss(fn, outputs, *targets)``, ``fsdp.backward(losses)``, ``fsdp.step(opts)`` or
    ``fsdp.train_step(x, y, loss_fn, opts)`` train (with accumulation, AMP and clipping: see
    ``Driver.train_step``); ``fsdp.modules[r]`` is rank r's sharded model
    (an FSDPModule), ``fsdp.optimizers(factory)`` makes one optimizer per rank over its shards.

    Arguments:
        module: the model (any device); its memory is freed as it is sharded.
        context: a MultiAdapterContext.
        auto_wrap: which sub-modules become units (see ``plan_units``; default: each direct child
            that has parameters).
        strategy, mp_policy, offload_policy, shard_size, prefetch, persist_threshold,
        reshard_after_forward: as for ``fully_shard``.
    """

    label = "fsdp:"

    def __init__(self, module: Module, context: MultiAdapterContext, *, auto_wrap: AutoWrap = None,
                 strategy: ShardingStrategy | str = ShardingStrategy.FULL_SHARD,
                 mp_policy: MixedPrecisionPolicy | None = None, offload_policy: OffloadPolicy | None = None,
                 shard_size: int | None = None, prefetch: int = 1, persist_threshold: int = PERSIST_THRESHOLD,
                 reshard_after_forward: bool | None = None) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"FSDP wraps a wgpar.nn.Module, got {type(module).__name__}")
        super().__init__(context)
        self.strategy = ShardingStrategy.parse(strategy)
        units = [name for name, _ in plan_units(module, auto_wrap)]
        host = {id(p): p.numpy() for p in module.parameters()}
        names = [n for n, _ in module.named_parameters()]
        source = dict(module.named_parameters())
        replicas = [module] + [_empty_replica(module, d) for d in context.devices[1:]]
        kw = dict(strategy=self.strategy, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy,
                  offload_policy=offload_policy, shard_size=shard_size, prefetch=prefetch,
                  persist_threshold=persist_threshold, sync_module_states=False)

        def shard(rank: int) -> Module:
            m = replicas[rank]
            if rank == 0 and m.device is not None and m.device is not context.devices[0]:
                m.to(context.devices[0])
            mine = dict(m.named_parameters())
            values = {id(mine[n]): host[id(source[n])] for n in names}
            mods = dict(m.named_modules())
            for name in units:
                _fully_shard(mods[name], context.comm(rank), **kw, values=lambda p: values.get(id(p)))
            m.set_gradient_divide_factor(1.0)  # each rank's loss is weighted by its batch share
            m.lazy_init()
            return m

        self.modules: list[Module] = context.run(shard)

    @property
    def module(self) -> Module:
        """Rank 0's sharded model."""
        return self.modules[0]

    def _run(self, fn: Callable, *per_rank) -> list:
        """``context.run`` for a part of a training step: if any rank fails, every rank forgets the step at
        its next forward (a rank that failed outside FSDP's hooks would otherwise keep its half-done step,
        and the next step's collectives would disagree)."""
        try:
            return self.context.run(fn, *per_rank)
        except BaseException:
            for m in self.modules:
                m.fsdp_state.discard_step()
            raise

    def _rank_no_sync(self, rank: int) -> contextlib.AbstractContextManager:
        return self.modules[rank].no_sync()

    def _clip(self, rank: int, max_norm: float) -> None:
        self.modules[rank].clip_grad_norm_(max_norm)  # sums the shards' squares over the ranks

    # -- state -------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, np.ndarray]:
        """The whole model's parameters and buffers as NumPy arrays (gathered unit by unit)."""
        return self.context.run(lambda r: ckpt.full_state_dict(self.modules[r], rank0_only=True))[0]

    def state_dict(self) -> dict[str, Tensor]:
        """The whole model's parameters and buffers as Tensors on rank 0's device (gathered on every rank)."""
        return self.context.run(lambda r: self.modules[r].state_dict())[0]

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list[str], list[str]]:
        """Load whole tensors (a single-device model's state dict, or ``state_dict()``'s) on every rank."""
        return self.context.run(lambda r: self.modules[r].load_state_dict(state, strict))[0]

    def save_checkpoint(self, path: str | os.PathLike, optimizers: Sequence | None = None) -> None:
        """A sharded checkpoint: one safetensors file per rank plus index.json (see checkpoint.py)."""
        opts = self._per_rank(optimizers, "save_checkpoint") if optimizers is not None else [None] * self.world_size
        self.context.run(lambda r, o: ckpt.save_sharded_checkpoint(self.modules[r], path, o), opts)

    def load_checkpoint(self, path: str | os.PathLike, optimizers: Sequence | None = None) -> None:
        """Load a sharded checkpoint saved on any number of ranks."""
        opts = self._per_rank(optimizers, "load_checkpoint") if optimizers is not None else [None] * self.world_size
        self.context.run(lambda r, o: ckpt.load_sharded_checkpoint(self.modules[r], path, o), opts)
