"""The memory timeline's recorder: what ``wgpar.memory.record_history`` collects (see docs/design.md,
"Memory timeline").

It sits in the runtime layer so the allocator can report into it. Higher layers decide categories
without being imported from here: they enter :func:`category` (a thread-local stack that an
allocation made while recording takes its category from) or re-tag a live block with :func:`tag`
(which works whether or not a history is recorded, so tensors made before it started still carry
their category). While nothing records, ``ACTIVE`` is None and the allocator pays one global read
per malloc and free.

Events of one device are ordered by a sequence number taken under its allocator's lock, together
with the allocator's counts after the event, so replaying them reproduces ``memory_stats`` exactly
even when several threads allocate on one device.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .allocator import Block, CachingAllocator

PARAMETER = "parameter"
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer state"
SAVED_ACTIVATION = "saved activation"
FSDP_UNIT = "FSDP gathered unit"
PIPELINE_ACTIVATION = "pipeline activation in flight"
STAGING = "staging / upload buffer"
CACHE = "allocator cache"
OTHER = "other"
# Tensor categories (blocks of the allocator); CACHE and STAGING are the two bands outside them.
TENSOR_CATEGORIES = (PARAMETER, GRADIENT, OPTIMIZER_STATE, SAVED_ACTIVATION, FSDP_UNIT, PIPELINE_ACTIVATION, OTHER)
CATEGORIES = (*TENSOR_CATEGORIES, CACHE, STAGING)

_STACK_FRAMES = 6
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP = (_RUNTIME_DIR, *(os.path.join(os.path.dirname(_RUNTIME_DIR), f) for f in ("storage.py", "tensor.py")))

ACTIVE: History | None = None
_switch = threading.Lock()
# Every allocator, registered as it is made (importing the device registry from here would be a cycle).
_allocators: weakref.WeakSet[CachingAllocator] = weakref.WeakSet()
_local = threading.local()
now = time.perf_counter_ns


class Event(NamedTuple):
    """One change to a device's memory. ``action``: "alloc", "free", "retag" (``old`` -> ``category``),
    "release" (the cache went back to wgpu: ``size`` bytes), "staging alloc", "staging free".
    ``allocated``, ``reserved``, ``staging``: the device's counts right after it (None for retag)."""

    seq: int
    time_ns: int
    device: int
    action: str
    category: str
    nbytes: int
    size: int
    from_cache: bool
    old: str | None
    allocated: int | None
    reserved: int | None
    staging: int | None
    thread: int
    stack: tuple[tuple[str, int, str], ...]


class DeviceStart(NamedTuple):
    """A device's memory when the history started: tensor bytes by category, the live blocks' sizes,
    the cache and staging buffers (all as ``memory_stats`` counts them)."""

    device: int
    time_ns: int
    by_category: dict[str, int]
    live_sizes: int
    cached: int
    staging: int


def category(name: str):
    """Blocks allocated by this thread inside the ``with`` get category ``name`` (while recording)."""
    return _Category(name)


class _Category:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self.name)

    def __exit__(self, *exc) -> None:
        _local.stack.pop()


def current_category() -> str:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else OTHER


def block_category(block: Block) -> str:
    return getattr(block, "category", OTHER)  # set by tag() or by an allocation while recording


def tag(allocator: CachingAllocator, block: Block | None, name: str) -> None:
    """Give a live block of ``allocator`` category ``name`` (a retag event while recording)."""
    if block is None or block.buffer is None:
        return
    old = block_category(block)
    if old == name:
        return
    if ACTIVE is None:
        block.category = name
        return
    allocator.retag(block, name)


_SAVED = (SAVED_ACTIVATION, PIPELINE_ACTIVATION)


