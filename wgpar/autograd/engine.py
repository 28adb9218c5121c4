"""Reverse-mode backward: iterative topological order, gradient accumulation, graph release.

Hooks, in the order one backward pass runs them: a node's pre-hooks (before its saved tensors'
version check and its backward function), a leaf's tensor hooks (before its gradient lands in
``.grad``), its post-accumulate-grad hooks (after), and last the callbacks that hooks queued with
``queue_callback`` (after every node and leaf of the pass).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence

from .. import ops
from ..tensor import Tensor
from .grad_mode import is_grad_enabled, no_grad
from .graph import Node, current_tape

_retained: weakref.WeakKeyDictionary[Node, weakref.ref] = weakref.WeakKeyDictionary()


def record(name: str, out: Tensor, inputs: Sequence, backward_fn, saved: Sequence[Tensor] = ()) -> Tensor:
    """Attach a graph node to ``out`` if grad mode is on and any tensor input requires grad."""
    if not is_grad_enabled():
        return out
    tins = [x if isinstance(x, Tensor) and x.requires_grad else None for x in inputs]
    if not any(t is not None for t in tins):
        return out
    node = Node(name, tins, backward_fn, saved)
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


def _accumulate_leaf(t: Tensor, g: Tensor) -> None:
    if g.shape != t.shape:
        raise RuntimeError(f"autograd: gradient of shape {g.shape} for a leaf of shape {t.shape}")
    if g.dtype is not t.dtype:
        g = ops.cast(g, t.dtype)
    hooks = getattr(t, "_tensor_hooks", None)
    if hooks:
        g = _run_hooks(hooks, g, f"a leaf of shape {t.shape}")
    # A fresh, contiguous tensor: the same gradient object may reach several leaves, and
    # optimizers and clip_grad_norm_ update .grad in place.
    t.grad = ops.clone(g) if t.grad is None else ops.binary("add", t.grad, g)
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


def backward(tensors: Sequence[Tensor] | Tensor, grads: Sequence[Tensor | None] | Tensor | None = None,
             retain_graph: bool = False) -> None:
    """Accumulate d(sum of tensors * grads)/d(leaf) into every leaf's ``.grad``."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
        grads = [grads] if not isinstance(grads, (list, tuple)) else grads
    grads = list(grads) if grads is not None else [None] * len(tensors)
    if len(grads) != len(tensors):
        raise ValueError(f"backward: {len(tensors)} tensors but {len(grads)} gradients")
    stack = getattr(_passes, "stack", None)
    if stack is None:
        stack = _passes.stack = []
    callbacks: list[Callable[[], object]] = []
    stack.append(callbacks)
    try:
        with no_grad():
            _run_backward(tensors, grads, retain_graph)
            i = 0
            while i < len(callbacks):  # not a for loop: a callback may queue another
                callbacks[i]()
                i += 1
    finally:
        stack.pop()


def _run_backward(tensors: Sequence[Tensor], grads: list[Tensor | None], retain_graph: bool) -> None:
    pending: dict[int, Tensor] = {}
    roots: list[Node] = []
    for t, g in zip(tensors, grads):
        g = _check_root(t, g)
        if t._node is None:
            _accumulate_leaf(t, g)
            continue
        node = t._node
        pending[node.id] = g if node.id not in pending else ops.binary("add", pending[node.id], g)
        roots.append(node)
    order = _topo(roots)
    # A leaf's gradient is final once every use of it has been processed; only then does it
    # land in .grad and fire its hooks (DataParallel starts a bucket's all-reduce there).
    leaf_uses: dict[int, int] = {}
    for node in order:
        for t in node.inputs:
            if t is not None and t._node is None:
                leaf_uses[id(t)] = leaf_uses.get(id(t), 0) + 1
    leaf_pending: dict[int, Tensor] = {}
    for node in order:
        g = pending.pop(node.id, None)
        if g is None:
            continue
        if node.freed:
            raise RuntimeError(
                f"autograd: backward through {node.name} a second time, but its saved tensors were freed "
                "after the first backward; pass retain_graph=True to the first backward")
        if node.prehooks:
            # Before the version check: a hook may restore what the node saved (FSDP re-gathers here).
            g = _run_hooks(node.prehooks, g, f"the output of {node.name} (shape {g.shape})")
        ref = _retained.get(node)
        if ref is not None and ref() is not None:
            ref().grad = g
        node.check_versions()
        in_grads = node.backward_fn(g)
        if not isinstance(in_grads, (tuple, list)):
            in_grads = (in_grads,)
        for t, ig in zip(node.inputs, in_grads):
            if t is None or ig is None:
                continue
            if t._node is None:
                k = id(t)
                leaf_pending[k] = ig if k not in leaf_pending else ops.binary("add", leaf_pending[k], ig)
                leaf_uses[k] -= 1
                if leaf_uses[k] == 0:
                    _accumulate_leaf(t, leaf_pending.pop(k))
            else:
                k = t._node.id
                pending[k] = ig if k not in pending else ops.binary("add", pending[k], ig)
        if not retain_graph:
            node.release()
    # Leaves on branches that produced no gradient still get what did arrive.
    for node in order:
        for t in node.inputs:
            if t is not None and id(t) in leaf_pending:
                _accumulate_leaf(t, leaf_pending.pop(id(t)))


def backward_with_grad(output: Tensor, grad_output: Tensor, retain_graph: bool = False) -> None:
    """Run backward from ``output`` seeded with an upstream gradient (pipeline stages use this)."""
    backward([output], [grad_output], retain_graph=retain_graph)
