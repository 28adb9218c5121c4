"""Per-module FSDP state: the hooks that drive a unit's lifecycle, and the root's per-step bookkeeping.

Hooks (docs/design.md "Hooks for FSDP" and "FSDP"):

- forward pre-hook: the root's first call initialises the tree (``lazy_init``); every unit gathers
  its parameters (waiting for a prefetched gather), starts the next units' gathers (forward
  order of the previous step, up to ``prefetch`` units ahead), casts inputs for mixed precision,
  and routes inputs that require grad through an identity node whose backward marks "everything
  after this unit's inputs is done".
- forward hook: finds which of the unit's parameters the output's graph used, registers a
  pre-hook on the output's graph nodes (gather again before backward reaches them), and frees
  the gathered parameters (FULL_SHARD; not the root, whose parameters backward needs first).
- output node pre-hook (backward): gathers the unit again and prefetches the next units in
  backward order (the reverse of the order in which units finished forward).
- post-accumulate-grad hook on each full parameter, and the input identity node: once every used
  parameter has its gradient and every input has been reached, the unit's post-backward starts the
  reduce-scatter of its gradients (overlapping the rest of backward) and frees the parameters.
- ``autograd.queue_callback`` (queued by the first backward hook): after the pass, reduces what
  did not start yet, waits for every reduction, divides, hands the shards their gradients and
  reshards everything.

Collectives are issued in an order that depends only on the model's control flow, the same on
every rank; a rank that diverges (skips a unit, runs one twice) makes the labelled collectives
disagree and every rank raises a CollectiveError naming the units.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from ... import dtypes as _dt
from ...autograd.engine import queue_callback
from ...autograd.function import Function
from ...autograd.grad_mode import is_grad_enabled
from ...autograd.graph import Node
from ...nn.module import Module
from ...tensor import Tensor
from .param import ShardedState, fsdp_param_of
from .param_group import FSDPParamGroup
from .policies import MixedPrecisionPolicy


def state_of(module: Module) -> FSDPState | None:
    return module.__dict__.get("_fsdp_state")


class _InputsReached(Function):
    """Identity on a unit's input; its backward runs once every node after the input is done."""

    @staticmethod
    def forward(ctx, x, on_backward):
        ctx.on_backward = on_backward
        return x.detach()

    @staticmethod
    def backward(ctx, g):
        ctx.on_backward()
        return g, None


