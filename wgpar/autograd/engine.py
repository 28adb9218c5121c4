"""Reverse-mode backward: iterative topological order, gradient accumulation, graph release.

Hooks, in the order one backward pass runs them: a node's pre-hooks (before its saved tensors'
version check and its backward function), a leaf's tensor hooks (before its gradient lands in
``.grad``), its post-accumulate-grad hooks (after), and last the callbacks that hooks queued with
``queue_callback`` (after every node and leaf of the pass).

``backward_input`` splits one backward in two (zero-bubble pipelines): the gradients of chosen
inputs now, every other leaf's (the weights') later, from a ``DeferredGrad``. Nodes recorded with
``partial=True`` take a mask of the inputs to differentiate, so the later half does not redo the
first half's work (matmul); other nodes compute every input's gradient and the engine keeps the
ones asked for.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Sequence

from .. import ops
from ..runtime import memory_history as _hist
from ..runtime import profiling
from ..tensor import Tensor
from .grad_mode import is_grad_enabled, no_grad
from .graph import Node, current_tape

_retained: weakref.WeakKeyDictionary[Node, weakref.ref] = weakref.WeakKeyDictionary()


class Parts:
    """Gradients of some pieces of one split (split, chunk, unbind), standing for the split tensor's gradient.

    A piece's backward returns one; the engine merges those of one split as they arrive and joins them
    once, when the gradient is used: one buffer, each piece's gradient copied into its place, zeros only
    where none came (torch's split backward is one cat). As full-size tensors, each piece's gradient
    would cost a zero tensor of the whole's size and an add.

    Arguments:
        split: the pieces' geometry: ``n`` pieces, ``join(grads)`` the whole's gradient from one per piece.
        index: which piece ``grad`` belongs to.
        grad: that piece's gradient.
    """

    __slots__ = ("split", "grads")

    def __init__(self, split, index: int, grad: Tensor) -> None:
        self.split = split
        self.grads: list[Tensor | None] = [None] * split.n
        self.grads[index] = grad

    def merge(self, other: Parts) -> Parts:
        """Take ``other``'s pieces (of the same split) into these; returns self. A piece's node runs once
        per pass, so no piece comes twice."""
        for i, g in enumerate(other.grads):
            if g is not None:
                self.grads[i] = g
        return self


def _sum(old: Tensor | Parts | None, new: Tensor | Parts) -> Tensor | Parts:
    """Two gradients of one tensor (``old`` None: the first): added, or merged when both are parts of one split."""
    if old is None:
        return new
    if isinstance(old, Parts) and isinstance(new, Parts) and old.split is new.split:
        return old.merge(new)
    return ops.binary("add", _joined(old), _joined(new))


def _joined(g: Tensor | Parts) -> Tensor:
    return g.split.join(g.grads) if isinstance(g, Parts) else g


def record(name: str, out: Tensor, inputs: Sequence, backward_fn, saved: Sequence[Tensor] = (),
           partial: bool = False) -> Tensor:
    """Attach a graph node to ``out`` if grad mode is on and any tensor input requires grad.

    ``partial``: ``backward_fn(g, mask)`` computes only the gradients of the inputs whose ``mask``
    entry is True (None for the others); otherwise ``backward_fn(g)`` computes them all.
    """
    if not is_grad_enabled():
        return out
    tins = [x if isinstance(x, Tensor) and x.requires_grad else None for x in inputs]
    for t in tins:
        if t is not None:
            return attach(name, out, tins, backward_fn, saved, partial)
    return out


def attach(name: str, out: Tensor, tins: list, backward_fn, saved: Sequence[Tensor] = (),
           partial: bool = False) -> Tensor:
    """``record`` for a caller that has checked grad mode and made ``tins`` (per input the tensor if it
    requires grad, else None; one at least a tensor): the node, on ``out`` and the thread's tape."""
    node = Node(name, tins, backward_fn, saved, partial)
    out._node = node
    out.requires_grad = True
    tape = current_tape()
    if tape is not None:
        tape.record(node)
    return out


def retain_grad(t: Tensor) -> None:
    if t._node is not None:
        _retained[t._node] = weakref.ref(t)


def _topo(roots: Sequence[Node]) -> list[Node]:
    """Nodes reachable from roots, outputs before inputs (iterative: deep graphs are fine)."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in roots:
        if root.id in seen:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        seen.add(root.id)
        while stack:
            node, i = stack[-1]
            if i < len(node.inputs):
                stack[-1] = (node, i + 1)
                t = node.inputs[i]
                child = t._node if t is not None else None
                if child is not None and child.id not in seen:
                    seen.add(child.id)
                    stack.append((child, 0))
            else:
                stack.pop()
                order.append(node)
    order.reverse()
    return order


def _run_hooks(hooks, g: Tensor, what: str) -> Tensor:
    # A snapshot: a hook may remove itself or another one (effective from the next backward).
    for hook in tuple(hooks.values()):
        new = hook(g)
        if new is None:
            continue
        if not isinstance(new, Tensor):
            raise TypeError(f"autograd: hook {_name(hook)} on {what} returned {type(new).__name__}, "
                            "expected None or a wgpar.Tensor")
        if new.shape != g.shape or new.dtype is not g.dtype or new.device is not g.device:
            raise RuntimeError(
                f"autograd: hook {_name(hook)} on {what} returned a gradient of shape {new.shape}, "
                f"{new.dtype.name}, on {new.device}; expected shape {g.shape}, {g.dtype.name}, on {g.device}")
        g = new
    return g


def _name(hook) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)


def _refs(g) -> tuple[int, int]:
    """References to ``g`` and to its storage, as seen from a caller holding ``g`` in one local."""
    return sys.getrefcount(g), sys.getrefcount(g._storage)


class _Probe:
    __slots__ = ("_storage",)


def _sole_refs() -> tuple[int, int]:
    """``_refs`` of an object that one local alone holds, whose attribute alone holds another (a gradient
    nothing else can see): measured, since Python versions count references from the stack differently."""
    probe = _Probe()
    probe._storage = _Probe()
    return _refs(probe)


_SOLE = _sole_refs()


def _accumulate_leaf(t: Tensor, g: Tensor) -> None:
    """Land ``g`` in ``t.grad``: a gradient nothing else holds (the walk passes it as a temporary and keeps
    no reference) becomes ``.grad`` itself, without a copy, as torch's AccumulateGrad steals it."""
    if g.shape != t.shape:
        raise RuntimeError(f"autograd: gradient of shape {g.shape} for a leaf of shape {t.shape}")
    if g.dtype is not t.dtype:
        g = ops.cast(g, t.dtype)
    hooks = getattr(t, "_tensor_hooks", None)
    if hooks:
        g = _run_hooks(hooks, g, f"a leaf of shape {t.shape}")
    if t.grad is not None:
        t.grad = ops.binary("add", t.grad, g)
    else:
        # Optimizers and clip_grad_norm_ update .grad in place, so a gradient anything else can see is
        # copied: one reaching several leaves or kept by a hook (more references), a view (its storage
        # shared, or not covered exactly and contiguously).
        sole = _refs(g) == _SOLE and g._offset == 0 and g.numel() == g._storage.numel and g.is_contiguous()
        t.grad = g if sole else ops.clone(g)
    t.grad._storage.tag(_hist.GRADIENT)
    for hook in getattr(t, "_grad_hooks", ()):
        hook(t)


# Per thread, one list of queued callbacks per running backward pass (a hook may run a nested backward).
_passes = threading.local()


def queue_callback(fn: Callable[[], object]) -> None:
    """Run ``fn()`` once the backward pass running on this thread has finished.

    For hooks (FSDP queues its end-of-backward work from one): the callback runs on the same thread,
    under no_grad, after the pass's last node and leaf (post-accumulate-grad hooks included), in the
    order queued; a callback may queue more. If the pass raises, its callbacks do not run (as in
    PyTorch's ``Variable._execution_engine.queue_callback``).

    Arguments:
        fn: a callable taking no arguments.

    Raises RuntimeError outside a backward pass.
    """
    stack = getattr(_passes, "stack", None)
    if not stack:
        raise RuntimeError("queue_callback: no backward pass is running on this thread; call it from a hook "
                           "that runs during backward")
    stack[-1].append(fn)


def _check_root(t: Tensor, g: Tensor | None) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"backward: expected a wgpar.Tensor, got {type(t).__name__}")
    if not t.requires_grad:
        raise RuntimeError(f"backward: the tensor of shape {t.shape} does not require grad and has no graph")
    if g is None:
        if t.numel() != 1:
            raise RuntimeError(
                f"backward: grad can be created implicitly only for a scalar output, got shape {t.shape}; "
                "pass grad= (or use backward_with_grad)")
        return ops.fill(t.shape, 1.0, t.dtype, t.device)
    if not isinstance(g, Tensor):
        raise TypeError(f"backward: the gradient must be a wgpar.Tensor, got {type(g).__name__}")
    if g.shape != t.shape:
        raise ValueError(f"backward: gradient of shape {g.shape} does not match the output's shape {t.shape}")
    if g.device is not t.device:
        raise ValueError(f"backward: gradient on {g.device} but the output is on {t.device}")
    return g


