"""DeviceMesh: sub-groups per named dim on thread ranks, collectives along each dim against NumPy, and the
strategies' grids (HYBRID_SHARD, stages x data, tensor x data) as its users."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.distributed import DeviceMesh, ThreadGroup, pipeline_mesh, run_spmd, tensor_data_grid
from wgpar.distributed.fsdp import hybrid_groups

MESHES = [
    ((2, 2), ("dp", "tp")),
    ((4, 1), ("dp", "tp")),
    ((2, 1, 2), ("a", "b", "c")),
    ((2, 3), ("dp", "tp")),
    ((3, 2), ("pp", "tp")),
    ((6,), ("dp",)),
]


def _line(shape: tuple[int, ...], rank: int, d: int) -> list[int]:
    """The ranks whose coordinates equal ``rank``'s in every dim but ``d``, in order along ``d``."""
    grid = np.arange(int(np.prod(shape))).reshape(shape)
    index = list(np.unravel_index(rank, shape))
    index[d] = slice(None)
    return grid[tuple(index)].tolist()


@pytest.mark.parametrize("shape,names", MESHES, ids=["x".join(map(str, s)) for s, _ in MESHES])
def test_each_dim_gives_this_ranks_line_and_a_collective_sums_over_it(shape, names, rng):
    world = int(np.prod(shape))
    n = 37  # an awkward length
    data = rng.standard_normal((world, n)).astype(np.float32)

    def fn(g):
        mesh = DeviceMesh(g, shape, mesh_dim_names=names)
        assert mesh.get_coordinate() == tuple(int(c) for c in np.unravel_index(g.rank, shape))
        assert mesh.size() == world and mesh.ndim == len(shape)
        sums = {}
        for d, name in enumerate(names):
            sub = mesh[name]
            assert sub is mesh.get_group(name) is mesh.get_group(d)  # made once
            assert list(sub.ranks) == _line(shape, g.rank, d)
            assert sub.rank == mesh.get_local_rank(name) and sub.world_size == mesh.size(name) == shape[d]
            t = wgpar.tensor(data[g.rank], device=g.device)
            sub.all_reduce(t)
            sums[name] = t.numpy()
        return sums

    out = run_spmd(fn, world, timeout=60)
    for r in range(world):
        for d, name in enumerate(names):
            want = data.astype(np.float64)[_line(shape, r, d)].sum(axis=0)
            np.testing.assert_allclose(out[r][name], want, rtol=1e-5, atol=1e-5, err_msg=f"rank {r} dim {name}")


def test_the_strategies_grids_are_mesh_dims():
    def fn(g):
        shard, rep = hybrid_groups(g, 3)
        assert hybrid_groups(g, 3) == (shard, rep)  # made once per group and size
        pipe, dp = pipeline_mesh(g, 2)
        grid = tensor_data_grid(g, 3)
        return [list(x.ranks) for x in (shard, rep, pipe, dp, grid.tensor, grid.data)]

    for r, (shard, rep, pipe, dp, tp, data) in enumerate(run_spmd(fn, 6, timeout=60)):
        assert shard == tp == _line((2, 3), r, 1) and rep == data == _line((2, 3), r, 0)
        assert pipe == _line((3, 2), r, 1) and dp == _line((3, 2), r, 0)


def test_bad_meshes_and_dims_raise(dev):
    tg = ThreadGroup([dev], timeout=30)
    try:
        g = tg.rank(0)
        with pytest.raises(ValueError, match=r"mesh_shape \(2, 1\) holds 2 ranks, but the group has 1"):
            DeviceMesh(g, (2, 1))
        with pytest.raises(ValueError, match="positive ints"):
            DeviceMesh(g, (0,))
        with pytest.raises(ValueError, match="2 distinct strings"):
            DeviceMesh(g, (1, 1), mesh_dim_names=("x", "x"))
        mesh = DeviceMesh(g, (1, 1), mesh_dim_names=("dp", "tp"))
        with pytest.raises(KeyError, match="no dim 'pp' .*dims dp=1, tp=1"):
            mesh["pp"]
        with pytest.raises(ValueError, match="name the dim"):
            mesh.get_group()
        assert DeviceMesh(g, (1,)).get_group() is not None  # a 1-D mesh needs no name
    finally:
        tg.close()
