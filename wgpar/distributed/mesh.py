"""DeviceMesh: a group's ranks laid out on a grid with named dims, and this rank's sub-group along each.

Every combination of strategies cuts one group the same way: HYBRID_SHARD (replicate x shard),
stages x data parallel (data x pipeline) and tensor x data parallel (data x tensor). The mesh is
that cut, once, in the shape of ``torch.distributed.DeviceMesh``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .group import ProcessGroup


class DeviceMesh:
    """The ranks of ``group`` on a grid of ``mesh_shape``, rank r at the row-major coordinate of r
    (the last dim varies fastest, so its sub-groups are consecutive ranks: put the dim that talks most
    there, e.g. tensor parallelism).

    Constructing it is a collective: every rank of ``group`` constructs the same mesh, which makes
    every sub-group with ``group.split`` (dim by dim, in the same order on every rank); the sub-groups
    are then kept for the mesh's life. Unlike torch, ``mesh[name]`` gives the ProcessGroup itself
    (wgpar has no device-type-level mesh objects to slice).

    Arguments:
        group: the ranks to lay out.
        mesh_shape: ranks per dim; the product must be ``group.world_size``.
        mesh_dim_names: one distinct name per dim (dims are addressed by index otherwise).
    """

    def __init__(self, group: ProcessGroup, mesh_shape: Sequence[int], *,
                 mesh_dim_names: Sequence[str] | None = None) -> None:
        shape = tuple(mesh_shape) if isinstance(mesh_shape, Sequence) else None
        if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
            raise ValueError(f"DeviceMesh: mesh_shape must be a sequence of positive ints, got {mesh_shape!r}")
        if int(np.prod(shape)) != group.world_size:
            raise ValueError(f"DeviceMesh: mesh_shape {shape} holds {int(np.prod(shape))} ranks, but the group has "
                             f"{group.world_size}")
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        if names is not None and (len(names) != len(shape) or len(set(names)) != len(names)
                                  or not all(isinstance(n, str) for n in names)):
            raise ValueError(f"DeviceMesh: mesh_dim_names must be {len(shape)} distinct strings for mesh_shape "
                             f"{shape}, got {mesh_dim_names!r}")
        self.group = group
        self.mesh_shape = shape
        self.mesh_dim_names = names
        self.mesh = np.arange(group.world_size).reshape(shape)
        self._coordinate = tuple(int(c) for c in np.unravel_index(group.rank, shape))
        self._groups = [self._split_dim(d) for d in range(len(shape))]

    def _split_dim(self, d: int) -> ProcessGroup:
        """This rank's sub-group along dim ``d``: the ranks whose coordinates differ only in ``d``."""
        mine = None
        for line in np.moveaxis(self.mesh, d, -1).reshape(-1, self.mesh_shape[d]):
            sub = self.group.split(line.tolist())
            mine = sub if sub is not None else mine
        return mine

    def _dim(self, dim: str | int | None) -> int:
        if dim is None:
            if self.ndim != 1:
                raise ValueError(f"DeviceMesh of {self.ndim} dims: name the dim ({self._describe()})")
            return 0
        if isinstance(dim, str):
            if self.mesh_dim_names is None or dim not in self.mesh_dim_names:
                raise KeyError(f"DeviceMesh has no dim {dim!r} ({self._describe()})")
            return self.mesh_dim_names.index(dim)
        if isinstance(dim, bool) or not isinstance(dim, int) or not -self.ndim <= dim < self.ndim:
            raise KeyError(f"DeviceMesh has no dim {dim!r} ({self._describe()})")
        return dim % self.ndim

    def _describe(self) -> str:
        names = self.mesh_dim_names or tuple(range(self.ndim))
        return "dims " + ", ".join(f"{n}={s}" for n, s in zip(names, self.mesh_shape))

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.mesh_shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """Ranks per dim (``mesh_shape``)."""
        return self.mesh_shape

    def get_group(self, mesh_dim: str | int | None = None) -> ProcessGroup:
        """This rank's sub-group along ``mesh_dim`` (a name or an index; may be left out on a 1-D mesh)."""
        return self._groups[self._dim(mesh_dim)]

    def __getitem__(self, mesh_dim: str | int) -> ProcessGroup:
        return self._groups[self._dim(mesh_dim)]

    def get_local_rank(self, mesh_dim: str | int | None = None) -> int:
        """This rank's coordinate along ``mesh_dim`` (its rank in that dim's sub-group)."""
        return self._coordinate[self._dim(mesh_dim)]

    def get_coordinate(self) -> tuple[int, ...]:
        """This rank's coordinate in every dim."""
        return self._coordinate

    def size(self, mesh_dim: str | int | None = None) -> int:
        """Ranks along ``mesh_dim``, or in the whole mesh when None."""
        return self.group.world_size if mesh_dim is None else self.mesh_shape[self._dim(mesh_dim)]

    def __repr__(self) -> str:
        return f"DeviceMesh({self._describe()}, rank {self.group.rank} at {self._coordinate})"
