"""The profiler's recorder: what ``wgpar.profiler.profile`` collects while it runs (see docs/design.md,
"Profiling").

It sits in the runtime layer so that ``Device`` can report into it; higher layers (the backward
engine, ``Optimizer.step``, the collectives) report host ranges through :func:`span`. While no
profile runs, ``ACTIVE`` is None and the dispatch path pays one global read; nothing else exists
(no query set, no buffer, no thread state).

While one runs, every dispatch on a device whose adapter offers ``timestamp-query-inside-passes``
is timed with timestamp writes inside the open compute pass (slots of one reused query set). Each
timestamp write costs the GPU a few microseconds (on an H100 about 5 us: the stream drains), so by
default (``timing="kernels"``) consecutive dispatches of a pass share one: a stamp opens the pass's
first dispatch and one follows each dispatch, and a kernel's time runs from the stamp before it to the
stamp after it (its launch and the barrier before it included). ``timing="exact"`` brackets each
dispatch with two stamps of its own (twice the cost; the gaps between kernels inside a pass show as
idle). At submit the used slots are resolved into a buffer region of their own, in the same command
buffer; nothing is read back until the profile stops. Elsewhere only host times are recorded, and
the results say so.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import wgpu
from wgpu.backends.wgpu_native.extras import write_timestamp

from . import memory_history

if TYPE_CHECKING:
    from .device import Device

TIMESTAMP_FEATURES = ("timestamp-query", "timestamp-query-inside-passes")
TIMINGS = ("kernels", "exact")
_CHUNK = 1 << 20  # bytes of one resolve buffer (8 bytes per timestamp)
_RESOLVE_ALIGN = 256  # resolve_query_set's destination offsets
now = time.perf_counter_ns

ACTIVE: Recorder | None = None
DEVICES: weakref.WeakSet[Device] = weakref.WeakSet()  # every open device (each adds itself)
_switch = threading.Lock()


class DeviceTrack:
    """One device's share of a profile: its query set, the dispatches of the open command stream, and
    every submitted batch. Touched only with the device's lock held."""

    def __init__(self, device: Device, recorder: Recorder) -> None:
        self.device = device
        self.recorder = recorder
        self.missing = [f for f in TIMESTAMP_FEATURES if f not in device.features]
        self.query_set = None
        self.period = 1.0  # nanoseconds per timestamp tick
        if not self.missing:
            try:
                self.query_set = device._dev.create_query_set(
                    label=f"wgpar:{device.index}:profiler", type=wgpu.QueryType.timestamp,
                    count=2 * device.max_dispatches_per_submit)
                self.period = _timestamp_period(device)
            except Exception as exc:  # profiling must never fail the program: time on the host instead
                self.missing = [f"a timestamp query set ({exc})"]
        # (kspec, groups, flops, nbytes, thread, host start, host end, slot before, slot after)
        self.pending: list[tuple] = []
        self.slots = 0  # query slots written in the open batch
        self.stamped_pass = None  # the compute pass whose last dispatch's closing stamp is the latest slot
        self.batches: list[tuple] = []  # (records, (chunk, offset) or None, thread, host start, host end of submit)
        self.chunks: list[Any] = []
        self.used: list[int] = []
        self._inflight: tuple | None = None
        self.stamps: list[np.ndarray] = []  # the chunks' contents, read at stop
        if self.query_set is not None:
            self._new_chunk()  # now, not inside the first profiled submit

    def _new_chunk(self) -> None:
        # Not Device.create_buffer: its out-of-memory retry synchronizes, and we may be inside a flush.
        self.chunks.append(self.device._dev.create_buffer(
            label=f"wgpar:{self.device.index}:profiler", size=_CHUNK,
            usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC))
        self.used.append(0)

    def resolve(self, encoder) -> None:
        """Before a submit: resolve this batch's timestamps into a region of a resolve buffer."""
        t = now()
        records, self.pending = self.pending, []
        slots, self.slots, self.stamped_pass = self.slots, 0, None
        where = None
        if slots and self.query_set is not None:
            nbytes = 8 * slots
            if self.used[-1] + nbytes > _CHUNK:
                self._new_chunk()
            where = (len(self.chunks) - 1, self.used[-1])
            encoder.resolve_query_set(self.query_set, 0, slots, self.chunks[-1], self.used[-1])
            self.used[-1] += -(-nbytes // _RESOLVE_ALIGN) * _RESOLVE_ALIGN
        self._inflight = (records, where, self.recorder._thread(), t)

    def submitted(self) -> None:
        """After a successful submit (a failed one leaves its batch out: those commands never ran)."""
        if self._inflight is not None:
            self.batches.append((*self._inflight, now()))
            self._inflight = None

    def read_back(self) -> None:
        """Copy every resolve buffer to the host (once, at stop, after the device finished)."""
        self.stamps = [np.frombuffer(self.device.download(c, 0, used), dtype=np.uint64) if used
                       else np.zeros(0, np.uint64) for c, used in zip(self.chunks, self.used)]
        self.chunks = []


def _timestamp_period(device: Device) -> float:
    from wgpu.backends.wgpu_native._api import libf

    try:
        period = float(libf.wgpuQueueGetTimestampPeriod(device.queue._internal))
    except Exception:  # another wgpu backend: WebGPU's timestamps are nanoseconds
        return 1.0
    return period if period > 0 else 1.0


class Recorder:
    """What one profile collects: per-device tracks and host ranges (name, category, thread, start,
    end, arguments), host times from ``time.perf_counter_ns``."""

    def __init__(self, timing: str = "kernels") -> None:
        if timing not in TIMINGS:
            raise ValueError(f"profile(timing={timing!r}): expected one of {', '.join(map(repr, TIMINGS))}")
        self.exact = timing == "exact"
        self.tracks: dict[int, DeviceTrack] = {}
        self.ranges: list[tuple] = []
        self.threads: dict[int, str] = {}
        self.stopped = False
        self.t_start = 0
        self.t_end = 0

    def _thread(self) -> int:
        ident = threading.get_ident()
        if ident not in self.threads:
            self.threads[ident] = threading.current_thread().name
        return ident

    def dispatch(self, dev: Device, cp, kspec, groups, flops: int, nbytes: int, t0: int) -> None:
        """Record one dispatch into the open pass ``cp`` (the device lock is held)."""
        track = dev._ptrack
        if track is None:
            if self.stopped:  # stop() ran while this dispatch waited for the device lock
                cp.dispatch_workgroups(*groups)
                return
            track = dev._ptrack = self.tracks[id(dev)] = DeviceTrack(dev, self)
        qs = track.query_set
        if qs is None:
            cp.dispatch_workgroups(*groups)
            before = after = -1
        else:
            if self.exact or track.stamped_pass is not cp:  # the pass's first dispatch (or every one, exact)
                write_timestamp(cp, qs, track.slots)
                track.slots += 1
                track.stamped_pass = cp
            before, after = track.slots - 1, track.slots  # the stamp ahead of it, and its own
            cp.dispatch_workgroups(*groups)
            write_timestamp(cp, qs, after)
            track.slots += 1
        track.pending.append((kspec, groups, flops, nbytes, self._thread(), t0, now(), before, after))

    def host(self, name: str, cat: str, t0: int, t1: int, args: dict) -> None:
        self.ranges.append((name, cat, self._thread(), t0, t1, args))

    def start(self) -> None:
        global ACTIVE
        with _switch:
            if ACTIVE is not None:
                raise RuntimeError("a wgpar profile is already running; profiles do not nest")
            for dev in list(DEVICES):  # query sets and a resolve buffer now, not in the first steps
                with dev._lock:
                    if dev._ptrack is None:
                        dev._ptrack = self.tracks[id(dev)] = DeviceTrack(dev, self)
            self.t_start = now()
            ACTIVE = self

    def stop(self) -> None:
        """Stop recording, submit what is pending, wait for the devices and read the timestamps back."""
        global ACTIVE
        with _switch:
            if ACTIVE is self:
                ACTIVE = None
        if self.stopped:
            return
        self.stopped = True
        tracks = list(self.tracks.values())
        for track in tracks:
            dev = track.device
            with dev._lock:
                dev._flush_locked()
                dev._ptrack = None
        for track in tracks:
            track.device.synchronize()
        self.t_end = now()
        for track in tracks:
            track.read_back()


class _Span:
    __slots__ = ("rec", "name", "cat", "args", "t0")

    def __init__(self, rec: Recorder, name: str, cat: str, args: dict) -> None:
        self.rec, self.name, self.cat, self.args = rec, name, cat, args

    def __enter__(self) -> _Span:
        self.t0 = now()
        return self

    def __exit__(self, *exc) -> None:
        if not self.rec.stopped:
            self.rec.host(self.name, self.cat, self.t0, now(), self.args)


_OFF = contextlib.nullcontext()


def span(name: str, cat: str = "range", **args: Any):
    """A host range on the calling thread's track while a profile runs; otherwise a no-op.

    Arguments:
        name: what the range shows as.
        cat: its category: "range" (record_function), "phase" (forward/backward/optimizer;
            ``args["phase"]`` names it), "collective" or "transfer".
        args: extra fields shown with the event (bytes, rank, ...).
    """
    rec = ACTIVE
    s = _OFF if rec is None else _Span(rec, name, cat, args)
    if cat == "phase" and memory_history.ACTIVE is not None:  # the memory timeline marks phases too
        return _Both(memory_history.phase(args.get("phase", name)), s)
    return s


class _Both:
    __slots__ = ("a", "b")

    def __init__(self, a, b) -> None:
        self.a, self.b = a, b

    def __enter__(self):
        self.a.__enter__()
        return self.b.__enter__()

    def __exit__(self, *exc) -> None:
        self.b.__exit__(*exc)
        self.a.__exit__(*exc)
