"""BatchNorm1d / BatchNorm2d: batch statistics, running statistics and every gradient against NumPy
float64 and PyTorch, in training and eval mode, with and without affine and running statistics."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

from . import gradcheck
from .helpers import assert_close, record_dispatches


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


@pytest.fixture
def kernel_calls(monkeypatch):
    """The kernel families dispatched, in order (cleared by the test as it goes)."""
    return record_dispatches(monkeypatch)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_step_takes_few_dispatches(momentum, rng, kernel_calls, torch):
    """Per layer, a training forward is two dispatches, the batch counter's increment and the running
    statistics' update (the cumulative average's 1 / batches too) inside them; its backward two, an
    evaluation forward one (were five, fifteen with momentum=None, three and two: the counter, the
    coefficients and the cumulative factor each took kernels of their own). Awkward sizes, several
    chunks per channel, against torch."""
    calls = kernel_calls
    x = rng.standard_normal((5, 3, 61, 67)).astype(np.float32) * 2 + 1
    gy = rng.standard_normal(x.shape).astype(np.float32)
    ours, theirs = nn.BatchNorm2d(3, momentum=momentum), torch.nn.BatchNorm2d(3, momentum=momentum)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor([0.5, -1.5, 2.0]))
        theirs.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
        theirs.running_mean.copy_(torch.tensor([0.3, -0.2, 1.0]))
        theirs.num_batches_tracked.fill_(4)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    xw, xt = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    calls.clear()
    y = ours(xw)
    assert calls == ["batch_norm_sums", "batch_norm_apply"], calls
    calls.clear()
    y.backward(wgpar.tensor(gy))
    assert calls == ["batch_norm_sums", "batch_norm_apply"], calls  # the fresh .grads are its own buffers
    yt = theirs(xt)
    yt.backward(torch.tensor(gy))
    assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert_close(xw.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert_close(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-4, atol=1e-3)
    assert_close(ours.bias.grad.numpy(), theirs.bias.grad.numpy(), rtol=1e-4, atol=1e-3)
    for name in ("running_mean", "running_var"):
        assert_close(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=1e-5, atol=1e-6)
    assert int(ours.num_batches_tracked.item()) == 5
    ours.eval()
    calls.clear()
    with wgpar.no_grad():
        y = ours(wgpar.tensor(x))
    assert calls == ["batch_norm_apply"], calls
    assert_close(y.numpy(), theirs.eval()(xt).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls, shape", [("BatchNorm2d", (3, 5, 7, 9)), ("BatchNorm1d", (6, 5)),
                                        ("BatchNorm1d", (3, 5, 11))], ids=str)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("track", [True, False])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_every_configuration_matches_torch(cls, shape, affine, track, momentum, rng, torch):
    """Output, running statistics, num_batches_tracked and the input, weight and bias gradients over
    train and eval steps, for every combination of affine, track_running_stats and momentum (None: the
    cumulative average, its 1 / batches now computed in the kernel), C = 5 (not a multiple of 4)."""
    c = shape[1]
    ours = getattr(nn, cls)(c, momentum=momentum, affine=affine, track_running_stats=track)
    theirs = getattr(torch.nn, cls)(c, momentum=momentum, affine=affine, track_running_stats=track)
    if affine:
        with torch.no_grad():
            theirs.weight.copy_(torch.tensor(rng.standard_normal(c).astype(np.float32)))
            theirs.bias.copy_(torch.tensor(rng.standard_normal(c).astype(np.float32)))
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    for step, train in enumerate((True, True, False, True)):
        ours.train(train)
        theirs.train(train)
        x = (rng.standard_normal(shape) * (1 + step) - step).astype(np.float32)
        gy = rng.standard_normal(shape).astype(np.float32)
        xo, xt = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        y, yt = ours(xo), theirs(xt)
        y.backward(wgpar.tensor(gy))
        yt.backward(torch.tensor(gy))
        what = f"step {step} ({'train' if train else 'eval'})"
        assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-5, what=f"{what} output")
        assert_close(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4, what=f"{what} input grad")
        if affine:
            for name in ("weight", "bias"):
                assert_close(getattr(ours, name).grad.numpy(), getattr(theirs, name).grad.numpy(), rtol=1e-4,
                             atol=1e-4, what=f"{what} {name} grad")
        if track:
            for name in ("running_mean", "running_var"):
                assert_close(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=1e-5, atol=1e-6,
                             what=f"{what} {name}")
            assert ours.num_batches_tracked.dtype is wgpar.int32
            assert int(ours.num_batches_tracked.item()) == int(theirs.num_batches_tracked)


def test_chunks_far_apart_combine_accurately(rng):
    """Sorted values: every chunk of a channel has its own mean (the chunks are combined about their
    weighted mean, each chunk's own deviations from it added), far from zero with a small spread."""
    n = 60000
    x = np.sort(1000.0 + rng.standard_normal((n, 2)) * 0.5, axis=0).astype(np.float32)
    bn = nn.BatchNorm1d(2, momentum=None)
    y = bn(wgpar.tensor(x)).numpy()
    x64 = x.astype(np.float64)
    assert_close(y, (x64 - x64.mean(0)) / np.sqrt(x64.var(0) + 1e-5), rtol=1e-5, atol=1e-5)
    assert_close(bn.running_mean.numpy(), x64.mean(0), rtol=1e-6, atol=0)
    assert_close(bn.running_var.numpy(), x64.var(0, ddof=1), rtol=1e-5, atol=0)


def test_strided_running_statistics_and_a_momentum_tensor_match_torch(rng, torch):
    """Running statistics that are strided views are updated through their strides (no copies), and a
    one-element momentum tensor is read on the device."""
    x = rng.standard_normal((4, 5, 3)).astype(np.float32) * 3 + 2
    w = rng.standard_normal(10).astype(np.float32)
    rm, rv = wgpar.tensor(np.arange(10, dtype=np.float32)), wgpar.tensor(np.full(10, 2.0, np.float32))
    trm, trv = torch.arange(10.0), torch.full((10,), 2.0)
    y = F.batch_norm(wgpar.tensor(x), rm[::2], rv[1::2], wgpar.tensor(w)[::2], training=True,
                     momentum=wgpar.tensor([0.25]))
    yt = torch.nn.functional.batch_norm(torch.tensor(x), trm[::2], trv[1::2], torch.tensor(w)[::2], training=True,
                                        momentum=0.25)
    assert_close(y.numpy(), yt.numpy(), rtol=1e-4, atol=1e-5)
    assert_close(rm.numpy(), trm.numpy(), rtol=1e-5, atol=1e-6)
    assert_close(rv.numpy(), trv.numpy(), rtol=1e-5, atol=1e-6)


def test_running_statistics_sharing_a_buffer(rng, torch):
    """Running statistics that are views of one buffer are updated in training, and in evaluation they may
    share it with the weight and bias (bound read-only there: a writable binding may not alias another)."""
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    buf, tbuf = wgpar.tensor(np.array([0, 0, 0, 1, 1, 1], np.float32)), torch.tensor([0.0, 0, 0, 1, 1, 1])
    F.batch_norm(wgpar.tensor(x), buf[:3], buf[3:], training=True)
    torch.nn.functional.batch_norm(torch.tensor(x), tbuf[:3], tbuf[3:], training=True)
    assert_close(buf.numpy(), tbuf.numpy())
    y = F.batch_norm(wgpar.tensor(x), buf[:3], buf[3:], buf[3:], buf[:3])
    yt = torch.nn.functional.batch_norm(torch.tensor(x), tbuf[:3], tbuf[3:], tbuf[3:], tbuf[:3])
    assert_close(y.numpy(), yt.numpy(), rtol=1e-5, atol=1e-6)


def test_empty_batch_in_eval_mode(torch):
    """No samples in evaluation: an empty output, an empty input gradient and zero parameter gradients
    (the backward divided by the zero count before)."""
    ours, theirs = nn.BatchNorm2d(3).eval(), torch.nn.BatchNorm2d(3).eval()
    x, xt = wgpar.zeros(0, 3, 4, 4, requires_grad=True), torch.zeros(0, 3, 4, 4, requires_grad=True)
    ours(x).sum().backward()
    theirs(xt).sum().backward()
    assert x.grad.shape == (0, 3, 4, 4)
    assert_close(ours.weight.grad.numpy(), theirs.weight.grad.numpy())
    assert_close(ours.bias.grad.numpy(), theirs.bias.grad.numpy())


def test_float16_input_under_autocast_matches_torch(rng, dev, torch):
    """A float16 activation (a convolution's under autocast) with float32 parameters: float16 output and
    input gradient, float32 statistics and parameter gradients, computed in float32 throughout."""
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    x = (rng.standard_normal((3, 5, 7, 9)) * 2 + 1).astype(np.float16)
    gy = rng.standard_normal(x.shape).astype(np.float16)
    ours, theirs = nn.BatchNorm2d(5), torch.nn.BatchNorm2d(5)
    xo, xt = wgpar.tensor(x, dtype=wgpar.float16, requires_grad=True), torch.tensor(x, dtype=torch.float32,
                                                                                    requires_grad=True)
    with wgpar.autocast(dtype=wgpar.float16):
        y = ours(xo)
    yt = theirs(xt)
    assert y.dtype is wgpar.float16
    y.backward(wgpar.tensor(gy, dtype=wgpar.float16))
    yt.backward(torch.tensor(gy, dtype=torch.float32))
    assert xo.grad.dtype is wgpar.float16 and ours.weight.grad.dtype is wgpar.float32
    assert_close(y.numpy().astype(np.float32), yt.detach().numpy(), rtol=2e-3, atol=2e-3)
    assert_close(xo.grad.numpy().astype(np.float32), xt.grad.numpy(), rtol=2e-3, atol=2e-3)
    assert_close(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-4, atol=1e-3)
    assert_close(ours.bias.grad.numpy(), theirs.bias.grad.numpy(), rtol=1e-4, atol=1e-3)
    assert_close(ours.running_var.numpy(), theirs.running_var.detach().numpy(), rtol=1e-5, atol=1e-6)


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
    assert int(bn.num_batches_tracked.item()) == 1
    x64 = x.astype(np.float64)  # the float16 running statistics move in the kernel, rounded once
    assert_close(bn.running_mean.numpy(), 0.1 * x64.mean((0, 2, 3)), rtol=1e-3, atol=1e-4)
    assert_close(bn.running_var.numpy(), 0.9 + 0.1 * x64.var((0, 2, 3), ddof=1), rtol=1e-3, atol=1e-3)
    y.sum().backward()
    assert bn.weight.grad.dtype is bn.bias.grad.dtype is wgpar.float16
    assert_close(bn.bias.grad.numpy(), np.full(3, 36.0))


@pytest.mark.parametrize("call, error, match", [
    (lambda: nn.BatchNorm2d(3)(wgpar.zeros(1, 3, 1, 1)), ValueError, r"more than 1 value per channel"),
    (lambda: nn.BatchNorm2d(3)(wgpar.zeros(2, 3, 4)), ValueError, r"expected 4D input"),
    (lambda: nn.BatchNorm1d(3)(wgpar.zeros(2, 3, 4, 4)), ValueError, r"expected 2D or 3D input"),
    (lambda: nn.BatchNorm1d(4)(wgpar.zeros(2, 3)), ValueError, r"running_mean of shape \(4,\).*3 channels"),
    (lambda: F.batch_norm(wgpar.zeros(2, 3), None, None), ValueError, r"running_mean and running_var"),
    (lambda: F.batch_norm(wgpar.zeros(2, 3, dtype=wgpar.int32), None, None, training=True), TypeError, r"float"),
    (lambda: F.batch_norm(wgpar.zeros(2, 3), None, None, training=True, momentum=None), TypeError, r"momentum"),
    (lambda: F.batch_norm(wgpar.zeros(2, 3), wgpar.zeros(3), wgpar.ones(3), training=True, momentum=wgpar.zeros(2)),
     ValueError, r"one element"),
])
def test_bad_inputs_raise_clearly(call, error, match):
    with pytest.raises(error, match=match):
        call()
