"""Stages x data parallel: cutting one group into pipelines and the replica groups of each stage."""

from __future__ import annotations

from ..group import ProcessGroup


def pipeline_mesh(group: ProcessGroup, pipeline_size: int) -> tuple[ProcessGroup, ProcessGroup]:
    """Split ``group`` into ``world_size / pipeline_size`` replicas of a pipeline of ``pipeline_size`` ranks.

    Rank r is pipeline rank ``r % pipeline_size`` of replica ``r // pipeline_size``. Returns this
    rank's pipeline group (to run a PipelineSchedule on) and its data-parallel group (the ranks that
    hold the same stages in the other replicas: PipelineSchedule's ``dp_group``). Every rank of
    ``group`` must call it, with the same size.

    Arguments:
        group: the whole group.
        pipeline_size: ranks per pipeline; must divide the group's size.
    """
    world = group.world_size
    if isinstance(pipeline_size, bool) or not isinstance(pipeline_size, int) or pipeline_size < 1 or \
            world % pipeline_size:
        raise ValueError(f"pipeline_mesh: pipeline_size must divide the group's {world} ranks, got {pipeline_size!r}")
    replicas = world // pipeline_size
    pipe = dp = None
    for k in range(replicas):  # every rank splits every sub-group, in the same order
        sub = group.split(range(k * pipeline_size, (k + 1) * pipeline_size))
        pipe = sub if sub is not None else pipe
    for s in range(pipeline_size):
        sub = group.split(range(s, world, pipeline_size))
        dp = sub if sub is not None else dp
    return pipe, dp
