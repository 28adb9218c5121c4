"""FSDP's knobs: sharding strategies, mixed precision, CPU offload, and which modules become units."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ... import dtypes as _dt
from ...nn.containers import ModuleDict, ModuleList
from ...nn.module import Module

# A unit whose parameters number fewer than this stays replicated (DeepSpeed's "param persistence
# threshold"): it then needs one all-reduce per step instead of two gathers and a reduce-scatter, and
# every host-staged collective costs a fixed ~2 ms on two H200s whatever its size (and 1.6 ms on
# lavapipe), while a replicated unit costs (N - 1) / N of its size per device (4x that with gradients
# and Adam's moments). 2**16 parameters (256 KiB in float32): a LayerNorm or a bias-only unit stays
# replicated, a weight matrix never does. Parameters inside a larger unit are never replicated: they
# ride along in the unit's one gather at no extra collective (see docs/design.md, FSDP).
PERSIST_THRESHOLD = 1 << 16


class ShardingStrategy(enum.Enum):
    """How parameters, gradients and optimizer state are split (names as in PyTorch FSDP and axonml).

    - FULL_SHARD: shard everything; gather each unit for forward, free it, gather it again for backward.
    - SHARD_GRAD_OP: shard everything, but keep a unit gathered from its forward to the end of backward
      (one gather per step instead of two; ZeRO-2-like memory between forward and backward).
    - NO_SHARD: replicate parameters and optimizer state on every rank, all-reduce gradients (data parallel).
    - HYBRID_SHARD: FULL_SHARD inside groups of ``shard_size`` ranks, replicated across the groups.
    """

    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"

    @classmethod
    def parse(cls, value: ShardingStrategy | str) -> ShardingStrategy:
        if isinstance(value, cls):
            return value
        try:
            return cls[str(value).upper()]
        except KeyError:
            raise ValueError(f"unknown sharding strategy {value!r}; use one of "
                             f"{', '.join(s.name for s in cls)}") from None


def shard_world_size(strategy: ShardingStrategy, world: int, shard_size: int | None) -> int:
    """How many ranks a unit's parameters are sharded over (1: replicated); refuses a ``shard_size`` the
    strategy cannot use. ``fully_shard`` and ``memory_estimate`` both ask here, so they refuse alike."""
    if strategy is ShardingStrategy.HYBRID_SHARD:
        if shard_size is None:
            if world % 2:
                raise ValueError(f"HYBRID_SHARD on {world} ranks: pass shard_size= (a divisor)")
            return world // 2
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1 or world % shard_size:
            raise ValueError(f"HYBRID_SHARD: shard_size must divide the group's {world} ranks, got {shard_size!r}")
        return shard_size
    if shard_size is not None and shard_size != world:
        raise ValueError(f"shard_size={shard_size} is for HYBRID_SHARD; {strategy.name} shards over all "
                         f"{world} ranks")
    return 1 if strategy is ShardingStrategy.NO_SHARD else world


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Compute in ``param_dtype`` while shards and optimizer stay in their own dtype (float32).

    Arguments:
        param_dtype: dtype of the gathered parameters (and so of forward and backward), e.g.
            ``wgpar.float16``; the gather moves half the bytes. None: the shards' dtype.
        reduce_dtype: dtype the gradients are summed in (float32 keeps the sum exact enough).
            None: ``param_dtype``'s.
        output_dtype: cast the root's floating-point outputs to this dtype (None: leave them).
        cast_forward_inputs: cast floating-point forward inputs to ``param_dtype``.
    float16 needs an adapter with the ``shader-f16`` feature; ``fully_shard`` checks it.
    """

    param_dtype: _dt.DType | None = None
    reduce_dtype: _dt.DType | None = None
    output_dtype: _dt.DType | None = None
    cast_forward_inputs: bool = True

    def __post_init__(self) -> None:
        for field in ("param_dtype", "reduce_dtype", "output_dtype"):
            value = getattr(self, field)
            if value is not None:
                dt = _dt.as_dtype(value)
                if not dt.is_float:
                    raise TypeError(f"MixedPrecisionPolicy.{field} must be a float dtype, got {dt.name}")
                object.__setattr__(self, field, dt)
        if self.reduce_dtype is None and self.param_dtype is not None:
            object.__setattr__(self, "reduce_dtype", self.param_dtype)


@dataclass(frozen=True)
class OffloadPolicy:
    """Keep shards, their gradients and the optimizer state in host memory and step on the host.

    The device holds only the gathered units; every gather uploads the unit's host shard (one upload
    per device), and reduced gradients are read back into host memory. Step the shards with
    ``HostAdamW`` / ``HostAdam`` / ``HostSGD`` (NumPy, one vectorised update per unit).
    """


def is_container(module: Module) -> bool:
    """A ModuleList / ModuleDict: its forward never runs (its elements are called), so it cannot be a unit,
    whose parameters are gathered around its forward."""
    return isinstance(module, (ModuleList, ModuleDict))


def _classes_policy(classes: frozenset[type]) -> Callable[[Module, str], bool]:
    def policy(module: Module, name: str) -> bool:
        return isinstance(module, tuple(classes))
    return policy


def _size_policy(min_num_params: int) -> Callable[[Module, str], bool]:
    def policy(module: Module, name: str) -> bool:
        return sum(p.numel() for p in module.parameters()) >= min_num_params
    return policy


def _children_policy(root: Module) -> Callable[[Module, str], bool]:
    # A container's elements are called by its parent, as a child would be: they stand in for it.
    children: set[int] = set()
    stack = list(root.children())
    while stack:
        m = stack.pop()
        if is_container(m):
            stack.extend(m.children())
        else:
            children.add(id(m))

    def policy(module: Module, name: str) -> bool:
        return id(module) in children and next(module.parameters(), None) is not None
    return policy


AutoWrap = None | bool | int | Iterable[type] | Callable[[Module, str], bool]


def plan_units(root: Module, auto_wrap: AutoWrap = None) -> list[tuple[str, Module]]:
    """The modules that become units, children before their parents, the root last.

    Arguments:
        root: the model.
        auto_wrap: which sub-modules become units of their own, besides the root:
            None (default): every direct child that has parameters (the blocks of a Sequential), the
            elements of a ModuleList / ModuleDict child counting as children;
            False: none (one unit); an int: every module with at least that many parameters
            (size-based, innermost first); a set of module classes; or ``fn(module, name) -> bool``.
            Containers (ModuleList, ModuleDict) are never units, whatever the policy says.
    """
    if auto_wrap is None:
        pick = _children_policy(root)
    elif auto_wrap is False:
        return [("", root)]
    elif isinstance(auto_wrap, bool) or auto_wrap is True:
        raise ValueError("auto_wrap=True is ambiguous: pass None (children), an int, module classes or a function")
    elif isinstance(auto_wrap, int):
        pick = _size_policy(auto_wrap)
    elif callable(auto_wrap) and not isinstance(auto_wrap, type):
        pick = auto_wrap
    else:
        classes = frozenset(auto_wrap if not isinstance(auto_wrap, type) else (auto_wrap,))
        if not classes or not all(isinstance(c, type) and issubclass(c, Module) for c in classes):
            raise TypeError(f"auto_wrap: expected Module classes, got {auto_wrap!r}")
        pick = _classes_policy(classes)
    chosen = [(name, m) for name, m in root.named_modules() if m is not root and not is_container(m) and pick(m, name)]
    # Bottom-up: a unit must exist before the unit around it claims the parameters left over.
    chosen.sort(key=lambda nm: -nm[0].count("."))
    return chosen + [("", root)]
