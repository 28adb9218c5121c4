"""MaxPool2d / AvgPool2d: forward against NumPy float64 and PyTorch, gradients against finite
differences and PyTorch, NaN propagation and the indices as torch picks them."""

from __future__ import annotations

import re

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

from . import gradcheck
from .helpers import assert_close


def windows(x, k, s, p, d, fill):
    """[N, C, oh, ow, kh * kw] windows of x padded with ``fill`` (no ceil_mode), in float64."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k, s, p, d
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh = (x.shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (x.shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    taps = [xp[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            for i in range(kh) for j in range(kw)]
    return np.stack(taps, -1)


# (shape, kernel, stride, padding, dilation)
CASES = [
    ((2, 3, 7, 9), (3, 3), (2, 2), (1, 1), (1, 1)),
    ((1, 5, 8, 6), (2, 3), (1, 2), (0, 1), (2, 1)),
    ((3, 2, 5, 5), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((2, 1, 9, 4), (4, 1), (3, 1), (2, 0), (1, 1)),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_max_pool2d_forward_matches_numpy(case, rng):
    shape, k, s, p, d = case
    x = rng.standard_normal(shape).astype(np.float32)
    got = F.max_pool2d(wgpar.tensor(x), k, s, p, d).numpy()
    assert_close(got, windows(x, k, s, p, d, -np.inf).max(-1), rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES[:3], ids=str)
def test_avg_pool2d_forward_matches_numpy(case, rng):
    shape, k, s, p, _ = case
    x = rng.standard_normal(shape).astype(np.float32)
    got = F.avg_pool2d(wgpar.tensor(x), k, s, p).numpy()  # count_include_pad: always kh * kw here
    assert_close(got, windows(x, k, s, p, (1, 1), 0.0).mean(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,k,s,p", [((2, 3, 5, 13), (2, 3), (1, 2), (1, 1)),
                                         ((1, 4, 6, 11), (3, 3), (1, 1), (1, 0)),
                                         ((3, 2, 4, 1), (2, 1), (2, 1), (0, 0)),
                                         ((1, 2, 93, 95), (91, 91), (1, 1), (0, 0))], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_avg_pool2d_forward_rows_of_any_width(shape, k, s, p, dtype, rng):
    """Rows of 1, 5, 7 and 9 outputs (the index arithmetic splits a flat output index into plane, row
    and column), and a 91x91 window, in float32 and float16, against float64 NumPy."""
    x = rng.standard_normal(shape).astype(dtype)
    got = F.avg_pool2d(wgpar.tensor(x), k, s, p).numpy()
    want = windows(x, k, s, p, (1, 1), 0.0).mean(-1)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    assert_close(got.astype(np.float64), want, rtol=tol, atol=tol)


def _np_avg_pool(x, k, s, p, ceil_mode=False, include_pad=True, divisor=None):
    """torch's avg_pool2d in float64 by loops: windows clipped to the padded input (the divisor with
    count_include_pad) or to the input, ceil_mode's last window starting inside the input."""
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    n, c, h, w = x.shape

    def size(n_in, kk, ss, pp):
        span = n_in + 2 * pp - kk
        out = (-(-span // ss) if ceil_mode else span // ss) + 1
        return out - 1 if ceil_mode and (out - 1) * ss >= n_in + pp else out

    oh, ow = size(h, kh, sh, ph), size(w, kw, sw, pw)
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * sh - ph, j * sw - pw
            h1, w1 = min(h0 + kh, h + ph), min(w0 + kw, w + pw)
            total = x[:, :, max(h0, 0):min(h1, h), max(w0, 0):min(w1, w)].astype(np.float64).sum((2, 3))
            count = (h1 - h0) * (w1 - w0) if include_pad else (min(h1, h) - max(h0, 0)) * (min(w1, w) - max(w0, 0))
            out[:, :, i, j] = total / (divisor or count)
    return out


def _window_kernels(monkeypatch, family: str = "avg_pool2d") -> list[str]:
    """The WINDOW constant of every ``family`` kernel dispatched from now on ("true": the window forward)."""
    from wgpar.runtime.device import Device

    seen: list[str] = []
    real = Device.dispatch

    def dispatch(self, k, *a, **kw):
        if k.family == family:
            seen.append(re.search(r"const WINDOW: bool = (\w+);", dict(k.fills)["AT"])[1])
        return real(self, k, *a, **kw)

    monkeypatch.setattr(Device, "dispatch", dispatch)
    return seen


@pytest.mark.parametrize("k,s,p,ceil_mode,include_pad,divisor", [
    ((2, 2), (2, 2), (0, 0), False, True, None),   # every window inside: the window's size divides
    ((3, 3), (2, 2), (1, 1), False, True, None),   # padding counted
    ((3, 2), (2, 1), (1, 1), True, False, None),   # padding not counted, ceil_mode's last window
    ((2, 3), (3, 2), (0, 0), True, True, None),    # ceil_mode without padding: a window leaves the input
    ((3, 3), (1, 1), (0, 0), False, True, 5),      # divisor_override, windows inside
    ((8, 8), (3, 3), (2, 2), False, False, None),  # 64 taps: the most the window forward writes out
    ((9, 9), (2, 2), (4, 4), True, False, 7),      # 81 taps: the general kernel
], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_avg_pool2d_forward_of_every_window_kind_against_numpy(k, s, p, ceil_mode, include_pad, divisor, dtype,
                                                               monkeypatch, rng):
    """The window forward (taps written out, planes on the grid's y and z) and the general kernel past
    WINDOW_TAPS, with and without padding, ceil_mode, count_include_pad and divisor_override, on planes of
    awkward sizes, against float64 loops."""
    x = rng.standard_normal((2, 3, 19, 23)).astype(dtype)
    kinds = _window_kernels(monkeypatch)
    got = F.avg_pool2d(wgpar.tensor(x), k, s, p, ceil_mode, include_pad, divisor).numpy()
    want = _np_avg_pool(x, k, s, p, ceil_mode, include_pad, divisor)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    assert_close(got.astype(np.float64), want, rtol=tol, atol=tol)
    assert kinds == ["true" if k[0] * k[1] <= 64 else "false"]


def test_avg_pool2d_window_forward_finds_every_position_of_large_planes(monkeypatch, rng):
    """A 1x1 window with column stride 2 picks every other column, so every output equal to its column
    proves the row and column of each position exact: a plane of 1046 x 4007 positions (just under 2^22;
    at 4007 columns a row taken as floor(position * (1 / 4007)) is one short at 930 positions), a single
    column, and a plane past 2^22 positions (the general kernel)."""
    kinds = _window_kernels(monkeypatch)
    for shape in [(1, 1, 1046, 8013), (2, 3, 4093, 1), (1, 1, 2049, 4097)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(F.avg_pool2d(wgpar.tensor(x), 1, (1, 2)).numpy(), x[..., ::2])
    assert kinds == ["true", "true", "false"]


@pytest.mark.parametrize("shape,k,s", [((4, 60, 6, 7), 2, 1), ((1, 9, 66, 66), 2, 2), ((2, 5, 3, 3), 3, 1)], ids=str)
def test_avg_pool2d_window_forward_on_a_small_grid(shape, k, s, dev, monkeypatch, rng):
    """Rows of planes past the grid's y continue on z (the device allows 6 workgroups a dimension here):
    34 planes of 30 positions a workgroup row, then one plane of 1089 positions a row over 5 workgroups,
    and planes of one position."""
    monkeypatch.setattr(dev, "max_workgroups", 6)
    kinds = _window_kernels(monkeypatch)
    x = rng.standard_normal(shape).astype(np.float32)
    got = F.avg_pool2d(wgpar.tensor(x, device=dev), k, s).numpy()
    assert_close(got.astype(np.float64), _np_avg_pool(x, (k, k), (s, s), (0, 0)), rtol=1e-6, atol=1e-6)
    assert kinds == ["true"]


@pytest.mark.parametrize("k,s,p,d,ceil_mode", [
    ((2, 2), (2, 2), (0, 0), (1, 1), False),   # every window inside
    ((3, 3), (2, 2), (1, 1), (1, 1), False),   # padding
    ((2, 3), (1, 2), (1, 1), (2, 1), True),    # dilation, ceil_mode's last window
    ((3, 2), (3, 1), (0, 0), (2, 3), True),    # ceil_mode without padding, dilated
    ((8, 8), (3, 3), (4, 4), (1, 1), False),   # 64 taps: the most the window forward writes out
    ((9, 9), (2, 2), (4, 4), (1, 1), True),    # 81 taps: the general kernel
], ids=str)
def test_max_pool2d_forward_of_every_window_kind_against_numpy(k, s, p, d, ceil_mode, monkeypatch, rng):
    """The window forward and the general kernel past WINDOW_TAPS, values and indices, with NaNs, ties and
    -inf rows (torch's picks: a later tap wins if larger or NaN, the first tap inside when all are -inf),
    against the loop that states the rule."""
    x = np.round(rng.standard_normal((2, 3, 19, 23)), 1).astype(np.float32)  # rounded: ties
    x[0, 1, 3, 4] = np.nan
    x[1, 2, 5:8, 5:8] = np.nan
    x[1, 0, :, :9] = -np.inf
    kinds = _window_kernels(monkeypatch, "max_pool2d")
    got, idx = F.max_pool2d(wgpar.tensor(x), k, s, p, d, ceil_mode, return_indices=True)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k, s, p, d
    n, c, h, w = x.shape
    oh, ow = got.shape[2:]
    want, want_idx = np.full(got.shape, -np.inf, np.float32), np.full(got.shape, -1, np.int64)
    for i in range(oh):
        for j in range(ow):
            for a in range(kh):
                for b in range(kw):
                    r, col = i * sh - ph + a * dh, j * sw - pw + b * dw
                    if not (0 <= r < h and 0 <= col < w):
                        continue
                    v, best = x[:, :, r, col], want[:, :, i, j]
                    take = (want_idx[:, :, i, j] < 0) | np.isnan(v) | (~np.isnan(best) & (v > best))
                    want[:, :, i, j] = np.where(take, v, best)
                    want_idx[:, :, i, j] = np.where(take, r * w + col, want_idx[:, :, i, j])
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    assert kinds == ["true" if kh * kw <= 64 else "false"]


def test_pool_gradients_match_finite_differences(rng):
    x = rng.permutation(60).reshape(1, 3, 4, 5) / 7.0  # distinct values: max has a gradient everywhere
    gradcheck.check(lambda t: F.max_pool2d(t, (2, 3), (1, 2), (1, 1)),
                    lambda a: windows(a, (2, 3), (1, 2), (1, 1), (1, 1), -np.inf).max(-1), [x], rng)
    gradcheck.check(lambda t: F.avg_pool2d(t, 3, 2, 1),
                    lambda a: windows(a, (3, 3), (2, 2), (1, 1), (1, 1), 0.0).mean(-1), [x], rng)


MAX_KWARGS = [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3), stride=(1, 2), dilation=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, ceil_mode=True, padding=1),
    dict(kernel_size=2),
]


@pytest.mark.parametrize("kwargs", MAX_KWARGS, ids=str)
def test_max_pool2d_matches_torch_with_nan_and_ties(kwargs, rng, torch):
    x = np.round(rng.standard_normal((2, 3, 9, 8)), 1).astype(np.float32)  # rounded: ties
    x[0, 1, 2, 3] = np.nan
    x[1, 2, 4:6, 4:6] = np.nan  # several NaNs in one window: the last one gets the gradient
    x[1, 0, :, :3] = -np.inf
    ours, theirs = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, idx = F.max_pool2d(ours, **kwargs, return_indices=True)
    yt, idxt = torch.nn.functional.max_pool2d(theirs, **kwargs, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), yt.detach().numpy())  # NaN where torch has NaN
    np.testing.assert_array_equal(idx.numpy(), idxt.numpy())
    gy = rng.standard_normal(yt.shape).astype(np.float32)
    y.backward(wgpar.tensor(gy))
    yt.backward(torch.tensor(gy))
    assert_close(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), ceil_mode=True, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(3, 2), divisor_override=5),
], ids=str)
def test_avg_pool2d_matches_torch(kwargs, rng, torch):
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    ours, theirs = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = F.avg_pool2d(ours, **kwargs)
    yt = torch.nn.functional.avg_pool2d(theirs, **kwargs)
    assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    gy = rng.standard_normal(yt.shape).astype(np.float32)
    y.backward(wgpar.tensor(gy))
    yt.backward(torch.tensor(gy))
    assert_close(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_pool_layers_and_unbatched_input(rng):
    x = rng.standard_normal((3, 6, 7)).astype(np.float32)
    mp = nn.MaxPool2d(2)
    assert mp.stride == 2 and mp(wgpar.tensor(x)).shape == (3, 3, 3)
    assert_close(mp(wgpar.tensor(x)).numpy(), windows(x[None], (2, 2), (2, 2), (0, 0), (1, 1), -np.inf).max(-1)[0])
    out, idx = nn.MaxPool2d(3, 1, 1, return_indices=True)(wgpar.tensor(x[None]))
    assert out.shape == idx.shape == (1, 3, 6, 7) and idx.dtype is wgpar.int32
    ap = nn.AvgPool2d((2, 3), stride=1)
    assert ap(wgpar.tensor(x[None])).shape == (1, 3, 5, 5)


@pytest.mark.parametrize("call, match", [
    (lambda x: F.max_pool2d(x, 2, padding=2), r"padding 2 is more than half"),
    (lambda x: F.avg_pool2d(x, 3, padding=2), r"padding 2 is more than half"),
    (lambda x: F.max_pool2d(x, 9), r"smaller than the 9x9 kernel"),
    (lambda x: F.max_pool2d(x.reshape(2, 3, 5, 5, 1), 2), r"\[N, C, H, W\] or \[C, H, W\]"),
    (lambda x: F.avg_pool2d(x, 2, divisor_override=0), r"divisor_override must be a positive int"),
    (lambda x: F.max_pool2d(x, 0), r"kernel_size must be >= 1"),
])
def test_pool_bad_arguments_raise_clearly(call, match):
    with pytest.raises(ValueError, match=match):
        call(wgpar.zeros(2, 3, 5, 5))
    with pytest.raises(TypeError, match=r"kernel_size must be an int or a pair"):
        F.max_pool2d(wgpar.zeros(1, 1, 4, 4), 2.5)


def test_windows_remembered_by_their_arguments_still_check_them(rng, torch):
    """A layer's window is remembered by its arguments (ops/window.py), so a later call skips the checks:
    a bool that equals a remembered int must still be refused, a list still works, and the padding check
    that follows still runs for a remembered window."""
    from wgpar.ops import window as window_mod

    a = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    x = wgpar.tensor(a)
    want = torch.nn.functional.avg_pool2d(torch.tensor(a), (1, 2)).numpy()
    for kernel in ((1, 2), (1, 2), [1, 2]):  # the second from memory, the list checked afresh
        assert_close(F.avg_pool2d(x, kernel).numpy(), want)
    assert any(k[1] == (1, 2) for k in window_mod._SEEN)
    for bad in ((True, 2), (1, False)):
        with pytest.raises(TypeError, match=r"kernel_size must be an int or a pair"):
            F.avg_pool2d(x, bad)
    F.max_pool2d(x, 3, padding=1)
    with pytest.raises(ValueError, match=r"padding 2 is more than half"):
        F.max_pool2d(x, 3, padding=2)


@pytest.mark.parametrize("shape,out_hw", [((2, 3, 7, 10), (3, 4)), ((3, 5, 7, 7), (1, 1)), ((2, 4, 13, 11), (1, 1)),
                                          ((2, 2, 5, 9), (5, 4)), ((1, 2, 4, 6), (6, 9)), ((2, 3, 3, 2), (7, 5)),
                                          ((1, 3, 1, 1), (2, 3)), ((2, 2, 9, 5), (2, 1))], ids=str)
def test_adaptive_avg_pool2d_matches_torch(shape, out_hw, rng, torch):
    """The kernel (and the plane mean for 1x1) against torch, forward and input gradient, down and upsampling."""
    x = rng.standard_normal(shape).astype(np.float32)
    ours, theirs = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = F.adaptive_avg_pool2d(ours, out_hw)
    yt = torch.nn.functional.adaptive_avg_pool2d(theirs, out_hw)
    assert_close(y.numpy(), yt.detach().numpy(), 1e-6, 1e-6)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(wgpar.tensor(gy))
    yt.backward(torch.tensor(gy))
    assert_close(ours.grad.numpy(), theirs.grad.numpy(), 1e-6, 1e-6)


# Input gradients against torch where the backward kernels' index arithmetic is easiest to get wrong:
# sizes not multiples of 4 (and 1xN), overlapping windows, stride > kernel, padding, dilation, ceil_mode.
# (shape, kwargs shared by max and avg pooling)
GRAD_CASES = [
    ((2, 3, 13, 7), dict(kernel_size=3, stride=1, padding=1)),
    ((2, 3, 13, 7), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 2, 13, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((2, 2, 13, 7), dict(kernel_size=2, stride=3)),
    ((1, 3, 11, 10), dict(kernel_size=(3, 2), stride=(2, 5), padding=(1, 1), ceil_mode=True)),
    ((1, 2, 1, 9), dict(kernel_size=(1, 3), stride=1, padding=(0, 1))),
    ((1, 2, 1, 13), dict(kernel_size=(1, 4), stride=(1, 3), padding=(0, 2), ceil_mode=True)),
    ((2, 2, 7, 1), dict(kernel_size=(2, 1), stride=(1, 1))),
    ((1, 2, 6, 18), dict(kernel_size=5, stride=(1, 2), padding=2)),
]
MAX_ONLY = [
    ((2, 2, 13, 7), dict(kernel_size=3, stride=2, padding=1, dilation=2)),
    ((1, 3, 9, 14), dict(kernel_size=(2, 3), stride=1, dilation=(3, 2), ceil_mode=True)),
    ((1, 2, 10, 11), dict(kernel_size=2, stride=3, padding=1, dilation=2, ceil_mode=True)),
]


def _grad_pair(x, fn, torch_fn, torch, dtype, transpose, rng):
    """(ours, torch's) input gradient of fn(x) for a random output gradient; ``transpose``: both the input
    and the output gradient are transposed views (not contiguous)."""
    xs = np.swapaxes(x, 2, 3).copy() if transpose else x
    ours = wgpar.tensor(xs, dtype=dtype, requires_grad=True)
    theirs = torch.tensor(xs.astype(np.float32), requires_grad=True)
    y = fn(ours.transpose(2, 3) if transpose else ours)
    yt = torch_fn(theirs.transpose(2, 3) if transpose else theirs)
    assert tuple(y.shape) == tuple(yt.shape)
    gy = np.round(rng.standard_normal(yt.shape) * 8) / 8  # exact in float16
    if transpose:
        y.backward(wgpar.tensor(np.swapaxes(gy, 2, 3).copy(), dtype=dtype).transpose(2, 3))
    else:
        y.backward(wgpar.tensor(gy, dtype=dtype))
    yt.backward(torch.tensor(gy.astype(np.float32)))
    got, want = ours.grad.numpy().astype(np.float32), theirs.grad.numpy()
    return (np.swapaxes(got, 2, 3), np.swapaxes(want, 2, 3)) if transpose else (got, want)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", GRAD_CASES + MAX_ONLY, ids=str)
def test_max_pool2d_input_gradient_matches_torch(case, dtype, rng, torch):
    shape, kwargs = case
    x = np.round(rng.standard_normal(shape) * 2) / 2  # few distinct values: many ties
    for transpose in (False, True):
        got, want = _grad_pair(x, lambda t: F.max_pool2d(t, **kwargs),
                               lambda t: torch.nn.functional.max_pool2d(t, **kwargs), torch,
                               getattr(wgpar, dtype), transpose, rng)
        assert_close(got, want, rtol=1e-6 if dtype == "float32" else 1e-3, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("extra", [dict(), dict(count_include_pad=False), dict(divisor_override=3)], ids=str)
@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_avg_pool2d_input_gradient_matches_torch(case, extra, dtype, rng, torch):
    shape, kwargs = case
    kwargs = {**kwargs, **extra}
    x = rng.standard_normal(shape)
    for transpose in (False, True):
        got, want = _grad_pair(x, lambda t: F.avg_pool2d(t, **kwargs),
                               lambda t: torch.nn.functional.avg_pool2d(t, **kwargs), torch,
                               getattr(wgpar, dtype), transpose, rng)
        assert_close(got, want, rtol=1e-5 if dtype == "float32" else 2e-3, atol=1e-6 if dtype == "float32" else 2e-3)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,out_hw", [((2, 3, 13, 7), (5, 3)), ((1, 2, 1, 9), (1, 4)), ((2, 2, 7, 13), (3, 13)),
                                          ((2, 2, 5, 6), (11, 9)), ((1, 3, 13, 7), (1, 1)), ((1, 2, 3, 5), (2, 14))],
                         ids=str)
def test_adaptive_avg_pool2d_input_gradient_matches_torch(shape, out_hw, dtype, rng, torch):
    x = rng.standard_normal(shape)
    for transpose in (False, True):
        got, want = _grad_pair(x, lambda t: F.adaptive_avg_pool2d(t, out_hw),
                               lambda t: torch.nn.functional.adaptive_avg_pool2d(t, out_hw), torch,
                               getattr(wgpar, dtype), transpose, rng)
        assert_close(got, want, rtol=1e-5 if dtype == "float32" else 2e-3, atol=1e-6 if dtype == "float32" else 2e-3)


def test_pool_gradients_on_a_two_dimensional_grid(dev, monkeypatch, rng, torch):
    """Few workgroups per grid row: the backward kernels index threads through gid.y too."""
    monkeypatch.setattr(dev, "max_workgroups", 6)
    x = np.round(rng.standard_normal((4, 8, 15, 13)) * 2) / 2
    for fn, torch_fn in [(lambda t: F.max_pool2d(t, 3, 2, 1), lambda t: torch.nn.functional.max_pool2d(t, 3, 2, 1)),
                         (lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False),
                          lambda t: torch.nn.functional.avg_pool2d(t, 3, 2, 1, count_include_pad=False)),
                         (lambda t: F.adaptive_avg_pool2d(t, (5, 4)),
                          lambda t: torch.nn.functional.adaptive_avg_pool2d(t, (5, 4)))]:
        got, want = _grad_pair(x, fn, torch_fn, torch, wgpar.float32, False, rng)
        assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("limit", [4, 12], ids=["taps", "one-element"])