def save(storage) -> None:
    """Autograd keeps ``storage`` for backward: an untagged block becomes a saved activation (in flight
    inside a pipeline micro-batch's forward). Counted per graph node, so the last release undoes it."""
    hist, block = ACTIVE, storage.block
    if hist is None or block is None:
        return
    cat = block_category(block)
    if cat == OTHER:
        cat = PIPELINE_ACTIVATION if current_category() == PIPELINE_ACTIVATION else SAVED_ACTIVATION
        tag(storage.device.allocator, block, cat)
    if cat in _SAVED:
        entry = hist.saves.get(id(block))
        if entry is None or entry[0] is not block:
            hist.saves[id(block)] = [block, 1]
        else:
            entry[1] += 1


def unsave(storage) -> None:
    """A graph node released ``storage``: a tensor that outlives its graph (the user's input) is "other" again."""
    hist, block = ACTIVE, storage.block
    if hist is None or block is None:
        return
    entry = hist.saves.get(id(block))
    if entry is None or entry[0] is not block:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del hist.saves[id(block)]
        if block_category(block) in _SAVED:
            tag(storage.device.allocator, block, OTHER)


def _stack() -> tuple[tuple[str, int, str], ...]:
    """A few frames of the caller, starting outside the runtime, Storage and Tensor (cheap: no source lines)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
    out = []
    while f is not None and len(out) < _STACK_FRAMES:
        code = f.f_code
        out.append((code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    return tuple(out)


class History:
    """The events of one recording (devices by index) and the phases (backward, optimizer) of each thread."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.starts: dict[int, DeviceStart] = {}
        self.phases: list[tuple[int, str, int, int]] = []  # (thread, phase, start ns, end ns)
        self.saves: dict[int, list] = {}  # id(block) -> [block, graph nodes keeping it]
        self.thread_names: dict[int, str] = {}
        self.t_start = 0
        self.t_end: int | None = None
        self.stopped = False

    def record(self, dev: int, action: str, cat: str, nbytes: int, size: int, from_cache: bool, old: str | None,
               seq: int, allocated: int | None, reserved: int | None, staging: int | None) -> None:
        ident = threading.get_ident()
        if ident not in self.thread_names:
            self.thread_names[ident] = threading.current_thread().name
        self.events.append(Event(seq, now(), dev, action, cat, nbytes, size, from_cache, old, allocated, reserved,
                                 staging, ident, _stack()))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = now()
        try:
            yield
        finally:
            ident = threading.get_ident()
            if ident not in self.thread_names:
                self.thread_names[ident] = threading.current_thread().name
            self.phases.append((ident, name, t0, now()))


def register(allocator: CachingAllocator) -> None:
    """Include ``allocator`` in every history started from now on (CachingAllocator calls this)."""
    with _switch:
        _allocators.add(allocator)


def _live_allocators() -> list[CachingAllocator]:
    return sorted(_allocators, key=lambda a: a.device_index)


def start() -> History:
    """Start recording (a no-op returning the running history when one records)."""
    global ACTIVE
    with _switch:
        if ACTIVE is not None:
            return ACTIVE
        hist = History()
        hist.t_start = now()
        allocs = _live_allocators()
        # Under every allocator's lock: each device's census and its first event are consistent.
        with contextlib.ExitStack() as locks:
            for a in allocs:
                locks.enter_context(a._lock)
            for a in allocs:
                hist.starts[a.device_index] = a.census(hist.t_start)
            ACTIVE = hist
        return hist


def stop() -> History | None:
    """Stop recording; returns the history that was recording (None if none was)."""
    global ACTIVE
    with _switch:
        hist = ACTIVE
        if hist is None:
            return None
        with contextlib.ExitStack() as locks:
            for a in _live_allocators():
                locks.enter_context(a._lock)
            ACTIVE = None
        hist.stopped = True
        hist.t_end = now()
        return hist


_NO_PHASE = contextlib.nullcontext()


def phase(name: str):
    """A forward/backward/optimizer range of this thread on the timeline (a no-op when not recording)."""
    hist = ACTIVE
    return _NO_PHASE if hist is None else hist.phase(name)
