"""Stages x data parallel: cutting one group into pipelines and the replica groups of each stage."""

from __future__ import annotations

from ..group import ProcessGroup
from ..mesh import DeviceMesh


def pipeline_mesh(group: ProcessGroup, pipeline_size: int) -> tuple[ProcessGroup, ProcessGroup]:
    """Split ``group`` into ``world_size / pipeline_size`` replicas of a pipeline of ``pipeline_size`` ranks.

    Rank r is pipeline rank ``r % pipeline_size`` of replica ``r // pipeline_size``. Returns this
    rank's pipeline group (to run a PipelineSchedule on) and its data-parallel group (the ranks that
    hold the same stages in the other replicas: PipelineSchedule's ``dp_group``): the dims of a
    ``DeviceMesh(group, (replicas, pipeline_size), mesh_dim_names=("data", "pipeline"))``. Every rank
    of ``group`` must call it, with the same size.

    Arguments:
        group: the whole group.
        pipeline_size: ranks per pipeline; must divide the group's size.
    """
    world = group.world_size
    if isinstance(pipeline_size, bool) or not isinstance(pipeline_size, int) or pipeline_size < 1 or \
            world % pipeline_size:
        raise ValueError(f"pipeline_mesh: pipeline_size must divide the group's {world} ranks, got {pipeline_size!r}")
    mesh = DeviceMesh(group, (world // pipeline_size, pipeline_size), mesh_dim_names=("data", "pipeline"))
    return mesh["pipeline"], mesh["data"]
