"""Memory snapshots: the events ``record_history`` collected, replayed into per-device timelines by
category (docs/design.md, "Memory timeline")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..runtime import memory_history as _hist
from ..runtime.memory_history import DeviceStart, Event

CATEGORIES = _hist.CATEGORIES
TENSOR_CATEGORIES = _hist.TENSOR_CATEGORIES


class Phase(NamedTuple):
    """A backward pass or an optimizer step of one thread (the rest counts as forward, as in the profiler)."""

    thread: int
    name: str
    start_ns: int
    end_ns: int


class Timeline(NamedTuple):
    """One device's memory after each event (index 0: when the history started).

    ``bytes[c][i]``: bytes in category ``c`` after point ``i``; the tensor categories sum to ``allocated[i]``,
    adding "allocator cache" (reserved but holding no tensor bytes: cached blocks and the rounding of
    live blocks to their size class) gives ``reserved[i]``; "staging / upload buffer" is ``staging[i]``.
    ``recorded[i]``: the allocator's own (allocated, reserved, staging) counts at that event, None for
    a retag (which changes no count).
    """

    device: int
    times_ns: list[int]
    events: list[Event | None]
    bytes: dict[str, list[int]]
    allocated: list[int]
    reserved: list[int]
    staging: list[int]
    recorded: list[tuple[int, int, int] | None]


@dataclass(frozen=True)
class MemorySnapshot:
    """What ``wgpar.memory.snapshot()`` returns: every allocation, free, re-tag, cache release and staging
    buffer of the recording (``events``, each with device, bytes, time, thread, category and a short
    stack), each device's memory when it started (``starts``) and the phases of every thread."""

    events: tuple[Event, ...]
    starts: dict[int, DeviceStart]
    phases: tuple[Phase, ...]
    thread_names: dict[int, str]
    start_ns: int
    end_ns: int

    @property
    def devices(self) -> list[int]:
        """The device indices the snapshot has events or starting counts for, sorted."""
        return sorted(set(self.starts) | {e.device for e in self.events})

    def timeline(self, device: int) -> Timeline:
        """Replay ``device``'s events in the order its allocator counted them."""
        start = self.starts.get(device)
        by_cat = dict.fromkeys(CATEGORIES, 0)
        if start is not None:
            by_cat.update(start.by_category)
            live, cached, staging, t0 = start.live_sizes, start.cached, start.staging, start.time_ns
        else:  # a device made after the history started
            live = cached = staging = 0
            t0 = self.start_ns
        series: dict[str, list[int]] = {c: [] for c in CATEGORIES}
        tl = Timeline(device, [], [], series, [], [], [], [])

        def point(t: int, ev: Event | None) -> None:
            allocated = sum(by_cat[c] for c in TENSOR_CATEGORIES)
            reserved = live + cached
            by_cat[_hist.CACHE] = reserved - allocated
            by_cat[_hist.STAGING] = staging
            for c in CATEGORIES:
                series[c].append(by_cat[c])
            tl.times_ns.append(t)
            tl.events.append(ev)
            tl.allocated.append(allocated)
            tl.reserved.append(reserved)
            tl.staging.append(staging)
            tl.recorded.append(None if ev is None or ev.allocated is None else (ev.allocated, ev.reserved, ev.staging))

        point(t0, None)
        for ev in sorted((e for e in self.events if e.device == device), key=lambda e: e.seq):
            if ev.action == "alloc":
                by_cat[ev.category] += ev.nbytes
                live += ev.size
                if ev.from_cache:
                    cached -= ev.size
            elif ev.action == "free":
                by_cat[ev.category] -= ev.nbytes
                live -= ev.size
                cached += ev.size
            elif ev.action == "retag":
                by_cat[ev.old] -= ev.nbytes
                by_cat[ev.category] += ev.nbytes
            elif ev.action == "release":
                cached -= ev.size
            elif ev.action == "staging alloc":
                staging += ev.size
            elif ev.action == "staging free":
                staging -= ev.size
            point(max(ev.time_ns, tl.times_ns[-1]), ev)
        return tl

    def peak(self, category: str, device: int) -> int:
        """The most bytes ``category`` held on ``device`` at any point of the recording."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}; the categories are {', '.join(CATEGORIES)}")
        return max(self.timeline(device).bytes[category])

    def device_threads(self, device: int) -> set[int]:
        """Threads that allocated or freed on ``device`` (whose phases its plot marks)."""
        return {e.thread for e in self.events if e.device == device and e.action in ("alloc", "free")}


def from_history(hist: _hist.History) -> MemorySnapshot:
    end = hist.t_end if hist.t_end is not None else _hist.now()
    phases = tuple(sorted((Phase(*p) for p in list(hist.phases)), key=lambda p: p.start_ns))
    return MemorySnapshot(tuple(sorted(list(hist.events), key=lambda e: e.time_ns)), dict(hist.starts), phases,
                          dict(hist.thread_names), hist.t_start, end)