def _as_lists(tensors, grads) -> tuple[list[Tensor], list[Tensor | None]]:
    if isinstance(tensors, Tensor):
        tensors = [tensors]
        grads = [grads] if not isinstance(grads, (list, tuple)) else grads
    tensors = list(tensors)
    grads = list(grads) if grads is not None else [None] * len(tensors)
    if len(grads) != len(tensors):
        raise ValueError(f"backward: {len(tensors)} tensors but {len(grads)} gradients")
    return tensors, grads


def _in_pass(fn: Callable[[], object]) -> object:
    """Run ``fn`` as one backward pass: under no_grad, then the callbacks its hooks queued."""
    stack = getattr(_passes, "stack", None)
    if stack is None:
        stack = _passes.stack = []
    callbacks: list[Callable[[], object]] = []
    stack.append(callbacks)
    try:
        with no_grad(), profiling.span("backward", "phase", phase="backward"):
            result = fn()
            i = 0
            while i < len(callbacks):  # not a for loop: a callback may queue another
                callbacks[i]()
                i += 1
        return result
    finally:
        stack.pop()


def backward(tensors: Sequence[Tensor] | Tensor, grads: Sequence[Tensor | None] | Tensor | None = None,
             retain_graph: bool = False) -> None:
    """Accumulate d(sum of tensors * grads)/d(leaf) into every leaf's ``.grad``. Differs from torch: the seeds
    are ``grads`` (torch: ``grad_tensors``); no ``create_graph=`` or ``inputs=``."""
    tensors, grads = _as_lists(tensors, grads)
    _in_pass(lambda: backward_within_pass(tensors, grads, retain_graph))


