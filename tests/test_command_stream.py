"""The command stream: recovery from a failed submit."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .helpers import assert_close


# -- a failed submit ---------------------------------------------------------------------------
def _record_invalid_copy(d):
    """Record a copy that reads past a buffer's end: wgpu rejects it only at encoder.finish()."""
    src = wgpar.ones(4, device=d)
    dst = wgpar.zeros(4, device=d)
    d.copy(src._storage.buffer, src._storage.buffer.size, dst._storage.buffer, 0, 4)


def test_a_failed_submit_leaves_the_device_usable(rng):
    d = wgpar.device(8)  # its own device: the failure discards whatever else was recorded on it
    x = rng.standard_normal((33, 7)).astype(np.float32)
    t = wgpar.tensor(x, device=d)
    lost = t * 2  # recorded, not yet submitted: goes down with the failed batch
    _record_invalid_copy(d)
    with pytest.raises(wgpar.WgparError) as info:
        (t + 1).numpy()
    msg = str(info.value)
    assert str(d) in msg and "discarded" in msg and "stays usable" in msg
    del lost
    # the device goes on: ops, small and large uploads (the upload ring), readbacks, synchronize
    assert_close((t * 3 - 1).numpy(), x * 3 - 1)
    big = rng.standard_normal(400_000).astype(np.float32)  # 1.6 MB: through the upload ring
    assert_close(wgpar.tensor(big, device=d).sum().item(), big.sum(dtype=np.float64), rtol=1e-4, atol=1e-2)
    d.synchronize()
    # a failure in the middle of a large upload leaves the ring usable too
    _record_invalid_copy(d)
    with pytest.raises(wgpar.WgparError):
        wgpar.tensor(big, device=d)
    assert_close(wgpar.tensor(big * 2, device=d).numpy(), big * 2)
    assert d._pending == 0 or d._encoder is not None