def _map_tensors(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _tensors(obj: Any) -> list[Tensor]:
    found: list[Tensor] = []
    _map_tensors(obj, lambda t: found.append(t) or t)
    return found


def _cast(dtype: _dt.DType) -> Callable[[Tensor], Tensor]:
    def cast(t: Tensor) -> Tensor:
        return t.to(dtype=dtype) if t.dtype.is_float and t.dtype is not dtype else t
    return cast


def _used_leaves(outputs: list[Tensor], after: int, wanted: set[int]) -> set[int]:
    """ids of the ``wanted`` leaves that the graph of ``outputs`` reaches through nodes newer than ``after``."""
    found: set[int] = set()
    stack = [t._node for t in outputs if t._node is not None and t._node.id > after]
    seen = {n.id for n in stack}
    while stack:
        node = stack.pop()
        for t in node.inputs:
            if t is None:
                continue
            child = t._node
            if child is None:
                if id(t) in wanted:
                    found.add(id(t))
            elif child.id > after and child.id not in seen:
                seen.add(child.id)
                stack.append(child)
    return found


class FSDPState:
    """The FSDP state of one module (one unit); the root's also drives each step.

    Arguments:
        module: the module ``fully_shard`` was applied to.
        group: its parameters (None: the unit manages none, e.g. all were claimed by inner units).
        dp_world: the number of data-parallel ranks (gradients are averaged over them by default).
        mp: mixed precision policy (input and output casts).
        prefetch: how many units' gathers may run ahead of the unit computing (root's value counts).
    """

    def __init__(self, module: Module, group: FSDPParamGroup | None, dp_world: int,
                 mp: MixedPrecisionPolicy | None, prefetch: int) -> None:
        self._module = weakref.ref(module)  # the module holds this state (and its hooks hold it too)
        self.group: FSDPParamGroup | None = None
        self.dp_world = dp_world
        self.mp = mp
        self.prefetch = prefetch
        self.divide: float | None = None  # gradient divide factor; None: dp_world (the mean)
        self.name = type(module).__name__
        self._root_ref: weakref.ref | None = None
        self._mark = 0  # id of the newest graph node before this unit's forward began
        # Root only.
        self._states: list[weakref.ref] = []  # every state below the root, itself included
        self._pre_order: list[FSDPParamGroup] = []
        self._prev_pre_order: list[FSDPParamGroup] = []
        self._post_order: list[FSDPParamGroup] = []
        self._prefetched: list[FSDPParamGroup] = []
        self._reductions: list[FSDPParamGroup] = []
        self._callback_queued = False
        self._fresh = True
        self._outputs: list[weakref.ref] = []  # graph nodes of this step's outputs (while backward may come)
        self._discard = False  # the step failed on some rank: forget it at the next forward
        # What the steps did (tests and benchmarks read these): gathers started ahead of their unit,
        # reductions started during backward (overlapping it) and after it.
        self.counters = {"prefetched": 0, "reduced_in_backward": 0, "reduced_after_backward": 0}
        self._hooks = [module.register_forward_pre_hook(self._pre_forward, prepend=True, with_kwargs=True),
                       module.register_forward_hook(self._post_forward)]
        self.attach(group)

    @property
    def module(self) -> Module:
        return self._module()

    @property
    def _root(self) -> FSDPState | None:
        return self._root_ref() if self._root_ref is not None else None

    @property
    def states(self) -> list[FSDPState]:
        return [st for ref in self._states if (st := ref()) is not None]

    # -- wiring -----------------------------------------------------------------------------
    def attach(self, group: FSDPParamGroup | None) -> None:
        """Make ``group`` this unit's parameters (also after it was rebuilt) and hook its gradients."""
        self.group = group
        if group is None:
            return
        group.owner = self
        for fp in group.params:
            fp.unsharded.register_post_accumulate_grad_hook(self._grad_hook(group))
            fp.to_sharded()

    def _grad_hook(self, group: FSDPParamGroup) -> Callable[[Tensor], None]:
        # Weak: the hook lives on the full parameter, which the unit holds.
        me, unit = weakref.ref(self), weakref.ref(group)

        def hook(param: Tensor) -> None:
            st, grp = me(), unit()
            root = st._root if st is not None else None
            if root is not None and grp is not None and grp.ran_forward:
                root._on_grad(grp, param)
        return hook

    @property
    def is_root(self) -> bool:
        return self._root is self

    @property
    def root(self) -> FSDPState | None:
        return self._root

    def lazy_init(self) -> FSDPState:
        """Make this state the root of every FSDP state below it (the first forward does this)."""
        if self._root is not None:
            return self._root
        from .sharing import check_sharing  # the module-tree walk shared with fully_shard

        self._states = []
        paths = {}
        for name, m in self.module.named_modules():
            paths[id(m)] = name
            st = state_of(m)
            if st is None:
                continue
            st._root_ref = weakref.ref(self)
            st.name = name or "root"
            if st.group is not None:
                st.group.name = st.name
            self._states.append(weakref.ref(st))
        for grp in self.groups():
            for fp in grp.params:  # full names, as in the root's named_parameters()
                module, attr = fp.module_infos[0]
                fp.name = f"{paths[id(module)]}.{attr}" if paths.get(id(module)) else attr
        check_sharing(self.module)
        return self

    def groups(self) -> list[FSDPParamGroup]:
        return [st.group for st in self.states if st.group is not None]

    # -- forward ----------------------------------------------------------------------------
    def _pre_forward(self, module: Module, args: tuple, kwargs: dict):
        root = self.lazy_init()
        if root is self:
            self._root_pre_forward()
        grp = self.group
        grad = is_grad_enabled()
        if grp is not None:
            root._consume(grp)
            try:
                grp.unshard(async_op=True)
                root._prefetch_forward(grp)  # the next units' transfers run while this one computes
                grp.wait_for_unshard()
            except BaseException:
                root._abandon()
                raise
            if grad:
                grp.ran_forward = True
                root._record_pre(grp)
        if self.mp is not None and self.mp.cast_forward_inputs and self.mp.param_dtype is not None:
            cast = _cast(self.mp.param_dtype)
            args, kwargs = _map_tensors(args, cast), _map_tensors(kwargs, cast)
        if grad and grp is not None:
            def mark(t: Tensor) -> Tensor:
                if not t.requires_grad:
                    return t
                grp.marks += 1
                return _InputsReached.apply(t, lambda: root._on_inputs_reached(grp))
            args, kwargs = _map_tensors(args, mark), _map_tensors(kwargs, mark)
        self._mark = Node("fsdp:forward", (), None, ()).id
        return args, kwargs

    def _post_forward(self, module: Module, args: tuple, output: Any) -> Any:
        root = self._root
        grp = self.group
        grad = is_grad_enabled()
        if grp is not None:
            if grad:
                outs = _tensors(output)
                wanted = {id(fp.unsharded) for fp in grp.params if fp.requires_grad}
                grp.expected |= _used_leaves(outs, self._mark, wanted)
                hook = self._pre_backward_hook(grp)
                for t in outs:
                    if t.requires_grad and t._node is not None:
                        t._node.register_prehook(hook)
                root._record_post(grp)
            if not grad or (grp.reshard_after_forward and self is not root):
                grp.reshard()
        if self is root:
            if grad:
                self._outputs += [weakref.ref(t._node) for t in _tensors(output) if t._node is not None]
            self._root_post_forward(grad)
            if self.mp is not None and self.mp.output_dtype is not None:
                output = _map_tensors(output, _cast(self.mp.output_dtype))
        return output

    def _pre_backward_hook(self, grp: FSDPParamGroup) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            self._root._pre_backward(grp)
        return hook

    # -- the root's step ----------------------------------------------------------------------
    def _root_pre_forward(self) -> None:
        self._check_parameters()
        groups = self.groups()
        # A step failed part-way (its backward raised, or a rank did; the wrapper says so), or no backward
        # can come any more for the last forward (its outputs' graphs are gone, e.g. with the exception
        # that ended it): forget it, so every rank starts this step alike.
        orphaned = not self._fresh and not any(ref() is not None for ref in self._outputs)
        if self._discard or orphaned or self._callback_queued or any(g.gathering or g.reducing for g in groups):
            self._abandon()
        for g in groups:
            if g is not self.group:
                g.set_guarded(True)
        if not self._fresh:
            return  # several forwards before one backward: keep what the earlier ones recorded
        self._fresh = False
        self._pre_order, self._post_order = [], []
        self._prefetched.clear()
        for g in groups:
            g.ran_forward = False
            g.expected.clear()
            g.arrived.clear()
            g.marks = 0
            g.post_backward_done = False

    def _check_parameters(self) -> None:
        """Refuse a parameter FSDP does not manage (added or replaced after fully_shard): nothing would gather
        or reduce it, and the ranks' copies would drift apart."""
        for name, m in self.module.named_modules():
            for attr, p in m._parameters.items():
                if p is not None and fsdp_param_of(p) is None:
                    raise RuntimeError(
                        f"FSDP: parameter '{f'{name}.{attr}' if name else attr}' {tuple(p.shape)} was set after "
                        "fully_shard, so no unit gathers or reduces it and the ranks would drift apart; set every "
                        "parameter before sharding (or shard a new model)")

    def forward_failed(self) -> None:
        """The root's forward raised: the modules get their shards back (the next forward forgets the step)."""
        for g in self.groups():
            g.set_guarded(False)

    def discard_step(self) -> None:
        """Forget the current step at the next forward (a rank failed in it; every rank is told)."""
        self._discard = True

    def _root_post_forward(self, grad: bool) -> None:
        for g in self.groups():
            g.set_guarded(False)
        # Gathers prefetched for units this forward did not run would hold memory until backward ends.
        for g in self._prefetched:
            if not g.ran_forward:
                g.reshard()
        self._prefetched = [g for g in self._prefetched if g.ran_forward]
        if not grad:
            self._fresh = True  # no backward follows a forward without grad
            self._prev_pre_order = self._pre_order

    def _record_pre(self, grp: FSDPParamGroup) -> None:
        if grp not in self._pre_order:
            self._pre_order.append(grp)

    def _record_post(self, grp: FSDPParamGroup) -> None:
        # Backward meets units in the reverse of the order they last finished forward.
        if grp in self._post_order:
            self._post_order.remove(grp)
        self._post_order.append(grp)

    def _consume(self, grp: FSDPParamGroup) -> None:
        if grp in self._prefetched:
            self._prefetched.remove(grp)

    def _prefetch(self, order: list[FSDPParamGroup], current: FSDPParamGroup,
                  eligible: Callable[[FSDPParamGroup], bool]) -> None:
        if self.prefetch <= 0 or current not in order:
            return
        for g in order[order.index(current) + 1:]:
            if len(self._prefetched) >= self.prefetch:
                return
            if g.params and g.state is ShardedState.SHARDED and not g.gathering and eligible(g):
                g.unshard(async_op=True)
                self._prefetched.append(g)
                self.counters["prefetched"] += 1

    def _prefetch_forward(self, grp: FSDPParamGroup) -> None:
        self._prefetch(self._prev_pre_order, grp, lambda g: True)

    def _prefetch_backward(self, grp: FSDPParamGroup) -> None:
        self._prefetch(self._post_order[::-1], grp, lambda g: g.ran_forward and not g.post_backward_done)

    # -- backward ------------------------------------------------------------------------------
    def _ensure_callback(self) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            queue_callback(self._final_callback)

    def _pre_backward(self, grp: FSDPParamGroup) -> None:
        self._ensure_callback()
        if grp.post_backward_done:
            return
        self._consume(grp)
        try:
            grp.unshard(async_op=True)
            self._prefetch_backward(grp)
            grp.wait_for_unshard()
        except BaseException:
            self._abandon()
            raise

    def _on_grad(self, grp: FSDPParamGroup, param: Tensor) -> None:
        self._ensure_callback()
        grp.arrived.add(id(param))
        self._maybe_post_backward(grp)

    def _on_inputs_reached(self, grp: FSDPParamGroup) -> None:
        self._ensure_callback()
        grp.marks -= 1
        self._maybe_post_backward(grp)

    def _maybe_post_backward(self, grp: FSDPParamGroup) -> None:
        if grp.post_backward_done or not grp.ran_forward or grp.marks > 0 or not grp.expected <= grp.arrived:
            return
        try:
            self._post_backward(grp)
        except BaseException:
            self._abandon()
            raise

    def _post_backward(self, grp: FSDPParamGroup) -> None:
        grp.post_backward_done = True
        if grp.sync and grp.launch_reduction():
            self._reductions.append(grp)
            self.counters["reduced_in_backward"] += 1
        grp.reshard()
        self._consume(grp)

    def _final_callback(self) -> None:
        self._callback_queued = False
        try:
            for grp in self._post_order[::-1]:
                if grp.ran_forward and not grp.post_backward_done:
                    grp.post_backward_done = True
                    if grp.sync and grp.launch_reduction():
                        self._reductions.append(grp)
                        self.counters["reduced_after_backward"] += 1
            for grp in self._reductions:
                grp.wait_reduce_scatter()  # HYBRID_SHARD starts the replicas' all-reduce here
            divide = self.divide if self.divide is not None else float(self.dp_world)
            for grp in self._reductions:
                grp.finish_reduction(divide)
            self._reductions.clear()
            for grp in self.groups():
                grp.reshard()
            self._prefetched.clear()
        except BaseException:
            self._abandon()
            raise
        self._fresh = True
        self._outputs = []
        # The next forward prefetches in this order. Only a step every rank completed counts (its reductions
        # met every rank): a failed step's partial order differs between ranks, and so would their gathers.
        self._prev_pre_order = self._pre_order

    def _abandon(self) -> None:
        """Forget a failed step: wait out (or drop) its collectives, reshard, clear full gradients."""
        self._callback_queued = False
        self._discard = False
        self._outputs = []
        self._reductions.clear()
        self._prefetched.clear()
        self._pre_order, self._post_order = [], []
        for grp in self.groups():
            grp.set_guarded(False)
            grp.drop_pending()
            for fp in grp.params:
                fp.unsharded.grad = None  # partial: the failed backward's
        self._fresh = True

    def __repr__(self) -> str:
        return f"<FSDPState {self.name} root={self.is_root} group={self.group!r}>"
