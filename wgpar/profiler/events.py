"""A finished profile's events: kernels (GPU and recording times) and host ranges, their averages, the table.

GPU timestamps come in the device's clock. Each submit's first timestamp is placed at the host time
of that submit, or at the end of the device's previous submit if that is later (a queued submit
starts when the one before it ends), and the submit's other timestamps keep their distances to it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Any

from ..runtime.profiling import Recorder


@dataclass(frozen=True)
class KernelEvent:
    """One dispatch: times in nanoseconds since the profile started, on the host clock."""

    name: str  # the KernelSpec label: family and specialisation
    family: str
    device: int  # Device.index
    grid: tuple[int, ...]  # workgroups per dimension
    flops: int  # 0 where the caller did not say
    nbytes: int
    thread: int  # the recording thread's ident
    host_start: int
    host_dur: int  # time spent recording the dispatch (pipeline and bind group lookup included)
    gpu_start: int | None  # None where the device has no timestamp queries
    gpu_dur: int | None
    phase: str = "forward"  # "backward" or "optimizer" inside those phases, "forward" elsewhere


@dataclass(frozen=True)
class RangeEvent:
    """A host range: record_function ("range"), a phase, a collective, a host transfer, or a submit."""

    name: str
    cat: str
    thread: int
    start: int
    dur: int
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    missing: tuple[str, ...]  # timestamp features the device lacks (empty: GPU times are measured)

    @property
    def timed(self) -> bool:
        """Whether the device gave GPU timestamps (nothing is missing)."""
        return not self.missing


@dataclass
class Results:
    kernels: list[KernelEvent]
    ranges: list[RangeEvent]
    devices: list[DeviceInfo]
    threads: dict[int, str]
    wall: int  # nanoseconds from start to stop (after the devices finished)
    timing: str = "kernels"  # profile(timing=...): how GPU times were taken


def build(rec: Recorder) -> Results:
    t0 = rec.t_start
    ranges = [RangeEvent(n, c, th, a - t0, b - a, args) for n, c, th, a, b, args in rec.ranges]
    kernels: list[KernelEvent] = []
    devices = []
    for track in rec.tracks.values():
        dev = track.device
        devices.append(DeviceInfo(dev.index, str(dev), tuple(track.missing)))
        prev_end = None
        for records, where, thread, ts, te in track.batches:
            ranges.append(RangeEvent("submit", "submit", thread, ts - t0, te - ts,
                                     {"device": dev.index, "dispatches": len(records)}))
            times: list[tuple[int | None, int | None]] = [(None, None)] * len(records)
            if where is not None:
                chunk, off = where
                stamps = (track.stamps[chunk][off // 8: off // 8 + records[-1][-1] + 1].astype(float)
                          * track.period).tolist()
                anchor = ts if prev_end is None else max(ts, prev_end)
                shift = anchor - stamps[0]
                times = []
                for r in records:
                    a, b = stamps[r[-2]], stamps[r[-1]]
                    times.append((int(a + shift) - t0, int(b - a)) if b >= a > 0 else (None, None))
                prev_end = int(stamps[-1] + shift)
            for (kspec, groups, flops, nbytes, th, h0, h1, _, _), (g0, gd) in zip(records, times):
                kernels.append(KernelEvent(kspec.label, kspec.family, dev.index, tuple(groups), flops, nbytes, th,
                                           h0 - t0, h1 - h0, g0, gd))
    kernels = _with_phases(kernels, ranges)
    kernels.sort(key=lambda k: k.host_start)
    ranges.sort(key=lambda r: r.start)
    devices.sort(key=lambda d: d.index)
    return Results(kernels, ranges, devices, dict(rec.threads), rec.t_end - rec.t_start,
                   "exact" if rec.exact else "kernels")


def _with_phases(kernels: list[KernelEvent], ranges: list[RangeEvent]) -> list[KernelEvent]:
    """Each kernel's phase: the innermost phase range of its thread around its recording."""
    by_thread: dict[int, list[RangeEvent]] = {}
    for r in ranges:
        if r.cat == "phase":
            by_thread.setdefault(r.thread, []).append(r)
    if not by_thread:
        return kernels
    index = {}
    for th, rs in by_thread.items():
        rs.sort(key=lambda r: r.start)
        reach, top = [], 0
        for r in rs:  # how far any range up to here reaches: the walk back stops where none does
            top = max(top, r.start + r.dur)
            reach.append(top)
        index[th] = ([r.start for r in rs], reach, rs)
    out = []
    for k in kernels:
        phase = "forward"
        got = index.get(k.thread)
        if got is not None:
            starts, reach, rs = got
            i = bisect.bisect_right(starts, k.host_start) - 1
            while i >= 0 and reach[i] > k.host_start:
                if rs[i].start + rs[i].dur > k.host_start:
                    phase = rs[i].args.get("phase", rs[i].name)
                    break
                i -= 1
        out.append(k if phase == "forward" else replace(k, phase=phase))
    return out