def test_pool_gradients_past_the_loop_limit(limit, monkeypatch, rng, torch):
    """A lower loop limit makes the backward kernels take one element a thread, and max pooling's
    loop over the taps (limit 4), as long windows do."""
    from wgpar.ops import pool

    x = np.round(rng.standard_normal((2, 3, 13, 7)) * 2) / 2
    cases = [(lambda t: F.max_pool2d(t, 3, 1, 1), lambda t: torch.nn.functional.max_pool2d(t, 3, 1, 1)),
             (lambda t: F.max_pool2d(t, 3, 2, 1, dilation=2), lambda t: torch.nn.functional.max_pool2d(t, 3, 2, 1, 2)),
             (lambda t: F.avg_pool2d(t, 3, 1, 1, count_include_pad=False),
              lambda t: torch.nn.functional.avg_pool2d(t, 3, 1, 1, count_include_pad=False))]
    monkeypatch.setattr(pool, "MAX_LOOP", limit)
    for fn, torch_fn in cases:
        got, want = _grad_pair(x, fn, torch_fn, torch, wgpar.float32, False, rng)
        assert_close(got, want, rtol=1e-6, atol=1e-6)
    g = rng.standard_normal((2, 3, 5, 3)).astype(np.float32)  # adaptive: the kernel itself (F would use matmuls)
    theirs = torch.tensor(x.astype(np.float32), requires_grad=True)
    torch.nn.functional.adaptive_avg_pool2d(theirs, (5, 3)).backward(torch.tensor(g))
    got = pool.adaptive_avg_pool2d(wgpar.tensor(g), (5, 3), backward=True, in_hw=(13, 7)).numpy()
    assert_close(got, theirs.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_max_pool2d_gradient_with_a_long_dilated_span(rng, torch):
    """Spans of 301 rows and columns: too many outputs to visit, so the kernel loops over the 4 taps."""
    x = rng.standard_normal((1, 2, 303, 305))
    got, want = _grad_pair(x, lambda t: F.max_pool2d(t, 2, 1, dilation=300),
                           lambda t: torch.nn.functional.max_pool2d(t, 2, 1, dilation=300), torch, wgpar.float32,
                           False, rng)
    assert_close(got, want, rtol=1e-6, atol=1e-6)
