"""One FSDP parameter: how it is sharded on dim 0, and the Parameters that stand for it.

Every managed parameter has two faces, as in PyTorch FSDP2:

- ``registered``: what its modules hold between forwards and what the optimizer steps. For a
  sharded parameter it is this rank's shard, ``ceil(rows / N)`` rows of dim 0 (rank r holds rows
  ``[r * c, (r + 1) * c)``, padded with zero rows where the parameter ends), a view into its unit's
  flat shard buffer; offloaded, an :class:`OffloadedShard` whose values live in host memory. For a
  replicated parameter (a small unit, NO_SHARD) it is the full parameter itself.
- ``unsharded``: the full-size Parameter that forward and backward use, in the compute dtype. Its
  storage exists only while its unit is gathered (``Storage.free`` / ``materialize``); the same
  object is reused every time, so the autograd graph's saved tensors stay valid (the values are
  restored inside ``autograd.preserve_version``). For a replicated parameter without a dtype cast
  it shares the registered parameter's storage (and is never freed).

Swapping which of the two the modules hold (``to_sharded`` / ``to_unsharded``) is what makes
``model.parameters()`` give the shards to the optimizer and the full tensors to forward.
"""

from __future__ import annotations

import enum
import math
import weakref

import numpy as np

from ... import dtypes as _dt
from ...errors import StorageFreedError
from ...nn.module import Module
from ...nn.parameter import Parameter
from ...runtime.device import Device
from ...storage import Storage
from ...tensor import Tensor


class ShardedState(enum.Enum):
    """Whether a unit's parameters are gathered (UNSHARDED) or exist only as shards (SHARDED)."""

    SHARDED = "sharded"
    UNSHARDED = "unsharded"


def freed_tensor(shape: tuple[int, ...], dtype: _dt.DType, device: Device) -> Tensor:
    """A tensor whose storage has never had memory (``is_freed``): materialised when it is needed.

    Costs no device memory, not even for a moment (a parameter larger than what is left on the
    device can still be described).
    """
    storage = Storage(device, dtype, 0)
    storage.numel = math.prod(shape)
    return Tensor(storage, tuple(shape))


class _GuardStorage(Storage):
    """The storage of a parameter's guard: full size, no memory, and any kernel that touches it raises
    naming the parameter and its unit (see ``FSDPParam.to_guard``)."""

    __slots__ = ("_param",)

    def __init__(self, fp: FSDPParam, shape: tuple[int, ...], dtype: _dt.DType, device: Device) -> None:
        super().__init__(device, dtype, 0)
        self.numel = math.prod(shape)
        self._param = weakref.ref(fp)

    def _refuse(self) -> StorageFreedError:
        fp = self._param()
        name = fp.name if fp is not None else "?"
        unit = fp.group.name if fp is not None and fp.group is not None else "?"
        return StorageFreedError(
            f"FSDP: parameter '{name}' of unit '{unit}' was used while the unit is sharded: a module used it "
            f"without calling the unit's forward (only calling the module '{unit}' gathers it). Call the module, "
            "or pick units (auto_wrap / fully_shard) so that one unit's module encloses every use")

    @property
    def buffer(self):
        raise self._refuse()

    def materialize(self) -> None:
        raise self._refuse()


class ShardGeometry:
    """Dim-0 sharding of a parameter of ``shape`` over ``world`` ranks, seen from ``rank``.

    A 0-d parameter counts as one row of one element, a 1-d one as rows of one element. Every rank
    holds ``per_rank = ceil(rows / world)`` rows; the ranks past the end hold zero padding.
    """

    __slots__ = ("shape", "world", "rank", "rows", "row", "per_rank")

    def __init__(self, shape: tuple[int, ...], world: int, rank: int) -> None:
        self.shape = tuple(shape)
        self.world = world
        self.rank = rank
        self.rows = self.shape[0] if self.shape else 1
        self.row = math.prod(self.shape[1:]) if self.shape else 1
        self.per_rank = -(-self.rows // world)

    @property
    def numel(self) -> int:
        """Elements of the whole (unsharded) parameter."""
        return math.prod(self.shape)

    @property
    def shard_shape(self) -> tuple[int, ...]:
        """The shape of one rank's shard: ``per_rank`` rows."""
        return (self.per_rank, *self.shape[1:]) if self.shape else (self.per_rank,)

    @property
    def shard_numel(self) -> int:
        """Elements of one rank's shard, padding included."""
        return self.per_rank * self.row

    def real_rows(self, rank: int | None = None) -> tuple[int, int]:
        """The rows of the full parameter that rank ``rank`` (default: this one) holds: [lo, hi)."""
        r = self.rank if rank is None else rank
        lo = min(r * self.per_rank, self.rows)
        return lo, min(lo + self.per_rank, self.rows)

    def __repr__(self) -> str:
        return f"ShardGeometry(shape={self.shape}, world={self.world}, rank={self.rank}, per_rank={self.per_rank})"


class OffloadedShard(Parameter):
    """An FSDP shard kept in host memory (``OffloadPolicy``); it has no device memory.

    ``host`` holds its values (a NumPy view into its unit's flat host shard, at ``host_offset``)
    and ``host_grad`` its gradient once backward has reduced one (None before; cleared by
    ``zero_grad``). Step such shards with the host optimizers (``HostAdamW``, ``HostAdam``,
    ``HostSGD``); a device optimizer refuses them.
    """

    def __init__(self, host_flat: np.ndarray, offset: int, shape: tuple[int, ...], device: Device,
                 requires_grad: bool = True) -> None:
        super().__init__(freed_tensor(shape, _dt.float32, device), requires_grad)
        self.host_flat = host_flat
        self.host_offset = offset
        self.host = host_flat[offset:offset + math.prod(shape)].reshape(shape)
        self.host_grad: np.ndarray | None = None
        self.host_grad_flat: np.ndarray | None = None  # the unit's reduced gradients, host_grad views it
        self.host_grad_offset = 0

    def set_host_grad(self, flat: np.ndarray, offset: int) -> None:
        """Add (or set) the gradient at ``flat[offset:offset + numel]`` (a view is kept when set)."""
        view = flat[offset:offset + self.numel()].reshape(self.shape)
        if self.host_grad is None:
            self.host_grad, self.host_grad_flat, self.host_grad_offset = view, flat, offset
        else:
            self.host_grad += view

    def clear_host_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) the host gradient.

        Arguments:
            set_to_none: set it to None rather than fill it with zeros.
        """
        if self.host_grad is None:
            return
        if set_to_none:
            self.host_grad = self.host_grad_flat = None
        else:
            self.host_grad[...] = 0

    def numpy(self) -> np.ndarray:
        """A copy of the shard's host values."""
        return self.host.copy()

    def __repr__(self) -> str:
        return f"OffloadedShard(shape={self.shape}, host)"


