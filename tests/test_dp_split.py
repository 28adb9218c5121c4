"""How DataParallel and FSDP split a call's arguments over the ranks: as torch's DataParallel, every
tensor or array is split along dim 0, which must be the batch size (the first argument's dim 0);
anything else is refused with an error naming the argument, its shape and the batch size."""

from __future__ import annotations

import re

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.distributed import FSDP, DataParallel, MultiAdapterContext
from wgpar.nn import functional as F

pytestmark = pytest.mark.multidevice


class Scaled(nn.Module):
    """lin(x) * w: w has one row per sample."""

    def __init__(self, device=0) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 3, device=device)

    def forward(self, x, w, shift=0.0):
        return self.lin(x) * w + shift


def _state(rng):
    return {"lin.weight": rng.standard_normal((3, 5)).astype(np.float32),
            "lin.bias": rng.standard_normal(3).astype(np.float32)}


def _model(state):
    m = Scaled()
    m.load_state_dict(state)
    return m


WRAPPERS = {"dp": DataParallel, "fsdp": FSDP}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_batch_shaped_arguments_are_split_alike(wrapper, rng):
    state = _state(rng)
    X = rng.standard_normal((7, 5)).astype(np.float32)
    W = rng.standard_normal((7, 1)).astype(np.float32)
    want = _model(state)(wgpar.tensor(X), wgpar.tensor(W), 0.5).numpy()
    with MultiAdapterContext(2, timeout=60) as ctx:
        wrapped = WRAPPERS[wrapper](_model(state), ctx)
        outs = wrapped(X, wgpar.tensor(W), 0.5)  # an array, a tensor and a Python value
        got = np.concatenate([o.numpy() for o in outs])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("shape", [(6, 1), (1, 1), ()], ids=["longer", "one-row", "0-d"])
def test_an_argument_that_is_not_batch_shaped_is_refused(wrapper, shape, rng):
    state = _state(rng)
    X = rng.standard_normal((4, 5)).astype(np.float32)
    table = rng.standard_normal(shape).astype(np.float32)
    name = WRAPPERS[wrapper].__name__
    bad = re.escape(f"of shape {tuple(shape)}") + ".*batch of 4 rows"
    with MultiAdapterContext(2, timeout=60) as ctx:
        wrapped = WRAPPERS[wrapper](_model(state), ctx)
        with pytest.raises(ValueError, match=rf"{name}: argument 1 {bad}"):
            wrapped(X, table)
        with pytest.raises(ValueError, match=rf"{name}: argument 1 {bad}"):
            wrapped(X, wgpar.tensor(table))
        outs = wrapped(X, np.ones((4, 1), np.float32))
        with pytest.raises(ValueError, match=rf"{name}.loss: target 0 {bad}"):
            wrapped.loss(F.mse_loss, outs, table)
        opts = wrapped.optimizers(lambda ps: wgpar.optim.SGD(ps, lr=0.1))
        with pytest.raises(ValueError, match=rf"{name}.train_step: target {bad}"):
            wrapped.train_step(X, table, F.mse_loss, opts)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_the_batch_must_be_a_tensor_or_array(wrapper, rng):
    with MultiAdapterContext(2, timeout=60) as ctx:
        wrapped = WRAPPERS[wrapper](_model(_state(rng)), ctx)
        with pytest.raises(TypeError, match="the first argument is the batch"):
            wrapped([[1.0] * 5] * 4, np.ones((4, 1), np.float32))
        with pytest.raises(TypeError, match="the first argument is the batch"):
            wrapped(wgpar.tensor(1.0), np.ones((4, 1), np.float32))
