"""BatchNorm1d / BatchNorm2d: batch statistics, running statistics and every gradient against NumPy
float64 and PyTorch, in training and eval mode, with and without affine and running statistics."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

from . import gradcheck
from .helpers import assert_close


def bn_ref(x, w, b, eps=1e-5):
    """Training-mode batch norm in float64 over every dim but 1."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = [1, -1] + [1] * (x.ndim - 2)
    mean = x.mean(axes, keepdims=True)
    var = x.var(axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w.reshape(shape) + b.reshape(shape)


@pytest.mark.parametrize("shape", [(7, 3), (5, 3, 11), (3, 5, 4, 7)], ids=str)
def test_training_forward_and_gradients_match_finite_differences(shape, rng):
    x = rng.standard_normal(shape) * 2 + 1.5
    c = shape[1]
    w, b = rng.standard_normal(c), rng.standard_normal(c)
    gradcheck.check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), bn_ref, [x, w, b], rng,
                    rtol=5e-3, atol=5e-4)


@pytest.mark.parametrize("cls, shape", [("BatchNorm1d", (9, 5)), ("BatchNorm1d", (4, 5, 13)),
                                        ("BatchNorm2d", (3, 5, 6, 7))])
@pytest.mark.parametrize("momentum", [0.1, 0.35, None])
def test_modules_match_torch_over_train_and_eval_steps(cls, shape, momentum, rng, torch):
    ours, theirs = getattr(nn, cls)(5, momentum=momentum), getattr(torch.nn, cls)(5, momentum=momentum)
    w, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    ours.load_state_dict({"weight": w, "bias": b, "running_mean": np.zeros(5, np.float32),
                          "running_var": np.ones(5, np.float32), "num_batches_tracked": np.array(0)})
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(w))
        theirs.bias.copy_(torch.tensor(b))
    for step, train in enumerate((True, True, False, True, False)):
        ours.train(train)
        theirs.train(train)
        x = (rng.standard_normal(shape) * (1 + step) + step).astype(np.float32)
        xo, xt = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        y, yt = ours(xo), theirs(xt)
        assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-5, what=f"step {step} output")
        gy = rng.standard_normal(shape).astype(np.float32)
        y.backward(wgpar.tensor(gy))
        yt.backward(torch.tensor(gy))
        assert_close(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4, what=f"step {step} input grad")
        for name in ("running_mean", "running_var"):
            assert_close(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=1e-5, atol=1e-6,
                         what=f"step {step} {name}")
        assert int(ours.num_batches_tracked.item()) == int(theirs.num_batches_tracked)
    assert_close(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert_close(ours.bias.grad.numpy(), theirs.bias.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert list(ours.state_dict()) == list(theirs.state_dict())


@pytest.mark.parametrize("affine, track", [(False, True), (True, False), (False, False)])
def test_without_affine_or_running_stats_matches_torch(affine, track, rng, torch):
    ours = nn.BatchNorm2d(3, affine=affine, track_running_stats=track)
    theirs = torch.nn.BatchNorm2d(3, affine=affine, track_running_stats=track)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    for train in (True, False):  # without running statistics, eval mode normalises with the batch's too
        ours.train(train)
        theirs.train(train)
        x = rng.standard_normal((4, 3, 5, 2)).astype(np.float32) * 3
        xo, xt = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        y, yt = ours(xo), theirs(xt)
        assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-5)
        (y * y).sum().backward()
        (yt * yt).sum().backward()
        assert_close(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_statistics_stay_accurate_far_from_zero(rng):
    """A large mean over a small spread: the two-pass variance keeps it (x^2 - mean^2 would cancel), and
    the float32 mean's rounding is taken out (torch 2.x's CPU kernel is off by about 1e-3 here)."""
    x = (1000.0 + rng.standard_normal((64, 2, 50)) * 0.01).astype(np.float32)
    y = F.batch_norm(wgpar.tensor(x), None, None, training=True).numpy()
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean((0, 2), keepdims=True)) / np.sqrt(x64.var((0, 2), keepdims=True) + 1e-5)
    assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_long_channels_split_into_chunks(rng):
    """More than one workgroup per channel (the partial sums added up) gives the same statistics."""
    x = rng.standard_normal((3, 2, 50000)).astype(np.float32) + 3.0
    bn = nn.BatchNorm1d(2)
    y = bn(wgpar.tensor(x)).numpy()
    assert_close(y, bn_ref(x.astype(np.float64), np.ones(2), np.zeros(2)), rtol=1e-4, atol=1e-4)
    assert_close(bn.running_mean.numpy(), 0.1 * x.mean((0, 2)), rtol=1e-5, atol=1e-6)
    assert_close(bn.running_var.numpy(), 0.9 + 0.1 * x.var((0, 2), ddof=1), rtol=1e-5, atol=1e-5)


def test_training_step_takes_few_dispatches(rng, monkeypatch, torch):
    """A training forward is four dispatches (two statistics passes, the coefficients with the running
    statistics' update, the output) and its backward three (was about 25 and 15: one small op per
    per-channel formula); awkward sizes, several parts per channel, against torch."""
    from wgpar.runtime.device import Device

    calls = []
    real = Device.dispatch
    monkeypatch.setattr(Device, "dispatch", lambda self, k, *a, **kw: (calls.append(k.family), real(self, k, *a, **kw)))
    x = rng.standard_normal((5, 3, 61, 67)).astype(np.float32) * 2 + 1
    gy = rng.standard_normal(x.shape).astype(np.float32)
    ours, theirs = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor([0.5, -1.5, 2.0]))
        theirs.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    xw, xt = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    calls.clear()
    y = ours(xw)  # and num_batches_tracked += 1
    assert calls[-4:] == ["batch_norm_sums", "batch_norm_sums", "batch_norm_finalize", "batch_norm_apply"], calls
    assert len(calls) == 5, calls
    calls.clear()
    y.backward(wgpar.tensor(gy))
    assert calls[:3] == ["batch_norm_sums", "batch_norm_finalize", "batch_norm_apply"], calls  # then the .grads
    yt = theirs(xt)
    yt.backward(torch.tensor(gy))
    assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert_close(xw.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert_close(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-4, atol=1e-3)
    assert_close(ours.bias.grad.numpy(), theirs.bias.grad.numpy(), rtol=1e-4, atol=1e-3)
    for name in ("running_mean", "running_var"):
        assert_close(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=1e-5, atol=1e-6)


def test_nan_spreads_through_its_channel_only(rng):
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    x[2, 1, 3] = np.nan
    y = nn.BatchNorm1d(3)(wgpar.tensor(x)).numpy()
    assert np.isnan(y[:, 1]).all() and not np.isnan(y[:, [0, 2]]).any()


def test_half_module_keeps_the_batch_counter_an_integer(rng, dev):
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    bn = nn.BatchNorm2d(3).half()
    assert bn.weight.dtype is bn.running_mean.dtype is wgpar.float16
    assert bn.num_batches_tracked.dtype is wgpar.int32
    x = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    y = bn(wgpar.tensor(x, dtype=wgpar.float16))
    assert y.dtype is wgpar.float16
    assert_close(y.numpy(), bn_ref(x.astype(np.float64), np.ones(3), np.zeros(3)), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("call, error, match", [
    (lambda: nn.BatchNorm2d(3)(wgpar.zeros(1, 3, 1, 1)), ValueError, r"more than 1 value per channel"),
    (lambda: nn.BatchNorm2d(3)(wgpar.zeros(2, 3, 4)), ValueError, r"expected 4D input"),
    (lambda: nn.BatchNorm1d(3)(wgpar.zeros(2, 3, 4, 4)), ValueError, r"expected 2D or 3D input"),
    (lambda: nn.BatchNorm1d(4)(wgpar.zeros(2, 3)), ValueError, r"running_mean of shape \(4,\).*3 channels"),
    (lambda: F.batch_norm(wgpar.zeros(2, 3), None, None), ValueError, r"running_mean and running_var"),
    (lambda: F.batch_norm(wgpar.zeros(2, 3, dtype=wgpar.int32), None, None, training=True), TypeError, r"float"),
])
def test_bad_inputs_raise_clearly(call, error, match):
    with pytest.raises(error, match=match):
        call()