class _ThreadKernels:
    """A thread's kernels by recording time, with running sums: the GPU time inside a host range."""

    def __init__(self, kernels: list[KernelEvent]) -> None:
        self.starts = [k.host_start for k in kernels]
        self.gpu = [0]
        self.flops = [0]
        for k in kernels:
            self.gpu.append(self.gpu[-1] + (k.gpu_dur or 0))
            self.flops.append(self.flops[-1] + (k.flops if k.gpu_dur else 0))

    def within(self, start: int, end: int) -> tuple[int, int, int]:
        """(kernels, GPU ns, FLOPs of timed kernels) recorded in [start, end]."""
        a = bisect.bisect_left(self.starts, start)
        b = bisect.bisect_right(self.starts, end)
        return b - a, self.gpu[b] - self.gpu[a], self.flops[b] - self.flops[a]


@dataclass
class EventAverage:
    """One row of ``key_averages()``: every event of one name and kind. Times in microseconds."""

    key: str
    kind: str  # "kernel", or a host range's category
    count: int = 0
    gpu_time_total: float = 0.0  # kernels: their own; host ranges: the kernels recorded inside them
    host_time_total: float = 0.0
    flops: int = 0  # of the kernels whose GPU time is known
    gpu_count: int = 0  # events whose GPU time is known

    @property
    def gpu_time_avg(self) -> float:
        """GPU time per timed call (0.0 when none was timed)."""
        return self.gpu_time_total / self.gpu_count if self.gpu_count else 0.0

    @property
    def host_time_avg(self) -> float:
        """Host time per call (0.0 with no calls)."""
        return self.host_time_total / self.count if self.count else 0.0

    @property
    def gflops(self) -> float | None:
        """GFLOP/s over the GPU time (None where FLOPs or GPU times are unknown)."""
        return self.flops / (self.gpu_time_total * 1e3) if self.flops and self.gpu_time_total else None


_SORT_KEYS = {"gpu_time_total": "gpu_time_total", "gpu_time_avg": "gpu_time_avg",
              "host_time_total": "host_time_total", "host_time_avg": "host_time_avg", "count": "count",
              "calls": "count", "flops": "flops",
              # torch.profiler's names for the same columns
              "cuda_time_total": "gpu_time_total", "self_cuda_time_total": "gpu_time_total",
              "device_time_total": "gpu_time_total", "self_device_time_total": "gpu_time_total",
              "cuda_time": "gpu_time_avg", "cpu_time_total": "host_time_total",
              "self_cpu_time_total": "host_time_total", "cpu_time": "host_time_avg"}