def backward_within_pass(tensors: Sequence[Tensor], grads: list[Tensor | None], retain_graph: bool = False) -> None:
    """Backpropagate from ``tensors`` inside the pass already running (activation checkpointing's
    recomputation): callbacks queued by hooks run once, at the end of that pass, not of this walk."""
    pending, roots = _seed(tensors, grads)
    _walk(_topo(roots), pending, retain_graph)


def _seed(tensors: Sequence[Tensor], grads: list[Tensor | None]) -> tuple[dict[int, Tensor], list[Node]]:
    """The roots' gradients by node id (a root that is a leaf gets its gradient at once)."""
    pending: dict[int, Tensor] = {}
    roots: list[Node] = []
    for t, g in zip(tensors, grads):
        g = _check_root(t, g)
        if t._node is None:
            _accumulate_leaf(t, g)
            continue
        node = t._node
        pending[node.id] = _sum(pending.get(node.id), g)
        roots.append(node)
    return pending, roots


def _walk(order: list[Node], pending: dict[int, Tensor], retain_graph: bool,
          masks: dict[int, tuple[bool, ...]] | None = None, later: list | None = None,
          resumed: frozenset[int] = frozenset()) -> None:
    """Run every node of ``order`` that has a pending gradient, outputs first.

    ``masks`` (node id -> one bool per input) limits which inputs' gradients a node computes. With a
    ``later`` list (the first half of a split backward), a node that leaves out inputs needing a
    gradient goes there as (node, gradient, the other inputs' mask, whether it ran) and keeps its
    saved tensors. ``resumed`` nodes already ran their pre-hooks in an earlier pass.
    """
    masks = masks or {}
    # A leaf's gradient is final once every use of it has been processed; only then does it
    # land in .grad and fire its hooks (DataParallel starts a bucket's all-reduce there).
    leaf_uses: dict[int, int] = {}
    for node in order:
        mask = masks.get(node.id)
        for i, t in enumerate(node.inputs):
            if t is not None and t._node is None and (mask is None or mask[i]):
                leaf_uses[id(t)] = leaf_uses.get(id(t), 0) + 1
    leaf_pending: dict[int, Tensor | Parts] = {}
    for node in order:
        g = pending.pop(node.id, None)
        if g is None:
            continue
        g = _joined(g)
        mask = masks.get(node.id)
        if later is not None and not any(mask):  # nothing to do now: all of it waits
            later.append((node, g, tuple(t is not None for t in node.inputs), False))
            continue
        if node.freed:
            raise RuntimeError(
                f"autograd: backward through {node.name} a second time, but its saved tensors were freed "
                "after the first backward; pass retain_graph=True to the first backward")
        if node.prehooks and node.id not in resumed:
            # Before the version check: a hook may restore what the node saved (FSDP re-gathers here).
            g = _run_hooks(node.prehooks, g, f"the output of {node.name} (shape {g.shape})")
        ref = _retained.get(node)
        if ref is not None and ref() is not None and node.id not in resumed:
            ref().grad = g
        node.check_versions()
        in_grads = _call(node, g, mask)
        ready = []
        for t, ig in zip(node.inputs, in_grads):
            if t is None or ig is None:
                continue
            if not isinstance(ig, Parts) and ig.dtype is not t.dtype and t.dtype.is_float:
                # As in PyTorch, a gradient has its input's dtype: a float16 branch added into a float32
                # one (autocast) gets float16 gradients, so its matmuls stay on the float16 kernels.
                ig = ops.cast(ig, t.dtype)
            if t._node is None:
                k = id(t)
                leaf_pending[k] = _sum(leaf_pending.get(k), ig)
                leaf_uses[k] -= 1
                if leaf_uses[k] == 0:
                    ready.append(t)
            else:
                k = t._node.id
                pending[k] = _sum(pending.get(k), ig)
        rest = None if later is None else tuple(t is not None and not m for t, m in zip(node.inputs, mask))
        if rest is not None and any(rest):
            later.append((node, g, rest, True))
        elif not retain_graph:
            node.release()
        # The walk's own references go first: a leaf's gradient that nothing else holds becomes its .grad.
        g = in_grads = ig = None
        for t in ready:
            _accumulate_leaf(t, _joined(leaf_pending.pop(id(t))))
    # Leaves on branches that produced no gradient still get what did arrive.
    for node in order:
        for t in node.inputs:
            if t is not None and id(t) in leaf_pending:
                _accumulate_leaf(t, _joined(leaf_pending.pop(id(t))))


