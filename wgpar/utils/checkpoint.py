"""Activation checkpointing: trade compute for memory, as ``torch.utils.checkpoint``.

``checkpoint(fn, *args)`` runs ``fn`` and keeps only its inputs and outputs for backward; the
activations ``fn`` saved are freed as soon as it returns. When backward reaches the outputs, ``fn``
runs again on the same inputs, with the random state (dropout masks) and autocast state of the first
run, and backward continues through that recomputed graph. The recomputation runs the same kernels in
the same order as the first run, and its backward walks its nodes in the order the whole graph would
have, so gradients equal an uncheckpointed run's bit for bit.

How (one graph node stands for the region):

- forward: ``fn`` runs with grad enabled on a private tape, so the region's graph tells which leaves
  (parameters) it used; the tape's nodes are released at once (their saved tensors freed) and the
  outputs are detached and given one node whose inputs are the tensor arguments and those leaves.
- backward: that node recomputes ``fn`` on detached copies of the arguments and runs the recomputed
  graph's backward inside the running backward pass (its hooks' ``queue_callback`` work still runs at
  the end of the whole pass): parameter gradients land in ``.grad`` there, the arguments' gradients are
  returned. Several outputs each get a node that hands its gradient to one shared node behind them, so
  the recomputed graph's backward runs once, with every output's gradient.

Parameters therefore receive their gradient during the recomputation's backward (as torch's reentrant
variant does): one used both inside and outside a checkpointed region gets two contributions, added
in a different order than without checkpointing (equal to rounding). An FSDP unit called inside
``fn`` is gathered again for the recomputation by its own forward hooks (and for the recomputed
graph's backward by its backward hook), so it trains as on one device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import creation
from ..autograd import engine
from ..autograd.autocast_mode import autocast, get_autocast_dtype, is_autocast_enabled
from ..autograd.engine import record
from ..autograd.grad_mode import enable_grad, is_grad_enabled
from ..autograd.graph import current_tape, install_tape, take_tape
from ..ops import fill
from ..tensor import Tensor


def _flatten(obj: Any, found: list[Tensor]) -> Any:
    """``obj`` with each tensor (in tuples, lists and dict values) replaced by its index in ``found``."""
    if isinstance(obj, Tensor):
        found.append(obj)
        return _Slot(len(found) - 1)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_flatten(o, found) for o in obj)
    if isinstance(obj, dict):
        return {k: _flatten(v, found) for k, v in obj.items()}
    return obj


def _fill(obj: Any, tensors: Sequence[Tensor]) -> Any:
    if isinstance(obj, _Slot):
        return tensors[obj.i]
    if isinstance(obj, (tuple, list)):
        return type(obj)(_fill(o, tensors) for o in obj)
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    return obj


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def _used_leaves(outputs: list[Tensor], inputs: list[Tensor]) -> list[Tensor]:
    """Leaves requiring grad that the outputs' graph reaches, not counting the region's own inputs."""
    skip = {id(t) for t in inputs}
    found: dict[int, Tensor] = {}
    stack = [t._node for t in outputs if t._node is not None]
    seen = {n.id for n in stack}
    while stack:
        node = stack.pop()
        for t in node.inputs:
            if t is None or id(t) in skip:
                continue
            if t._node is None:
                found.setdefault(id(t), t)
            elif t._node.id not in seen:
                seen.add(t._node.id)
                stack.append(t._node)
    return list(found.values())


class _Region:
    """One checkpointed call: what its recomputation needs, and the output gradients collected for it."""

    def __init__(self, fn: Callable, structure: Any, inputs: list[Tensor], rng_state: dict | None) -> None:
        self.fn = fn
        self.structure = structure  # (args, kwargs) with tensors as slots into ``inputs``
        self.inputs = inputs
        self.rng_state = rng_state
        self.autocast = (is_autocast_enabled(), get_autocast_dtype())
        self.grads: list[Tensor | None] = []

    def recompute_backward(self) -> tuple:
        """Run ``fn`` again and backward through it with ``self.grads``; the inputs' gradients."""
        leaves = []
        for t in self.inputs:
            d = t.detach()
            d.requires_grad = t.requires_grad
            leaves.append(d)
        args, kwargs = _fill(self.structure, leaves)
        gen = creation.generator()
        now = gen.bit_generator.state
        if self.rng_state is not None:
            gen.bit_generator.state = self.rng_state
        try:
            enabled, dtype = self.autocast
            with enable_grad(), autocast(dtype=dtype, enabled=enabled):
                found: list[Tensor] = []
                _flatten(self.fn(*args, **kwargs), found)
        finally:
            if self.rng_state is not None:
                gen.bit_generator.state = now  # backward leaves the random stream where it was
        roots = [(t, g) for t, g in zip(found, self.grads) if g is not None and t.requires_grad]
        self.grads = [None] * len(self.grads)  # retain_graph: a second backward collects afresh
        if roots:
            # Inside the running pass, not a nested backward(): hooks' queued callbacks (FSDP's end of
            # backward) must run once, after the whole pass.
            engine.backward_within_pass([t for t, _ in roots], [g for _, g in roots])
        return tuple(d.grad if t.requires_grad else None for t, d in zip(self.inputs, leaves))


