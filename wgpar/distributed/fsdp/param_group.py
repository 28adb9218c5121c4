"""A unit's parameters and their lifecycle: shard, gather (unshard), reshard, reduce gradients.

A unit (one ``fully_shard`` call) keeps this rank's shards of all its parameters in one flat
buffer; ``unshard`` gathers them with one collective, ``wait_for_unshard`` writes each full
parameter from the gathered buffer (the full tensors' storages are materialised here and freed
in ``reshard``), and after backward ``launch_reduction`` sums the full gradients into this rank's
shard with one reduce-scatter (plus, for HYBRID_SHARD, one all-reduce of the shard across the
replica groups). Every lifecycle method is safe to call twice; a failed collective leaves the
unit SHARDED, so the next step starts clean.

A replicated unit (NO_SHARD, or a unit smaller than the persistence threshold) keeps its full
parameters on every rank: it never gathers, and its gradients are summed with one all-reduce.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np

from ... import dtypes as _dt
from ... import ops
from ...autograd.grad_mode import no_grad
from ...autograd.versions import preserve_version
from ...nn.module import Module
from ...nn.parameter import Parameter
from ...runtime import memory_history as _hist
from ...runtime.device import Device
from ...tensor import Tensor
from ..group import ProcessGroup, Work
from . import collectives as C
from .param import FSDPParam, OffloadedShard, ShardedState, ShardGeometry, freed_tensor, link_param
from .policies import MixedPrecisionPolicy, OffloadPolicy


@dataclass(frozen=True)
class Comms:
    """The groups a unit talks over: ``dp`` (every data-parallel rank: replicated units reduce here),
    ``shard`` (the ranks its parameters are sharded over; None: replicated) and ``replicate`` (HYBRID_SHARD:
    the ranks holding the same shard, whose shard gradients are summed after the reduce-scatter)."""

    dp: ProcessGroup
    shard: ProcessGroup | None
    replicate: ProcessGroup | None = None


@dataclass
class _Entry:
    """What a unit's parameter is built from: its shape, the modules holding it, and its full value."""

    name: str
    shape: tuple[int, ...]
    dtype: _dt.DType
    requires_grad: bool
    refs: list[tuple[Module, str]]  # (module, attribute) pairs that hold it
    value: Tensor | np.ndarray  # the full parameter on this device, or on the host
    original: Parameter | None = None  # the module's own Parameter: freed once sharded (reused if replicated)
    aliases: list[Parameter] = field(default_factory=list)  # older objects that stood for it


class _Reduction:
    __slots__ = ("work", "out", "layout", "second")

    def __init__(self, work: Work, out: Tensor, layout: list[tuple[FSDPParam, int]]) -> None:
        self.work = work
        self.out = out
        self.layout = layout
        self.second: Work | None = None


def _done(result) -> Work:
    return Work.completed("fsdp (one rank)", result)


