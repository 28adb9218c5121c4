"""cross_entropy of an empty batch (a data-parallel rank's empty share): torch's results, NaN for the
mean, 0 for the sum, an empty tensor for none, and an empty gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("target_kind", ["array", "tensor"])
def test_empty_batch_gives_torchs_loss_and_gradient(reduction, target_kind):
    x = wgpar.tensor(np.zeros((0, 5), np.float32), requires_grad=True)
    target = np.zeros((0,), np.int32)
    loss = F.cross_entropy(x, wgpar.tensor(target) if target_kind == "tensor" else target, reduction=reduction)
    if reduction == "none":
        assert loss.shape == (0,)
        loss.sum().backward()
    else:
        assert loss.shape == ()
        value = loss.item()
        assert math.isnan(value) if reduction == "mean" else value == 0.0
        loss.backward()
    assert x.grad.shape == (0, 5)


def test_empty_batch_through_the_module_and_nll_loss():
    x = wgpar.tensor(np.zeros((0, 3), np.float32), requires_grad=True)
    assert math.isnan(nn.CrossEntropyLoss()(x, np.zeros((0,), np.int32)).item())
    assert F.nll_loss(F.log_softmax(x, 1), np.zeros((0,), np.int32), reduction="sum").item() == 0.0


def test_matches_torch(torch):
    for reduction in ("mean", "sum"):
        want = torch.nn.functional.cross_entropy(torch.empty(0, 4), torch.empty(0, dtype=torch.long),
                                                 reduction=reduction).item()
        got = F.cross_entropy(wgpar.tensor(np.zeros((0, 4), np.float32)), np.zeros(0, np.int32),
                              reduction=reduction).item()
        assert (math.isnan(got) and math.isnan(want)) or got == want
