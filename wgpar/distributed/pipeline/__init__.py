"""Pipeline parallelism: stages on their own ranks, schedules as data, one tape per micro-batch.

``schedules``: schedules as per-rank action lists (GPipe, 1F1B, interleaved 1F1B, ZB-H1, or a
user's), validated before they run, with their bubble, peak activations and a text timeline.
``stage``: PipelineStage and ``split_module``. ``runtime``: one rank's execution of a step over its
ProcessGroup's send / recv. ``api``: PipelineSchedule, the per-rank (SPMD) object with ``step``.
``mesh``: stages x data parallel. PipelineExecutor, the single-controller form, is in
single_controller/. Nothing here touches a backend: the same code runs on any ProcessGroup.
"""

from .api import PipelineSchedule
from .errors import PipelineAbortedError, PipelineError, PipelineShapeError, PipelineStageError
from .mesh import pipeline_mesh
from .runtime import TraceEntry
from .schedules import Action, Schedule, ScheduleError, build, gpipe, interleaved_1f1b, one_f_one_b, zero_bubble
from .stage import PipelineStage, split_module

__all__ = ["PipelineSchedule", "PipelineExecutor", "PipelineStage", "split_module", "pipeline_mesh", "Schedule",
           "Action", "ScheduleError", "gpipe", "one_f_one_b", "interleaved_1f1b", "zero_bubble", "build",
           "TraceEntry", "PipelineError", "PipelineStageError", "PipelineAbortedError", "PipelineShapeError"]


def __getattr__(name: str):
    # PipelineExecutor lives in single_controller/, which imports this package: loaded on first use.
    if name == "PipelineExecutor":
        from ..single_controller.pipeline import PipelineExecutor

        return PipelineExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
