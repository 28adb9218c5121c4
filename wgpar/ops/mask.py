"""Boolean masks: nonzero's positions (stream compaction on the device) and, for mask reads and writes,
the running count of the selected entries, through which they gather."""

from __future__ import annotations

from .. import dtypes as _dt
from ..runtime.kernels import WORKGROUP, Kernel, grid
from ..tensor import Tensor
from .elementwise import cast, contiguous
from .scan import scan
from .shape import view

_COMPACT = Kernel("compact", "out: w, mask: r, pos: r", "total: u32, off_m: u32")


def running_count(mask: Tensor) -> Tensor:
    """The inclusive running count of the set entries of a 1-d bool ``mask`` (int32)."""
    return scan("sum", cast(mask, _dt.int32), 0)


def flat_nonzero(mask: Tensor) -> Tensor:
    """The positions of the set entries of a 1-d bool ``mask``, in order, as int32, known to lie in
    [0, mask.numel()) (so index ops need not read them back). Reads the count back (4 bytes: the
    result's size depends on it), so it waits for the device."""
    total = mask.numel()
    if total == 0:
        return Tensor.empty((0,), _dt.int32, mask.device)
    mask = contiguous(mask)
    pos = running_count(mask)
    count = int(view(pos, (1,), (1,), pos._offset + total - 1).numpy()[0])
    out = Tensor.empty((count,), _dt.int32, mask.device)
    if count:
        dev = mask.device
        dev.dispatch(_COMPACT.spec(("i32", "i32", "i32")),
                     [out._storage.buffer, mask._storage.buffer, pos._storage.buffer],
                     _COMPACT.pack(total=total, off_m=mask._offset), grid(-(-total // WORKGROUP), dev.max_workgroups))
        out._host_range = (0, total - 1)
    return out