class EventList(list):
    """``key_averages()``: a list of EventAverage, printable with ``table``."""

    def __init__(self, rows: list[EventAverage], notes: list[str], gpu_total: float) -> None:
        super().__init__(rows)
        self.notes = notes
        self.gpu_total = gpu_total  # microseconds of all timed kernels: what "GPU %" divides by

    def table(self, sort_by: str = "gpu_time_total", row_limit: int = 100, max_name_column_width: int = 60) -> str:
        """The rows as text, largest ``sort_by`` first, at most ``row_limit`` of them (-1: all).

        Arguments:
            sort_by: a column: gpu_time_total, gpu_time_avg, host_time_total, host_time_avg, count,
                flops (torch's cuda_time_total and cpu_time_total are accepted too).
            row_limit: how many rows to show.
            max_name_column_width: names longer than this are cut.
        """
        attr = _SORT_KEYS.get(sort_by)
        if attr is None:
            raise ValueError(f"table: cannot sort by {sort_by!r}; choose one of {sorted(_SORT_KEYS)}")
        rows = sorted(self, key=lambda r: getattr(r, attr), reverse=True)
        if row_limit >= 0:
            rows = rows[:row_limit]
        width = max([4] + [min(len(r.key), max_name_column_width) for r in rows])
        head = (f"{'Name':<{width}}  {'Kind':<10}  {'Calls':>6}  {'GPU total':>10}  {'GPU avg':>10}  "
                f"{'GPU %':>6}  {'Host total':>10}  {'Host avg':>10}  {'GFLOP/s':>8}")
        rule = "-" * len(head)
        lines = [*self.notes, rule, head, rule]
        for r in rows:
            name = r.key if len(r.key) <= width else r.key[:width - 3] + "..."
            timed = r.gpu_count > 0
            share = f"{100 * r.gpu_time_total / self.gpu_total:.1f}%" if timed and self.gpu_total else "-"
            gflops = f"{r.gflops:.2f}" if r.gflops is not None else "-"
            lines.append(f"{name:<{width}}  {r.kind:<10}  {r.count:>6}  "
                         f"{_us(r.gpu_time_total) if timed else '-':>10}  {_us(r.gpu_time_avg) if timed else '-':>10}  "
                         f"{share:>6}  {_us(r.host_time_total):>10}  {_us(r.host_time_avg):>10}  {gflops:>8}")
        lines.append(rule)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _us(t: float) -> str:
    """A duration in microseconds as torch's tables print it."""
    if t >= 1e6:
        return f"{t / 1e6:.3f}s"
    if t >= 1e3:
        return f"{t / 1e3:.3f}ms"
    return f"{t:.3f}us"


def key_averages(res: Results) -> EventList:
    rows: dict[tuple[str, str], EventAverage] = {}
    for k in res.kernels:
        row = rows.get((k.name, "kernel")) or rows.setdefault((k.name, "kernel"), EventAverage(k.name, "kernel"))
        row.count += 1
        row.host_time_total += k.host_dur / 1e3
        if k.gpu_dur is not None:
            row.gpu_count += 1
            row.gpu_time_total += k.gpu_dur / 1e3
            row.flops += k.flops
    per_thread: dict[int, list[KernelEvent]] = {}
    for k in res.kernels:
        per_thread.setdefault(k.thread, []).append(k)
    sums = {th: _ThreadKernels(ks) for th, ks in per_thread.items()}
    for r in res.ranges:
        row = rows.get((r.name, r.cat)) or rows.setdefault((r.name, r.cat), EventAverage(r.name, r.cat))
        row.count += 1
        row.host_time_total += r.dur / 1e3
        inside = sums.get(r.thread)
        if inside is not None:
            n, gpu, flops = inside.within(r.start, r.start + r.dur)
            if n:
                row.gpu_count += 1
                row.gpu_time_total += gpu / 1e3
                row.flops += flops
    gpu_total = sum(k.gpu_dur for k in res.kernels if k.gpu_dur is not None) / 1e3
    return EventList(list(rows.values()), notes(res, gpu_total), gpu_total)


def notes(res: Results, gpu_total: float) -> list[str]:
    """The table's header: how GPU time was measured on each device, the wall time, the phases."""
    out = [f"wgpar profile: {len(res.kernels)} dispatches on {len(res.devices)} device(s), "
           f"wall time {_us(res.wall / 1e3)}, GPU time {_us(gpu_total)}"]
    for d in res.devices:
        if d.timed:
            how = ("two around every dispatch" if res.timing == "exact" else
                   "one between consecutive dispatches (each kernel's launch gap included)")
            out.append(f"  {d.name}: GPU time from timestamp queries, {how}")
        else:
            out.append(f"  {d.name}: GPU time NOT measured (the device lacks {', '.join(d.missing)}); "
                       "host recording and submit times only")
    if gpu_total:
        by_phase: dict[str, float] = {}
        for k in res.kernels:
            if k.gpu_dur is not None:
                by_phase[k.phase] = by_phase.get(k.phase, 0.0) + k.gpu_dur / 1e3
        out.append("  GPU time by phase: " + ", ".join(
            f"{p} {_us(t)} ({100 * t / gpu_total:.1f}%)" for p, t in sorted(by_phase.items(), key=lambda x: -x[1])))
    return out
