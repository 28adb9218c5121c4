"""The recorded graph: Nodes, thread-local tapes and the backward walk.

Each differentiable op gives its output a Node holding the inputs, a backward
closure and the versions of the tensors it saved. The graph is linked through
the nodes, so backward needs only the output; a Tape additionally collects the
nodes a thread records (each thread, e.g. a replica or a pipeline stage, has
its own) while one is installed, so a pipeline can keep one micro-batch's graph, hand it to another
step, and release it after its backward. Node ids come from one process-wide
counter, so gradients never collide across threads.

A node's pre-hooks (``Node.register_prehook``; ``Tensor.register_hook`` on a non-leaf) run when
backward reaches it, before its saved tensors' versions are checked and before its backward
function runs: FSDP re-gathers the parameters the node saved there.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from ..hooks import RemovableHandle, add_hook
from ..runtime import memory_history as _hist

_ids = itertools.count(1)  # next() on itertools.count is atomic under the GIL
_local = threading.local()


class _Edge:
    """What a released node keeps of a non-leaf input: its producer, not the tensor (whose storage,
    an activation, can then be freed while the graph's output is still referenced)."""

    __slots__ = ("_node",)

    def __init__(self, node: Node) -> None:
        self._node = node


class Node:
    """One recorded op of the autograd graph (``grad_fn`` in torch terms): its inputs, backward function and
    saved tensors.

    ``name`` labels it in errors; ``partial`` marks a backward function that takes a mask of the inputs
    whose gradients are wanted. Saved tensors are kept with their storage's version so that backward
    can refuse ones modified in place.
    """

    __slots__ = ("id", "name", "inputs", "backward_fn", "partial", "saved", "freed", "prehooks", "__weakref__")

    def __init__(self, name: str, inputs: Sequence, backward_fn: Callable, saved: Sequence,
                 partial: bool = False) -> None:
        self.id = next(_ids)
        self.name = name
        self.inputs = tuple(inputs)  # Tensor or None per differentiable input position
        self.backward_fn = backward_fn
        self.partial = partial  # backward_fn(g, mask) computes only the masked inputs' gradients
        self.saved = tuple([(t, t._storage.version) for t in saved]) if saved else ()
        if _hist.ACTIVE is not None:  # on the memory timeline, what backward keeps is a saved activation
            for t in saved:
                _hist.save(t._storage)
        self.freed = False
        self.prehooks: OrderedDict | None = None  # made on first registration: most nodes have none

    def register_prehook(self, hook: Callable) -> RemovableHandle:
        """Call ``hook(grad_output)`` when backward reaches this node, before its backward function.

        ``grad_output`` is the gradient w.r.t. the node's output (summed over all its uses). The
        hook may return None or a replacement gradient of the same shape, dtype and device, which
        later hooks, ``retain_grad`` and the backward function see. Pre-hooks run in registration
        order and before the node's saved tensors are checked for in-place changes, so a hook may
        restore a saved tensor's storage (see ``preserve_version``).

        Arguments:
            hook: the callable.

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        if self.prehooks is None:
            self.prehooks = OrderedDict()
        return add_hook(self.prehooks, hook)

    def check_versions(self) -> None:
        """Raise RuntimeError if a saved tensor was modified in place since it was saved (torch's
        version-counter check)."""
        for t, version in self.saved:
            if t._storage.version != version:
                raise RuntimeError(
                    f"autograd: a tensor of shape {t.shape} saved by {self.name} for backward was modified "
                    f"in place (version {version} -> {t._storage.version}); use an out-of-place op or clone() (a "
                    "storage re-materialised for backward must be restored inside autograd.preserve_version)")

    def release(self) -> None:
        """Drop the backward function, saved tensors and prehooks (backward does so after using the node
        unless ``retain_graph``); the node is then marked freed. Non-leaf inputs are replaced by their
        producers (as torch's ``next_functions``): a kept output (a list of losses) then holds no
        activations, only the freed nodes."""
        if _hist.ACTIVE is not None:
            for t, _ in self.saved:
                _hist.unsave(t._storage)
        self.backward_fn = None
        self.saved = ()
        self.prehooks = None
        self.inputs = tuple(t if t is None or t._node is None else _Edge(t._node) for t in self.inputs)
        self.freed = True

    def __repr__(self) -> str:
        return f"<Node {self.name} #{self.id}>"


class Tape:
    """The nodes one thread recorded while this tape was installed."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def record(self, node: Node) -> None:
        """Append ``node`` to this tape (the engine calls it for every node recorded while the tape is installed).

        Arguments:
            node: the recorded graph node.
        """
        self.nodes.append(node)

    def release(self) -> None:
        """Free every saved tensor of this tape's graph (after its backward, or to drop it)."""
        for n in self.nodes:
            n.release()
        self.nodes.clear()

    def __len__(self) -> int:
        return len(self.nodes)


def current_tape() -> Tape | None:
    """This thread's installed tape; None (the default) records into the graph alone."""
    return getattr(_local, "tape", None)


def install_tape(tape: Tape | None = None) -> Tape:
    """Make ``tape`` (or a fresh one) this thread's tape; returns it."""
    _local.tape = tape if tape is not None else Tape()
    return _local.tape


def take_tape() -> Tape:
    """Remove and return this thread's tape (an empty one if none was installed)."""
    tape = current_tape()
    _local.tape = None
    return tape if tape is not None else Tape()