def _call(node: Node, g: Tensor, mask: tuple[bool, ...] | None) -> tuple:
    if mask is None:
        grads = node.backward_fn(g)
    elif node.partial:
        grads = node.backward_fn(g, mask)
    else:  # computes every input's gradient: keep the ones asked for
        grads = node.backward_fn(g)
    if not isinstance(grads, (tuple, list)):
        grads = (grads,)
    if mask is not None:
        grads = tuple(ig if m else None for ig, m in zip(grads, mask))
    return grads


class DeferredGrad:
    """The weight-gradient half of a ``backward_input``: ``run()`` accumulates every remaining leaf's
    gradient into its ``.grad`` (once); ``release()`` drops the work and frees what it kept."""

    def __init__(self, later: list) -> None:
        self._later = later

    @property
    def pending(self) -> int:
        """How many graph nodes still hold work."""
        return len(self._later)

    def run(self) -> None:
        """Accumulate the deferred weight gradients into the leaves' ``.grad`` (a backward pass over the
        remaining nodes); a second call does nothing."""
        later, self._later = self._later, []
        if not later:
            return

        def go():
            order = _topo([n for n, *_ in later])
            pending = {n.id: g for n, g, _, _ in later}
            masks = {n.id: rest for n, _, rest, _ in later}
            _walk(order, pending, False, masks=masks, resumed=frozenset(n.id for n, _, _, ran in later if ran))

        _in_pass(go)

    def release(self) -> None:
        """Drop the deferred work without running it, freeing the tensors its nodes saved."""
        for n, *_ in self._later:
            n.release()
        self._later = []


