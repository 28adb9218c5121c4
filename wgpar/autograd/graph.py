"""The recorded graph: Nodes, thread-local tapes and the backward walk.

Each differentiable op gives its output a Node holding the inputs, a backward
closure and the versions of the tensors it saved. The graph is linked through
the nodes, so backward needs only the output; a Tape additionally collects the
nodes a thread records (each thread, e.g. a replica or a pipeline stage, has
its own) while one is installed, so a pipeline can keep one micro-batch's graph, hand it to another
step, and release it after its backward. Node ids come from one process-wide
counter, so gradients never collide across threads.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence

_ids = itertools.count(1)  # next() on itertools.count is atomic under the GIL
_local = threading.local()


class Node:
    __slots__ = ("id", "name", "inputs", "backward_fn", "saved", "freed", "__weakref__")

    def __init__(self, name: str, inputs: Sequence, backward_fn: Callable, saved: Sequence) -> None:
        self.id = next(_ids)
        self.name = name
        self.inputs = tuple(inputs)  # Tensor or None per differentiable input position
        self.backward_fn = backward_fn
        self.saved = tuple((t, t._storage.version) for t in saved)
        self.freed = False

    def check_versions(self) -> None:
        for t, version in self.saved:
            if t._storage.version != version:
                raise RuntimeError(
                    f"autograd: a tensor of shape {t.shape} saved by {self.name} for backward was modified "
                    f"in place (version {version} -> {t._storage.version}); use an out-of-place op or clone()")

    def release(self) -> None:
        self.backward_fn = None
        self.saved = ()
        self.freed = True

    def __repr__(self) -> str:
        return f"<Node {self.name} #{self.id}>"


class Tape:
    """The nodes one thread recorded while this tape was installed."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def record(self, node: Node) -> None:
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
