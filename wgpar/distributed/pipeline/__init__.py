"""Pipeline parallelism: stages on their own ranks, schedules as data, one tape per micro-batch.

``schedules``: schedules as per-rank action lists (GPipe, 1F1B, interleaved 1F1B, ZB-H1, or a
user's), validated before they run, with their bubble, peak activations and a text timeline.
"""

from .schedules import Action, Schedule, ScheduleError, build, gpipe, interleaved_1f1b, one_f_one_b, zero_bubble

__all__ = ["Schedule", "Action", "ScheduleError", "gpipe", "one_f_one_b", "interleaved_1f1b", "zero_bubble", "build"]