def checkpoint(function: Callable, *args, use_reentrant: bool | None = False, context_fn: Callable | None = None,
               determinism_check: str = "default", debug: bool = False, preserve_rng_state: bool = True,
               **kwargs) -> Any:
    """Call ``function(*args, **kwargs)`` without keeping its activations; backward recomputes them.

    As ``torch.utils.checkpoint.checkpoint``: the outputs (a tensor, or tensors in tuples, lists and
    dicts) are the function's; backward reruns the function with the random state of the first call
    (the same dropout masks) and its autocast state, then backpropagates through the rerun. Inputs that
    do not require grad, keyword arguments, nesting and several outputs work; gradients equal those
    without checkpointing (module docstring: how, and the one case where they differ by rounding).
    With grad disabled it just calls the function.

    Arguments:
        function: what to run; it must compute the same outputs when called again (no in-place changes
            to its inputs, no state it changes between the calls).
        args, kwargs: its arguments.
        use_reentrant: accepted for torch's signature; both give the behaviour above.
        preserve_rng_state: False skips restoring the random state (dropout masks then differ).
        context_fn, determinism_check, debug: torch's options for its own variants; only their defaults
            are accepted.
    """
    if context_fn is not None or determinism_check != "default" or debug:
        raise ValueError("checkpoint: context_fn, determinism_check and debug are not supported (leave them at "
                         "their defaults)")
    if not is_grad_enabled():
        return function(*args, **kwargs)
    inputs: list[Tensor] = []
    structure = _flatten((args, kwargs), inputs)
    rng_state = creation.generator().bit_generator.state if preserve_rng_state else None
    outer = current_tape()  # a pipeline stage's: it records the region's node, not the region
    install_tape()
    try:
        out = function(*args, **kwargs)
    finally:
        tape = take_tape()
        if outer is not None:
            install_tape(outer)
    outputs: list[Tensor] = []
    out_structure = _flatten(out, outputs)
    leaves = _used_leaves(outputs, inputs)
    tape.release()  # the region's activations go now; backward recomputes them
    grad_out = [t.requires_grad and t._node is not None for t in outputs]
    outputs = [t.detach() for t in outputs]
    region = _Region(function, structure, inputs, rng_state)
    _attach(region, outputs, grad_out, inputs, leaves)
    return _fill(out_structure, outputs)


def _attach(region: _Region, outputs: list[Tensor], grad_out: list[bool], inputs: list[Tensor],
            leaves: list[Tensor]) -> None:
    """Give the outputs that had a graph the node(s) that run the region's backward."""
    wired = [i for i, g in enumerate(grad_out) if g]
    if not wired:
        return

    def run(*_):
        grads = region.recompute_backward()
        return grads + (None,) * len(leaves)

    node_inputs = [*inputs, *leaves]
    if len(outputs) == 1:
        def single(g):
            region.grads = [g]
            return run()
        record("Checkpoint", outputs[0], node_inputs, single)
        return
    # Each output's node hands its gradient over and sends a 1-element token on to the shared node, which
    # backward reaches only after every output's node (they all lead to it).
    region.grads = [None] * len(outputs)
    ref = outputs[wired[0]]
    token = record("Checkpoint", fill((1,), 0.0, ref.dtype, ref.device), node_inputs, run)
    for i in wired:
        def hand_over(g, i=i):
            region.grads[i] = g
            return (fill((1,), 0.0, token.dtype, token.device),)
        record("CheckpointOutput", outputs[i], [token], hand_over)


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = False,
                          **kwargs) -> Any:
    """Run ``functions`` (a Sequential or a list of callables) in order on ``input``, checkpointing them in
    ``segments`` consecutive chunks (the last chunk runs without checkpointing, as torch's does).

    Arguments:
        functions: modules or callables, each taking the previous one's output.
        segments: how many chunks (1 <= segments <= len(functions)).
        input: the first function's input.
        use_reentrant, kwargs: passed to ``checkpoint`` (``preserve_rng_state``).
    """
    functions = list(functions.children()) if hasattr(functions, "children") else list(functions)
    if not 1 <= segments <= max(len(functions), 1):
        raise ValueError(f"checkpoint_sequential: segments must be in [1, {len(functions)}], got {segments}")
    size = len(functions) // segments

    def chunk(start: int, end: int) -> Callable:
        def forward(x):
            for f in functions[start:end]:
                x = f(x)
            return x
        return forward

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(chunk(start, end + 1), input, use_reentrant=use_reentrant, **kwargs)
    return chunk(end + 1, len(functions))(input)


__all__ = ["checkpoint", "checkpoint_sequential"]
