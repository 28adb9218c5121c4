"""A 2-D grid of ranks, tensor x data: tensor parallelism inside a row, data parallelism across rows."""

from __future__ import annotations

from typing import NamedTuple

from ..group import ProcessGroup
from ..mesh import DeviceMesh


class GridGroups(NamedTuple):
    """This rank's two sub-groups: ``tensor`` (the ranks sharing its model's layers), ``data`` (the ranks
    holding the same slices, each on its own part of the batch)."""

    tensor: ProcessGroup
    data: ProcessGroup


def tensor_data_grid(group: ProcessGroup, tensor_parallel_size: int) -> GridGroups:
    """Split ``group`` into a grid: rank ``d * tensor_parallel_size + t`` is tensor rank t of data row d.

    Tensor groups are consecutive ranks (on one host they exchange activations every layer), data
    groups every ``tensor_parallel_size``-th rank (they exchange gradients once a step): the dims of a
    ``DeviceMesh(group, (data_size, tensor_parallel_size), mesh_dim_names=("data", "tensor"))``. Every
    rank of ``group`` calls it (each ``split`` is a collective).

    Arguments:
        group: the whole group (world size a multiple of ``tensor_parallel_size``).
        tensor_parallel_size: ranks per tensor-parallel group.
    """
    world, tp = group.world_size, tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or world % tp:
        raise ValueError(f"tensor_data_grid: tensor_parallel_size {tp!r} does not divide the group's {world} ranks")
    mesh = DeviceMesh(group, (world // tp, tp), mesh_dim_names=("data", "tensor"))
    return GridGroups(mesh["tensor"], mesh["data"])
