"""PyTorch's CUDA spellings (``t.cuda()``, ``t.to("cuda")``, ``model.cuda()``) raise an error saying wgpar
has no CUDA device and how to choose an adapter, never an AttributeError."""

from __future__ import annotations

import pytest

import wgpar
from wgpar import nn

CALLS = {
    "Tensor.cuda()": lambda t, m: t.cuda(),
    "Tensor.cuda(1)": lambda t, m: t.cuda(1),
    "Tensor.to('cuda')": lambda t, m: t.to("cuda"),
    "Tensor.to('cuda:0')": lambda t, m: t.to("cuda:0"),
    "Module.cuda()": lambda t, m: m.cuda(),
    "Module.to('cuda')": lambda t, m: m.to("cuda"),
    "ones(device='cuda')": lambda t, m: wgpar.ones(2, device="cuda"),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_cuda_raises_naming_how_to_choose_an_adapter(call):
    with pytest.raises(ValueError) as info:
        CALLS[call](wgpar.ones(2), nn.Linear(2, 2))
    msg = str(info.value)
    assert "CUDA" in msg and "wgpar.device(" in msg and "WGPAR_ADAPTER" in msg, msg