def backward_input(tensors: Sequence[Tensor] | Tensor, grads: Sequence[Tensor | None] | Tensor | None,
                   inputs: Sequence[Tensor]) -> DeferredGrad:
    """The first half of a split backward: the gradients of ``inputs`` now, the rest deferred.

    Accumulates d(sum of tensors * grads)/d(input) into each input's ``.grad`` and returns a
    ``DeferredGrad`` whose ``run()`` later accumulates every other leaf's gradient (the weights'),
    so that the two together equal one ``backward`` (zero-bubble pipelines run the second half in
    what would be idle time). Nodes that lead only to weights do not run now; nodes recorded with
    ``partial=True`` (matmul) compute each gradient in exactly one of the halves. Pre-hooks run once,
    when a node is first reached.

    Arguments:
        tensors: the outputs (one tensor or a sequence).
        grads: their gradients (None for a scalar output).
        inputs: leaves that require grad, whose gradients are wanted now.
    """
    tensors, grads = _as_lists(tensors, grads)
    wanted: set[int] = set()
    for t in inputs:
        if not isinstance(t, Tensor) or t._node is not None or not t.requires_grad:
            raise ValueError("backward_input: inputs must be leaf tensors that require grad, got "
                             + (f"a tensor of shape {t.shape}" if isinstance(t, Tensor) else type(t).__name__))
        wanted.add(id(t))
    later: list = []

    def run():
        pending, roots = _seed(tensors, grads)
        order = _topo(roots)
        reaches: dict[int, bool] = {}  # whether a node leads to a wanted input
        for node in reversed(order):  # inputs before outputs
            reaches[node.id] = any(_leads(t, wanted, reaches) for t in node.inputs)
        masks = {node.id: tuple(reaches[node.id] and _leads(t, wanted, reaches) for t in node.inputs)
                 for node in order}
        _walk(order, pending, False, masks=masks, later=later)

    _in_pass(run)
    return DeferredGrad(later)


def _leads(t: Tensor | None, wanted: set[int], reaches: dict[int, bool]) -> bool:
    if t is None:
        return False
    return id(t) in wanted if t._node is None else reaches[t._node.id]


def backward_with_grad(output: Tensor, grad_output: Tensor, retain_graph: bool = False) -> None:
    """Run backward from ``output`` seeded with an upstream gradient (pipeline stages use this)."""
    backward([output], [grad_output], retain_graph=retain_graph)
