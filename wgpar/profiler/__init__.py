"""See where time goes, shaped like torch.profiler.

    with wgpar.profiler.profile() as prof:
        with wgpar.profiler.record_function("step"):
            ...
    print(prof.key_averages().table(sort_by="gpu_time_total", row_limit=20))
    prof.export_chrome_trace("trace.json")  # opens in Perfetto / chrome://tracing

Every dispatch on every device is timed on the GPU with timestamp queries (where the adapter has
``timestamp-query-inside-passes``; elsewhere the table says the GPU times are missing), with its
kernel's label, workgroup grid, FLOPs and bytes where the op knows them, and its host recording
time. Backward passes, optimizer steps, ``record_function`` ranges, collectives and host transfers
are host ranges on their thread's track. See docs/design.md, "Profiling".
"""

from __future__ import annotations

from .events import DeviceInfo, EventAverage, EventList, KernelEvent, RangeEvent
from .profile import profile, record_function

__all__ = ["profile", "record_function", "EventList", "EventAverage", "KernelEvent", "RangeEvent", "DeviceInfo"]
