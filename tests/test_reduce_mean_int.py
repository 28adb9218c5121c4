"""all_reduce / reduce_scatter with op "mean" on an integer tensor raise a TypeError that says what to do
(all-reduce with "sum" and divide, or reduce a float copy), before any communication: the group stays
usable. ProcessGroup.all_reduce's docstring says so."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.distributed import ProcessGroup, run_spmd

pytestmark = pytest.mark.multidevice


def _program(group, op: str, collective: str):
    t = wgpar.tensor(np.arange(4, dtype=np.int32) + group.rank, device=group.device)
    try:
        getattr(group, collective)(t, op)
    except TypeError as exc:
        msg = str(exc)
    else:
        msg = None
    total = group.all_reduce(t, "sum").numpy()  # the group still works
    return msg, total


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("op", ["mean", "avg"])
def test_mean_of_int32_says_what_to_do(collective, op):
    for rank, (msg, total) in enumerate(run_spmd(_program, 2, backend="threads", args=(op, collective), timeout=60)):
        assert msg is not None, f"rank {rank}: no TypeError"
        for words in ("int32", "'mean'", "'sum'", "world_size", "float", f"rank {rank}"):
            assert words in msg, (words, msg)
        np.testing.assert_array_equal(total, 2 * np.arange(4) + 1)


def test_all_reduce_docstring_says_it():
    doc = ProcessGroup.all_reduce.__doc__
    assert '"mean" needs a float tensor' in doc and "integer" in doc and '"sum"' in doc