class FSDPParam:
    """One managed parameter of a unit (see the module docstring for its two faces).

    Arguments:
        name: its name inside the unit's module (the full name once the root is known).
        geometry: its dim-0 sharding, or None when it is replicated.
        registered: what modules hold while the unit is sharded.
        unsharded: the full-size Parameter forward uses.
        offset: where its shard starts in the unit's flat shard (elements).
        alias: ``unsharded`` shares ``registered``'s storage (replicated, same dtype): never freed.
    """

    __slots__ = ("name", "geometry", "registered", "unsharded", "guard", "offset", "alias", "_modules", "_group",
                 "__weakref__")

    def __init__(self, name: str, geometry: ShardGeometry | None, registered: Parameter, unsharded: Parameter,
                 offset: int, alias: bool) -> None:
        self.name = name
        self.geometry = geometry
        self.registered = registered
        self.unsharded = unsharded
        self.offset = offset
        self.alias = alias
        # Links back up the model are weak (modules hold their parameters, a unit its FSDPParams): a dropped
        # model is freed by reference counting, its device memory at once, without the cycle collector.
        self._modules: list[tuple[weakref.ref, str]] = []
        self._group: weakref.ref | None = None
        # What modules hold while the root computes and this unit is sharded: the full shape, no memory.
        self.guard = Parameter(Tensor(_GuardStorage(self, unsharded.shape, unsharded.dtype, unsharded.device),
                                      unsharded.shape), registered.requires_grad)
        for p in (registered, unsharded, self.guard):
            link_param(p, self)

    @property
    def module_infos(self) -> list[tuple[Module, str]]:
        """(module, attribute) pairs that hold this parameter."""
        return [(m, attr) for ref, attr in self._modules if (m := ref()) is not None]

    @module_infos.setter
    def module_infos(self, infos: list[tuple[Module, str]]) -> None:
        self._modules = [(weakref.ref(m), attr) for m, attr in infos]

    @property
    def group(self):
        """The FSDPParamGroup (unit) it belongs to, or None."""
        return self._group() if self._group is not None else None

    @group.setter
    def group(self, group) -> None:
        self._group = weakref.ref(group) if group is not None else None

    @property
    def sharded(self) -> bool:
        return self.geometry is not None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.unsharded.shape

    @property
    def requires_grad(self) -> bool:
        return self.registered.requires_grad

    def to_sharded(self) -> None:
        for module, attr in self.module_infos:
            setattr(module, attr, self.registered)

    def to_guard(self) -> None:
        """Put the guard on the modules: a use of the parameter by a module whose unit's forward did not
        run raises, naming it, where the shard would compute silently with the wrong rows."""
        self.guard.requires_grad = self.registered.requires_grad
        for module, attr in self.module_infos:
            setattr(module, attr, self.guard)

    def to_unsharded(self) -> None:
        self.unsharded.requires_grad = self.registered.requires_grad  # the user may freeze a shard
        for module, attr in self.module_infos:
            setattr(module, attr, self.unsharded)

    def free_unsharded(self) -> None:
        if not self.alias:
            self.unsharded.untyped_storage().free()

    def __repr__(self) -> str:
        g = self.geometry
        how = "replicated" if g is None else f"{g.world} shards of {g.per_rank} rows"
        return f"<FSDPParam {self.name} {self.shape} {how}>"


def link_param(p: Tensor, fp: FSDPParam) -> None:
    """Make ``fsdp_param_of(p)`` find ``fp`` (weakly: a parameter does not keep its model alive)."""
    p.__dict__["_fsdp_param"] = weakref.ref(fp)


def fsdp_param_of(p: Tensor) -> FSDPParam | None:
    """The FSDPParam a registered, unsharded or replaced original parameter belongs to (or None)."""
    ref = p.__dict__.get("_fsdp_param") if isinstance(p, Tensor) else None
    return ref() if ref is not None else None
