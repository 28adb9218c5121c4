"""``profile`` (start, stop, results), ``record_function``, and the Chrome trace export."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..runtime import profiling
from .events import EventList, KernelEvent, RangeEvent, Results, build, key_averages

F = TypeVar("F", bound=Callable[..., Any])


class profile:
    """Record every dispatch, host range, collective and transfer while the block runs.

    One profile runs at a time per process (it sees every thread and device of the process); under
    MPI each process profiles itself and writes its own trace. Stopping submits what is pending,
    waits for the devices and reads the GPU timestamps back once.

    Arguments:
        timing: how dispatches are timed on the GPU. ``"kernels"`` (the default): consecutive
            dispatches of a compute pass share a timestamp, so a kernel's GPU time includes its launch
            and the barrier before it (the GPU's idle time is what lies between submits); about 3.5%
            on the GPT-2 step on an H100. ``"exact"``: two timestamps of its own around each dispatch,
            so the gaps between kernels show as idle time; about twice the cost (docs/profiling.md).
    """

    def __init__(self, timing: str = "kernels") -> None:
        if timing not in profiling.TIMINGS:
            raise ValueError(f"profile(timing={timing!r}): expected one of {', '.join(map(repr, profiling.TIMINGS))}")
        self.timing = timing
        self._rec: profiling.Recorder | None = None
        self._results: Results | None = None

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start recording (what entering the ``with`` block does), as ``torch.profiler.profile.start``."""
        rec = profiling.Recorder(self.timing)
        rec.start()
        self._rec, self._results = rec, None

    def stop(self) -> None:
        """Stop recording and build the results (what leaving the ``with`` block does); RuntimeError without
        ``start``."""
        if self._rec is None:
            raise RuntimeError("profile.stop() without start()")
        self._rec.stop()
        self._results = build(self._rec)

    @property
    def results(self) -> Results:
        """The recorded events and device info once the profile stopped; RuntimeError while it runs or before it ran."""
        if self._results is None:
            raise RuntimeError("the profile is still running (or never ran): results exist once it stopped")
        return self._results

    def kernels(self) -> list[KernelEvent]:
        """Every dispatch, in recording order."""
        return list(self.results.kernels)

    def ranges(self) -> list[RangeEvent]:
        """Every host range (record_function, phases, collectives, transfers, submits), by start time."""
        return list(self.results.ranges)

    def key_averages(self) -> EventList:
        """One row per kernel label and per host range name, like torch's ``key_averages()``."""
        return key_averages(self.results)

    def export_chrome_trace(self, path: str | os.PathLike) -> None:
        """Write the Chrome trace JSON (Perfetto, chrome://tracing): a process per device (its GPU
        timeline) and one for the host, with a track per thread."""
        Path(path).write_text(json.dumps(chrome_trace(self.results)))


class record_function:
    """A named host range, as a context manager or a decorator (``torch.profiler.record_function``).

    Kernels recorded inside it count towards its GPU time in ``key_averages()``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._open: list[Any] = []  # a stack: the same object may be entered again inside itself

    def __enter__(self) -> record_function:
        s = profiling.span(self.name)
        s.__enter__()
        self._open.append(s)
        return self

    def __exit__(self, *exc) -> None:
        self._open.pop().__exit__(*exc)

    def __call__(self, fn: F) -> F:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with profiling.span(name):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


_HOST_PID = 0


def chrome_trace(res: Results) -> dict[str, Any]:
    """The events as Chrome trace JSON: complete events ("X", microseconds) and metadata naming tracks."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _HOST_PID, "tid": 0, "args": {"name": f"host (pid {os.getpid()})"}},
        {"name": "process_sort_index", "ph": "M", "pid": _HOST_PID, "tid": 0, "args": {"sort_index": 0}},
    ]
    tids: dict[int, int] = {}
    firsts = sorted([(r.start, r.thread) for r in res.ranges] + [(k.host_start, k.thread) for k in res.kernels])
    for _, th in firsts:
        if th not in tids:
            tids[th] = len(tids) + 1
            events.append({"name": "thread_name", "ph": "M", "pid": _HOST_PID, "tid": tids[th],
                           "args": {"name": res.threads.get(th, f"thread {th}")}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": _HOST_PID, "tid": tids[th],
                           "args": {"sort_index": tids[th]}})
    gpu_pid = {}
    for d in res.devices:
        pid = gpu_pid[d.index] = d.index + 1
        label = f"GPU {d.name}" if d.timed else f"GPU {d.name} (not timed: lacks {', '.join(d.missing)})"
        events += [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}},
                   {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
                   {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"name": "kernels" if d.timed else "submits (host time)"}}]
    for r in res.ranges:
        events.append(_x(r.name, r.cat, r.start, r.dur, _HOST_PID, tids[r.thread], r.args))
        if r.cat == "submit" and not _timed(res, r.args["device"]):
            events.append(_x(r.name, r.cat, r.start, r.dur, gpu_pid[r.args["device"]], 0, r.args))
    for k in res.kernels:
        grid = "x".join(map(str, k.grid))
        events.append(_x(k.name, "dispatch", k.host_start, k.host_dur, _HOST_PID, tids[k.thread],
                         {"device": k.device, "grid": grid}))
        if k.gpu_start is not None:
            args: dict[str, Any] = {"grid": grid, "phase": k.phase, "thread": res.threads.get(k.thread, k.thread)}
            if k.flops:
                args["flops"] = k.flops
                args["GFLOP/s"] = round(k.flops / max(k.gpu_dur, 1), 3)
            if k.nbytes:
                args["bytes"] = k.nbytes
            events.append(_x(k.name, "kernel", k.gpu_start, k.gpu_dur, gpu_pid[k.device], 0, args))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _timed(res: Results, device: int) -> bool:
    return any(d.timed for d in res.devices if d.index == device)


def _x(name: str, cat: str, start_ns: int, dur_ns: int, pid: int, tid: int, args: dict) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "ts": start_ns / 1e3, "dur": dur_ns / 1e3, "pid": pid, "tid": tid,
            "args": {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in args.items()}}