class FSDPParamGroup:
    """The parameters of one unit on this rank, their flat shard, and their lifecycle.

    Arguments:
        name: the unit's name (its module's qualified name once the root is known); labels collectives.
        entries: the parameters, each with its full value (see ``_Entry``).
        comms: the groups (see ``Comms``).
        mp: mixed precision (compute dtype of the gathered parameters, dtype of the reduction).
        offload: keep the shards (and their gradients) in host memory.
        reshard_after_forward: free the gathered parameters after forward (FULL_SHARD).
    """

    def __init__(self, name: str, entries: list[_Entry], comms: Comms, device: Device,
                 mp: MixedPrecisionPolicy | None, offload: OffloadPolicy | None,
                 reshard_after_forward: bool) -> None:
        self.name = name
        self.comms = comms
        self.device = device
        self.mp = mp
        self.offload = offload
        self.reshard_after_forward = reshard_after_forward
        dtypes = {e.dtype for e in entries}
        if len(dtypes) > 1:
            desc = ", ".join(f"{e.name}: {e.dtype.name}" for e in entries)
            raise TypeError(f"fully_shard({name}): a unit's parameters must share one dtype ({desc}); "
                            "wrap the modules of other dtypes separately")
        self.dtype: _dt.DType = dtypes.pop() if dtypes else _dt.float32
        self.compute_dtype = (mp.param_dtype if mp is not None and mp.param_dtype is not None else self.dtype)
        self.reduce_dtype = (mp.reduce_dtype if mp is not None and mp.reduce_dtype is not None else self.dtype)
        self.state = ShardedState.SHARDED
        self.flat: Tensor | None = None  # this rank's shards, one buffer (device)
        self.host_flat: np.ndarray | None = None  # the same, offloaded
        self.chunk = 0
        self._gather: tuple[Work, Tensor | None, int] | None = None  # (work, output, shards' version)
        self._gathered_version = -1
        self._reduction: _Reduction | None = None
        # Per iteration (reset by the root): see state.py.
        self.ran_forward = False
        self.expected: set[int] = set()
        self.arrived: set[int] = set()
        self.marks = 0
        self.post_backward_done = False
        self.sync = True  # reduce gradients after backward (False: accumulate them unsharded, no_sync)
        self.guarded = False  # while the root computes: sharded, the modules hold guards (FSDPParam.to_guard)
        self.num_gathers = 0  # collectives this unit started (tests and benchmarks read these)
        self.num_reductions = 0
        self.offload_traffic = {"h2d_bytes": 0, "d2h_bytes": 0}  # host shards uploaded, gradients read back
        self._owner: weakref.ref | None = None
        self.params = self._build(entries)
        for fp in self.params:
            fp.group = self

    # -- construction ---------------------------------------------------------------------
    @property
    def owner(self):
        """The FSDPState this unit belongs to (held weakly: the state holds the unit)."""
        return self._owner() if self._owner is not None else None

    @owner.setter
    def owner(self, state) -> None:
        self._owner = weakref.ref(state) if state is not None else None

    @property
    def sharded(self) -> bool:
        """Whether the unit is sharded over more than its own rank (it has a shard group)."""
        return self.comms.shard is not None

    @property
    def world(self) -> int:
        """The number of ranks the unit is sharded over (1 when not sharded)."""
        return self.comms.shard.world_size if self.comms.shard is not None else 1

    def _build(self, entries: list[_Entry]) -> list[FSDPParam]:
        if not self.sharded:
            return [self._build_replicated(e) for e in entries]
        shard = self.comms.shard
        geoms = [ShardGeometry(e.shape, shard.world_size, shard.rank) for e in entries]
        offsets = np.cumsum([0] + [g.shard_numel for g in geoms]).tolist()
        self.chunk = C.align(offsets[-1])
        host = self.offload is not None or all(isinstance(e.value, np.ndarray) for e in entries)
        if host:
            flat_host = np.zeros(self.chunk, dtype=self.dtype.np)
            for e, g, off in zip(entries, geoms, offsets):
                lo, hi = g.real_rows()
                flat_host[off:off + (hi - lo) * g.row] = _host_rows(e.value, g, lo, hi)
            if self.offload is not None:
                self.host_flat = flat_host
            else:
                self.flat = Tensor.from_numpy(flat_host, device=self.device, dtype=self.dtype)
        else:
            self.flat = C.flat_zeros(self.chunk, self.dtype, self.device)
            with no_grad():
                for e, g, off in zip(entries, geoms, offsets):
                    value = e.value if isinstance(e.value, Tensor) else Tensor.from_numpy(e.value, self.device)
                    if value.device is not self.device:
                        value = value.to(self.device)
                    C.copy_rows_in(g, ops.contiguous(value), self.flat, self.chunk, off, g.rank, 1)
        params = []
        for e, g, off in zip(entries, geoms, offsets):
            rg = e.requires_grad
            if self.offload is not None:
                registered: Parameter = OffloadedShard(self.host_flat, off, g.shard_shape, self.device, rg)
            else:
                registered = Parameter(Tensor(self.flat._storage, g.shard_shape, None, off), rg)
            unsharded = Parameter(freed_tensor(g.shape, self.compute_dtype, self.device), rg)
            params.append(self._finish_param(e, FSDPParam(e.name, g, registered, unsharded, off, alias=False)))
            if e.original is not None:
                e.original.untyped_storage().free()  # replaced by the shards (copied from it in stream order)
        return params

    @staticmethod
    def _finish_param(e: _Entry, fp: FSDPParam) -> FSDPParam:
        fp.module_infos = list(e.refs)
        for old in [*e.aliases, *([e.original] if e.original is not None else [])]:
            link_param(old, fp)  # a module still holding an older object finds the new owner
        return fp

    def _build_replicated(self, e: _Entry) -> FSDPParam:
        if isinstance(e.value, np.ndarray):
            registered = Parameter(Tensor.from_numpy(e.value, device=self.device, dtype=self.dtype), e.requires_grad)
        elif e.original is not None and e.value is e.original and e.original.device is self.device:
            registered = e.original
        else:
            registered = Parameter(ops.contiguous(e.value.to(self.device)), e.requires_grad)
        alias = self.compute_dtype is self.dtype
        if alias:
            unsharded = Parameter(registered, registered.requires_grad)
        else:
            unsharded = Parameter(freed_tensor(registered.shape, self.compute_dtype, self.device),
                                  registered.requires_grad)
        return self._finish_param(e, FSDPParam(e.name, None, registered, unsharded, 0, alias=alias))

    # -- sizes (memory_estimate and the tests read these) ----------------------------------
    def shard_bytes(self) -> int:
        """Device bytes this rank holds for the unit's parameters between steps."""
        if self.offload is not None:
            return 0
        if self.sharded:
            return self.chunk * self.dtype.itemsize
        return sum(fp.registered.nbytes for fp in self.params)

    def full_bytes(self) -> int:
        """Bytes of the gathered (unsharded) parameters in the compute dtype."""
        return sum(math.prod(fp.shape) for fp in self.params) * self.compute_dtype.itemsize

    # -- gather -----------------------------------------------------------------------------
    def _values_version(self) -> int:
        """Changes whenever a shard is written (optimizer step, load): gathered values are then stale."""
        seen: dict[int, int] = {}
        for fp in self.params:
            s = fp.registered._storage
            seen[id(s)] = s.version
        return sum(seen.values())

    @property
    def gathering(self) -> bool:
        """Whether an all-gather of the unit's parameters is in flight."""
        return self._gather is not None

    def unshard(self, async_op: bool = False) -> None:
        """Start gathering the unit's parameters (a no-op while gathered or gathering)."""
        if self.state is ShardedState.UNSHARDED:
            if self._gathered_version == self._values_version():
                return
            self.reshard()  # the shards changed since they were gathered (a step without backward)
        if self._gather is None and self.params:
            version = self._values_version()
            if self.sharded:
                with no_grad(), _hist.category(_hist.FSDP_UNIT):  # the gather's buffers, on the timeline
                    send = self._send_buffer()
                    if self.world == 1:
                        self._gather = (_done(send), send, version)
                    else:
                        self._gather = (*C.all_gather(self.comms.shard, send, self.name), version)
                        self.num_gathers += 1
            else:
                self._gather = (_done(None), None, version)
        if not async_op:
            self.wait_for_unshard()

    def _send_buffer(self) -> Tensor:
        if self.host_flat is not None:
            self.offload_traffic["h2d_bytes"] += self.chunk * self.compute_dtype.itemsize
            return Tensor.from_numpy(self.host_flat, device=self.device, dtype=self.compute_dtype)
        return self.flat if self.compute_dtype is self.dtype else ops.cast(self.flat, self.compute_dtype)

    def wait_for_unshard(self) -> None:
        """Finish the gather: materialise the full parameters and put them on the modules."""
        if self.state is ShardedState.UNSHARDED and self._gather is None:
            return
        if not self.params:
            self.state = ShardedState.UNSHARDED
            return
        if self._gather is None:
            self.unshard(async_op=True)
        work, out, version = self._gather
        self._gather = None
        work.wait()
        try:
            with no_grad(), _hist.category(_hist.FSDP_UNIT):
                for fp in self.params:
                    if fp.alias:
                        continue
                    # The graph may have saved this tensor in an earlier forward of this step: restore
                    # the same values without counting it as an in-place change.
                    with preserve_version(fp.unsharded):
                        fp.unsharded.untyped_storage().materialize()
                        if fp.sharded:
                            C.copy_rows_out(fp.geometry, fp.unsharded, out, self.chunk, fp.offset)
                        else:
                            ops.copy_(fp.unsharded, fp.registered)
        except BaseException:
            for fp in self.params:
                fp.free_unsharded()
            raise
        del out
        self._gathered_version = version
        self.state = ShardedState.UNSHARDED
        for fp in self.params:
            fp.to_unsharded()

    def reshard(self) -> None:
        """Free the gathered parameters and put the shards back on the modules (a no-op when sharded)."""
        if self._gather is not None:
            work = self._gather[0]
            self._gather = None
            try:  # the output may still be written by the collective: let it finish before dropping it
                work.wait()
            except Exception:  # a failed gather: its error was (or will be) raised where it was awaited
                pass
        if self.state is ShardedState.SHARDED:
            return
        for fp in self.params:
            fp.free_unsharded()
            if self.guarded:
                fp.to_guard()
            else:
                fp.to_sharded()
        self.state = ShardedState.SHARDED

    def set_guarded(self, on: bool) -> None:
        """While the root's forward runs, hold guards instead of shards whenever the unit is sharded."""
        self.guarded = on
        if self.state is ShardedState.SHARDED:
            for fp in self.params:
                if on:
                    fp.to_guard()
                else:
                    fp.to_sharded()

    # -- gradients --------------------------------------------------------------------------
    @property
    def reducing(self) -> bool:
        """Whether a reduction of the unit's gradients is in flight."""
        return self._reduction is not None

    def launch_reduction(self) -> bool:
        """Start summing the full gradients over the ranks into this rank's shards; frees the full gradients.

        Returns False (nothing launched) when no parameter of the unit has a gradient on this rank.
        Parameters of the unit that got none while others did count as zero gradients.
        """
        grad_params = [fp for fp in self.params if fp.requires_grad]
        if self._reduction is not None or not any(fp.unsharded.grad is not None for fp in grad_params):
            return False
        dt = self.reduce_dtype
        with no_grad(), _hist.category(_hist.GRADIENT):  # the reduction's input and output
            # Padding rows must sum to zero (the optimizer steps them); the alignment tail is never read.
            missing = any(fp.unsharded.grad is None for fp in grad_params)
            if self.sharded:
                offsets = np.cumsum([0] + [fp.geometry.shard_numel for fp in grad_params]).tolist()
                chunk = C.align(offsets[-1])
                padded = missing or any(fp.geometry.rows % self.world for fp in grad_params)
                flat = (C.flat_zeros if padded else C.flat_empty)(self.world * chunk, dt, self.device)
                for fp, off in zip(grad_params, offsets):
                    g = fp.unsharded.grad
                    if g is not None:
                        C.copy_rows_in(fp.geometry, ops.contiguous(g), flat, chunk, off)
                if self.world == 1:
                    work, out = _done(flat), flat
                else:
                    work, out = C.reduce_scatter(self.comms.shard, flat, self.name)
            else:
                offsets = np.cumsum([0] + [fp.unsharded.numel() for fp in grad_params]).tolist()
                out = (C.flat_zeros if missing else C.flat_empty)(C.align(offsets[-1]), dt, self.device)
                for fp, off in zip(grad_params, offsets):
                    g = fp.unsharded.grad
                    if g is not None:
                        ops.copy_(Tensor(out._storage, g.shape, None, off), g)
                dp = self.comms.dp
                work = C.all_reduce(dp, out, self.name) if dp.world_size > 1 else _done(out)
            # The collective read its input when it was called (stream order): the full gradients go now.
            for fp in grad_params:
                fp.unsharded.grad = None
        self._reduction = _Reduction(work, out, list(zip(grad_params, offsets)))
        self.num_reductions += 1
        return True

    def wait_reduce_scatter(self) -> None:
        """Wait for the reduce-scatter; HYBRID_SHARD then starts summing the shard over the replicas."""
        r = self._reduction
        if r is None or r.second is not None:
            return
        try:
            r.work.wait()
        except BaseException:
            self._reduction = None
            raise
        rep = self.comms.replicate if self.sharded else None
        r.second = C.all_reduce(rep, r.out, self.name) if rep is not None and rep.world_size > 1 else _done(r.out)

    def finish_reduction(self, divide: float) -> None:
        """Wait for the reduction and add its result, divided by ``divide``, to the shards' gradients."""
        self.wait_reduce_scatter()
        r, self._reduction = self._reduction, None
        if r is None:
            return
        r.second.wait()
        out = r.out
        with no_grad():
            if divide != 1:
                ops.inplace("mul", out, 1.0 / divide)
            if self.offload is not None:
                self.offload_traffic["d2h_bytes"] += out.nbytes
                host = out.numpy()
                if host.dtype != np.float32:
                    host = host.astype(np.float32)
                for fp, off in r.layout:
                    fp.registered.set_host_grad(host, off)
                return
            for fp, off in r.layout:
                view = Tensor(out._storage, fp.registered.shape, None, out._offset + off)
                if view.dtype is not fp.registered.dtype:
                    view = ops.cast(view, fp.registered.dtype)
                if fp.registered.grad is None:
                    fp.registered.grad = view
                    view._storage.tag(_hist.GRADIENT)
                else:
                    ops.inplace("add", fp.registered.grad, view)

    def drop_pending(self) -> None:
        """Forget a failed step's collectives (after ``reset()`` they have all completed or failed)."""
        if self._reduction is not None:
            r, self._reduction = self._reduction, None
            for w in (r.work, r.second):
                if w is not None:
                    try:
                        w.wait()
                    except Exception:  # already raised where the step failed
                        pass
        self.reshard()

    # -- full values (checkpoints) ------------------------------------------------------------
    def full_values(self) -> list[np.ndarray]:
        """Every parameter's full value in the shards' dtype, on the host (one gather for the unit).

        A collective: every rank of the unit's shard group calls it.
        """
        if not self.sharded:
            return [fp.registered.numpy() for fp in self.params]
        if not self.params:
            return []
        with no_grad():
            send = (Tensor.from_numpy(self.host_flat, device=self.device) if self.host_flat is not None
                    else self.flat)
            if self.world == 1:
                host = send.numpy()
            else:
                work, out = C.all_gather(self.comms.shard, send, self.name)
                work.wait()
                host = out.numpy()
        values = []
        for fp in self.params:
            g = fp.geometry
            full = np.empty((g.rows, g.row), dtype=host.dtype)
            for r in range(g.world):
                lo, hi = g.real_rows(r)
                start = r * self.chunk + fp.offset
                full[lo:hi] = host[start:start + (hi - lo) * g.row].reshape(hi - lo, g.row)
            values.append(full.reshape(g.shape))
        return values

    def __repr__(self) -> str:
        kind = f"{self.world} shards" if self.sharded else "replicated"
        return f"<FSDPParamGroup {self.name}: {len(self.params)} params, {kind}, {self.state.value}>"


def _host_rows(value: Tensor | np.ndarray, g: ShardGeometry, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of a full parameter, flattened, on the host (only those rows are read back)."""
    if hi <= lo:
        return np.zeros(0, dtype=np.float32)
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).reshape(g.rows, g.row)[lo:hi].ravel()
    rows = ops.contiguous(value).reshape(g.rows, g.row)
    return rows[lo:hi].numpy().ravel()
