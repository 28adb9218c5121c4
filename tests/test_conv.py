"""Conv1d / Conv2d: forward against a NumPy float64 reference, gradients against finite differences
and PyTorch, on awkward sizes (odd channels, non-square, stride, padding, dilation, groups)."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F
from wgpar.ops import conv as conv_ops
from wgpar.ops.window import window

from . import gradcheck
from .helpers import assert_close

mm = sys.modules["wgpar.ops.matmul"]  # the module (wgpar.ops.matmul is also the function)


def conv2d_ref(x, w, b=None, stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1):
    """Cross-correlation in float64, straight from the definition."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = padding
    sh, sw = stride
    dh, dw = dilation
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    xg = xp.reshape(n, groups, cg, *xp.shape[2:])
    wg = w.reshape(groups, o // groups, cg, kh, kw)
    y = np.zeros((n, groups, o // groups, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xg[:, :, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            y += np.einsum("ngcpq,goc->ngopq", patch, wg[:, :, :, i, j])
    y = y.reshape(n, o, oh, ow)
    return y if b is None else y + b.astype(np.float64)[None, :, None, None]


# (N, C, H, W, O, kernel, stride, padding, dilation, groups)
CASES = [
    (2, 3, 7, 9, 5, (3, 2), (2, 1), (1, 0), (1, 2), 1),
    (3, 4, 6, 5, 8, 3, 1, 1, 1, 4),        # groups, square kernel, 'same'-like padding
    (2, 6, 5, 5, 6, 3, 2, 2, 2, 6),        # depthwise, stride 2, dilation 2
    (1, 5, 11, 4, 7, (1, 3), (3, 1), (0, 2), 1, 1),
    (4, 1, 8, 8, 3, 2, 2, 0, 1, 1),        # one input channel, windows that tile
    (2, 6, 9, 7, 9, (2, 3), (1, 2), (1, 1), (3, 1), 3),
]


def _norm(v):
    return v if isinstance(v, tuple) else (v, v)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])))
def test_conv2d_forward_matches_numpy(case, rng):
    n, c, h, w, o, k, s, p, d, g = case
    kh, kw = _norm(k)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c // g, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    got = F.conv2d(wgpar.tensor(x), wgpar.tensor(wt), wgpar.tensor(b), s, p, d, g).numpy()
    ph, pw = _norm(p)
    want = conv2d_ref(x, wt, b, _norm(s), ((ph, ph), (pw, pw)), _norm(d), g)
    assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_conv2d_gradients_match_finite_differences(rng):
    x = rng.standard_normal((2, 4, 5, 4))
    w = rng.standard_normal((6, 2, 3, 2))
    b = rng.standard_normal(6)
    kw = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2)
    gradcheck.check(lambda x, w, b: F.conv2d(x, w, b, **kw),
                    lambda x, w, b: conv2d_ref(x, w, b, (2, 1), ((1, 1), (1, 1)), (1, 2), 2), [x, w, b], rng)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])))
def test_conv2d_matches_torch(case, rng, torch):
    n, c, h, w, o, k, s, p, d, g = case
    kh, kw = _norm(k)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in ((n, c, h, w), (o, c // g, kh, kw), (o,))]
    ours = [wgpar.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = F.conv2d(*ours, s, p, d, g)
    yt = torch.nn.functional.conv2d(*theirs, s, p, d, g)
    assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-4)
    gy = rng.standard_normal(yt.shape).astype(np.float32)
    y.backward(wgpar.tensor(gy))
    yt.backward(torch.tensor(gy))
    for a, t, name in zip(ours, theirs, ("input", "weight", "bias")):
        assert_close(a.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4, what=name)


@pytest.mark.parametrize("padding", [0, 2, "same", "valid"])
def test_conv1d_matches_torch(padding, rng, torch):
    stride = 1 if padding == "same" else 2
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in ((3, 4, 13), (6, 2, 4), (6,))]
    ours = [wgpar.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = F.conv1d(*ours, stride=stride, padding=padding, dilation=3, groups=2)
    with warnings.catch_warnings():  # torch's note that 'same' with an even kernel copies its input
        warnings.simplefilter("ignore")
        yt = torch.nn.functional.conv1d(*theirs, stride=stride, padding=padding, dilation=3, groups=2)
    assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-4)
    gy = rng.standard_normal(yt.shape).astype(np.float32)
    y.backward(wgpar.tensor(gy))
    yt.backward(torch.tensor(gy))
    for a, t in zip(ours, theirs):
        assert_close(a.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv2d_same_padding_and_unbatched_input_match_torch(rng, torch):
    x = rng.standard_normal((3, 6, 7)).astype(np.float32)  # [C, H, W]
    w = rng.standard_normal((4, 3, 4, 3)).astype(np.float32)  # even kernel height: one more row after
    y = F.conv2d(wgpar.tensor(x), wgpar.tensor(w), padding="same", dilation=(1, 2)).numpy()
    yt = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding="same", dilation=(1, 2)).numpy()
    assert y.shape == yt.shape == (4, 6, 7)
    assert_close(y, yt, rtol=1e-4, atol=1e-5)


def test_batches_past_the_workspace_run_in_chunks(rng, monkeypatch):
    """Patches beyond WORKSPACE_BYTES go image by image; forward and every gradient stay the same."""
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in ((5, 3, 6, 7), (4, 3, 3, 3), (4,))]

    def run():
        ts = [wgpar.tensor(a, requires_grad=True) for a in arrays]
        y = F.conv2d(*ts, stride=1, padding=1)
        (y * y).sum().backward()
        return [y.numpy()] + [t.grad.numpy() for t in ts]

    with conv_ops.force_path("im2col"):
        whole = run()
        per_image = 3 * 9 * 6 * 7 * 4
        monkeypatch.setattr(conv_ops, "WORKSPACE_BYTES", 2 * per_image)  # chunks of 2, 2 and 1 images
        assert conv_ops.chunks(window((5, 3, 6, 7), 3, 1, 1, 1, "t"), wgpar.tensor(arrays[0])) == \
            [(0, 2), (2, 2), (4, 1)]
        conv_ops.PATHS.clear()
        chunked = run()
    assert conv_ops.PATHS == {"im2col": 3}
    for a, b in zip(chunked, whole):  # the weight's gradient sums the chunks in another order
        assert_close(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max())


def _against_torch(torch, rng, shapes, stride, padding, dilation, groups, dtype=np.float32, tol=1e-4):
    """Forward and every gradient of conv2d against torch's (float64 there where dtype is float16)."""
    arrays = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    ours = [wgpar.tensor(a, dtype=wgpar.float16 if dtype == np.float16 else wgpar.float32, requires_grad=True)
            for a in arrays]
    theirs = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    y = F.conv2d(*ours, stride, padding, dilation, groups)
    yt = torch.nn.functional.conv2d(*theirs, stride=stride, padding=padding, dilation=dilation, groups=groups)
    gy = rng.standard_normal(yt.shape).astype(dtype)
    y.backward(wgpar.tensor(gy, dtype=y.dtype))
    yt.backward(torch.tensor(gy.astype(np.float64)))
    for a, t, name in zip([y] + [t.grad for t in ours], [yt] + [t.grad for t in theirs],
                          ("output", "input", "weight", "bias")):
        want = t.detach().numpy()
        assert_close(a.numpy().astype(np.float64), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()), what=name)


# (N, C, H, W, O, kernel, stride, padding, dilation, groups), the paths conv2d must take (forward, input
# gradient, weight gradient)
PATH_CASES = [
    ((2, 7, 13, 11, 7, 3, 2, 1, 2, 7), "depthwise"),         # awkward sizes, stride 2, dilation 2
    ((3, 5, 9, 10, 10, (3, 2), (1, 2), (2, 0), 1, 5), "depthwise"),  # channel multiplier 2
    ((2, 5, 13, 11, 67, (3, 2), (2, 1), (1, 1), (1, 2), 1), "gemm"),  # K = 30, O and N past whole tiles
    ((2, 10, 9, 7, 10, 3, 3, (2, 0), 2, 2), "gemm"),          # groups; stride 3: phases no tap reaches
    ((3, 8, 6, 6, 5, 1, 1, 0, 1, 1), "matmul"),               # 1x1, no gather (the weight's gradient is a GEMM)
]
_PATHS_TAKEN = {"depthwise": {"depthwise": 3}, "gemm": {"gemm": 3}, "matmul": {"matmul": 2, "gemm": 1}}


@pytest.mark.parametrize("case, path", PATH_CASES, ids=lambda c: c if isinstance(c, str) else "x".join(map(str, c[:5])))
def test_each_path_matches_torch(case, path, rng, torch):
    n, c, h, w, o, k, s, p, d, g = case
    kh, kw = _norm(k)
    conv_ops.PATHS.clear()
    _against_torch(torch, rng, ((n, c, h, w), (o, c // g, kh, kw), (o,)), s, p, d, g)
    assert conv_ops.PATHS == _PATHS_TAKEN[path], conv_ops.PATHS


# The direct input gradient (few input channels per group): (N, C, H, W, O, kernel, stride, padding, dilation,
# groups). Rows per thread are 8 (and 8 interleaved by the row step of the taps where that is 2), so heights
# past 8 and 16 rows of a phase take several row blocks.
DIRECT_CASES = [
    (2, 3, 37, 30, 8, 7, 2, 3, 1, 1),                     # the ResNet stem, smaller
    (2, 3, 23, 41, 5, (3, 4), 1, 0, 1, 1),                # stride 1, rectangular kernel and input
    (1, 2, 40, 17, 6, 3, 3, 1, 2, 1),                     # stride 3, dilation 2: two taps a phase, step 3
    (2, 2, 35, 12, 4, 3, 1, 2, 2, 1),                     # stride 1, dilation 2: taps 2 output rows apart
    (2, 8, 19, 9, 6, (5, 3), (2, 1), (3, 1), (1, 2), 2),  # groups, 4 channels a group (the bound)
    (3, 6, 18, 18, 9, 3, 2, 1, 2, 3),                     # 2 channels a group, stride 2 dilation 2
    (2, 3, 27, 26, 5, (3, 5), (3, 2), (0, 3), (2, 3), 1),  # strides, dilations and padding differ by axis
    (2, 4, 7, 7, 4, 7, 2, 0, 1, 1),                       # a 1x1 output; phases with one tap
    (1, 3, 3, 5, 2, 3, 4, (0, 1), 1, 1),                  # stride past the input: phases no tap reaches
    (2, 1, 9, 11, 3, 3, 2, 1, 1, 1),                      # one channel (unforced, the depthwise kernel's)
    (2, 3, 13, 10, 4, (4, 3), 1, "same", (1, 2), 1),      # an even kernel: one padding row more after than before
]


@pytest.mark.parametrize("case", DIRECT_CASES, ids=lambda c: "x".join(map(str, c[:5])))
def test_direct_input_gradient_matches_torch(case, rng, torch):
    n, c, h, w, o, k, s, p, d, g = case
    kh, kw = _norm(k)
    conv_ops.PATHS.clear()
    with conv_ops.force_path("direct"), warnings.catch_warnings():  # forced: the one-channel case too
        warnings.simplefilter("ignore")  # torch's note that 'same' with an even kernel copies its input
        _against_torch(torch, rng, ((n, c, h, w), (o, c // g, kh, kw), (o,)), s, p, d, g)
    taken = conv_ops.PATHS.copy()
    assert taken["direct"] == 1 and sum(taken.values()) == 3, taken  # forward and weight gradient by their paths


def test_direct_input_gradient_is_the_default_for_few_channels(rng, torch):
    """Without forcing: a 3-channel stem's input gradient is direct; 5 channels a group take the GEMM."""
    for c, want in ((3, {"gemm": 2, "direct": 1}), (5, {"gemm": 3})):
        conv_ops.PATHS.clear()
        _against_torch(torch, rng, ((2, c, 21, 19), (6, c, 7, 7), (6,)), 2, 3, 1, 1)
        assert conv_ops.PATHS == want, (c, conv_ops.PATHS)


def test_direct_input_gradient_on_a_split_grid_and_past_the_loop_limit(rng, torch, monkeypatch, dev):
    """A grid past the workgroups per dimension (5 x 2 here) still covers every row block once; a group
    whose loops would pass MAX_LOOP takes the GEMM."""
    w = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    gy = rng.standard_normal((4, 4, 61, 70)).astype(np.float32)
    win = window((4, 3, 61, 70), 5, 1, 2, 1, "t")  # 4 x 8 x 70 threads: 9 workgroups
    with monkeypatch.context() as m:
        m.setattr(dev, "max_workgroups", 7)
        conv_ops.PATHS.clear()
        got = conv_ops.input_grad(wgpar.tensor(gy), wgpar.tensor(w), win, 1).numpy()
    assert conv_ops.PATHS == {"direct": 1}, conv_ops.PATHS
    want = torch.nn.grad.conv2d_input((4, 3, 61, 70), torch.tensor(w, dtype=torch.float64),
                                      torch.tensor(gy, dtype=torch.float64), 1, 2).numpy()
    assert_close(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    monkeypatch.setattr(conv_ops, "MAX_LOOP", 4 * (4 * 5 + 1) + 2 + 2)  # 4 filters x (4 column taps x (4 row
    # taps + 1) + 1) + the two first-tap searches
    for o, path in ((4, "direct"), (5, "gemm")):
        conv_ops.PATHS.clear()
        _against_torch(torch, rng, ((2, 3, 15, 14), (o, 3, 7, 7), (o,)), 2, 3, 1, 1)
        assert conv_ops.PATHS[path] == (1 if path == "direct" else 3), (o, conv_ops.PATHS)


def test_direct_input_gradient_in_float16_under_autocast(rng, torch, dev):
    """Under autocast the stem runs in float16 (gradient accumulated in float32, stored as float16): the
    input gradient within 2e-2 of torch's float64 one relative to its largest element."""
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    x = rng.standard_normal((2, 3, 29, 24)).astype(np.float32)
    w = (rng.standard_normal((8, 3, 7, 7)) / 8).astype(np.float32)
    xw = wgpar.tensor(x, requires_grad=True)
    conv_ops.PATHS.clear()
    with conv_ops.force_path("direct"), wgpar.autocast():
        y = F.conv2d(xw, wgpar.tensor(w), None, 2, 3)
        assert y.dtype is wgpar.float16
        gy = rng.standard_normal(y.shape).astype(np.float16)
        y.backward(wgpar.tensor(gy, dtype=wgpar.float16))
    assert conv_ops.PATHS["direct"] == 1, conv_ops.PATHS
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    wt = torch.tensor(w.astype(np.float16).astype(np.float64))
    torch.nn.functional.conv2d(xt, wt, None, 2, 3).backward(torch.tensor(gy.astype(np.float64)))
    want = xt.grad.numpy()
    assert_close(xw.grad.numpy(), want, rtol=2e-2, atol=2e-2 * np.abs(want).max(), what="input gradient")


def test_split_weight_gradient_and_split_grids_match_torch(rng, torch, monkeypatch, dev):
    """Positions in several parts (the weight gradients' partial sums) and grids past the workgroup limit."""
    monkeypatch.setattr(conv_ops, "_MAX_K", 96)  # 13 parts of the 1200 positions
    monkeypatch.setattr(conv_ops, "MAX_LOOP", 40)  # the depthwise kernel: 2 positions a thread, 3 parts
    monkeypatch.setattr(dev, "max_workgroups", 16)  # the forward's 19 column tiles, the 26 partial products
    for case, path in (((3, 4, 20, 20, 20, 3, 1, 1, 1, 2), "gemm"), ((3, 5, 20, 20, 5, 3, 1, 1, 1, 5), "depthwise")):
        n, c, h, w, o, k, s, p, d, g = case
        conv_ops.PATHS.clear()
        _against_torch(torch, rng, ((n, c, h, w), (o, c // g, k, k), (o,)), s, p, d, g)
        assert conv_ops.PATHS == {path: 3}, (case, conv_ops.PATHS)


@pytest.mark.parametrize("path", ["gemm", "im2col"])
def test_forced_paths_match_torch(path, rng, torch):
    with conv_ops.force_path(path):
        conv_ops.PATHS.clear()
        _against_torch(torch, rng, ((2, 6, 7, 9), (6, 1, 3, 3), (6,)), 2, 1, 1, 6)
    assert conv_ops.PATHS == {path: 3}


@pytest.mark.parametrize("groups", [1, 5])
def test_float16_gradients_match_torch(groups, rng, torch, dev):
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    _against_torch(torch, rng, ((2, 5, 9, 8), (10, 5 // groups, 3, 3), (10,)), 2, 1, 1, groups, np.float16, 2e-2)


def test_float16_implicit_gemm_odd_sizes_and_offsets(rng, torch, dev):
    """The implicit GEMMs with float16 operands of odd element counts, starting at an odd element (a slice
    of a larger tensor): forward and both gradients against torch."""
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    x = rng.standard_normal((3, 5, 7, 9)).astype(np.float16)    # 315 elements an image: odd
    w = rng.standard_normal((2, 7, 5, 3, 3)).astype(np.float16)  # 135 elements a filter bank
    b = rng.standard_normal(7).astype(np.float16)
    gy = rng.standard_normal((2, 7, 4, 5)).astype(np.float16)
    xs, ws = wgpar.tensor(x, requires_grad=True), wgpar.tensor(w, requires_grad=True)
    xv, wv = xs[1:], ws[1]  # start at elements 315 and 135
    conv_ops.PATHS.clear()
    y = F.conv2d(xv, wv, wgpar.tensor(b), stride=2, padding=1)
    y.backward(wgpar.tensor(gy))
    assert conv_ops.PATHS == {"gemm": 3}, conv_ops.PATHS
    tx, tw = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x[1:], w[1]))
    yt = torch.nn.functional.conv2d(tx, tw, torch.tensor(b.astype(np.float64)), stride=2, padding=1)
    yt.backward(torch.tensor(gy.astype(np.float64)))
    for got, want, name in ((y, yt, "output"), (xs.grad[1:], tx.grad, "input"), (ws.grad[1], tw.grad, "weight")):
        want = want.detach().numpy()
        assert_close(got.numpy().astype(np.float64), want, rtol=2e-2, atol=2e-2 * np.abs(want).max(), what=name)
    assert not xs.grad[0].numpy().any() and not ws.grad[0].numpy().any()


# What torch prints for these layers.
CONV_REPRS = {
    "Conv2d(3, 8, kernel_size=(3, 5), stride=(2, 2), padding=(1, 1))":
        lambda m: m.Conv2d(3, 8, (3, 5), stride=2, padding=1),
    "Conv1d(4, 4, kernel_size=(3,), stride=(1,), groups=4, bias=False)":
        lambda m: m.Conv1d(4, 4, 3, groups=4, bias=False),
}


def test_conv_layer_reprs_are_torchs(torch):
    for text, make in CONV_REPRS.items():
        assert repr(make(nn)) == repr(make(torch.nn)) == text


def test_conv_layers_init_shapes_and_training(rng):
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    conv = nn.Conv2d(3, 8, (3, 5), stride=2, padding=1, groups=1)
    assert conv.weight.shape == (8, 3, 3, 5) and conv.bias.shape == (8,)
    bound = 1 / np.sqrt(3 * 15)  # torch: kaiming_uniform(a=sqrt 5) and the bias both give 1 / sqrt(fan_in)
    assert np.abs(conv.weight.numpy()).max() <= bound and np.abs(conv.bias.numpy()).max() <= bound
    for text, make in CONV_REPRS.items():
        assert repr(make(nn)) == text
    x = wgpar.tensor(rng.standard_normal((2, 3, 9, 11)).astype(np.float32))
    assert conv(x).shape == (2, 8, 5, 5)
    depthwise = nn.Conv1d(4, 8, 3, padding="same", groups=4)
    assert depthwise(wgpar.tensor(rng.standard_normal((2, 4, 10)).astype(np.float32))).shape == (2, 8, 10)


def test_conv2d_float16_forward(rng, dev):
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float16)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    y = F.conv2d(wgpar.tensor(x, dtype=wgpar.float16), wgpar.tensor(w, dtype=wgpar.float16), padding=1)
    assert y.dtype is wgpar.float16
    assert_close(y.numpy(), conv2d_ref(x, w, padding=((1, 1), (1, 1))), rtol=2e-2, atol=2e-2)


def test_conv_nan_propagates(rng):
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    x[0, 1, 2, 2] = np.nan
    y = F.conv2d(wgpar.tensor(x), wgpar.tensor(np.ones((1, 2, 3, 3), np.float32))).numpy()
    assert np.isnan(y).all()  # every 3x3 window of the 5x5 input covers the centre


@pytest.mark.parametrize("args, match", [
    (dict(x=(2, 3, 5, 5), w=(4, 2, 3, 3)), r"groups=1"),
    (dict(x=(2, 4, 5, 5), w=(3, 2, 3, 3), groups=2), r"divisible by groups"),
    (dict(x=(2, 3, 2, 5), w=(4, 3, 3, 3)), r"smaller than the 3x3 kernel"),
    (dict(x=(2, 3, 5, 5, 1), w=(4, 3, 3, 3)), r"\[N, C, H, W\] or \[C, H, W\]"),
    (dict(x=(2, 3, 5, 5), w=(4, 3, 3, 3), stride=0), r"stride must be >= 1"),
    (dict(x=(2, 3, 5, 5), w=(4, 3, 3, 3), padding=-1), r"padding must be >= 0"),
    (dict(x=(2, 3, 5, 5), w=(4, 3, 3, 3), stride=2, padding="same"), r"'same' needs stride 1"),
    (dict(x=(2, 3, 5, 5), w=(4, 3, 3, 3), bias=(3,)), r"bias of shape \(3,\) for 4 output channels"),
])
def test_conv2d_bad_arguments_raise_clearly(args, match):
    x = wgpar.zeros(*args["x"])
    w = wgpar.zeros(*args["w"])
    b = wgpar.zeros(*args["bias"]) if "bias" in args else None
    with pytest.raises(ValueError, match=match):
        F.conv2d(x, w, b, stride=args.get("stride", 1), padding=args.get("padding", 0), groups=args.get("groups", 1))


def test_conv2d_mixed_dtypes_and_layer_arguments_raise():
    with pytest.raises(TypeError, match=r"one float dtype"):
        F.conv2d(wgpar.zeros(1, 2, 4, 4), wgpar.zeros(3, 2, 3, 3, dtype=wgpar.int32))
    with pytest.raises(ValueError, match=r"divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"padding_mode='zeros'"):
        nn.Conv2d(3, 4, 3, padding_mode="reflect")


def test_an_empty_batch_gives_empty_outputs_and_zero_gradients():
    x = wgpar.zeros(0, 3, 5, 5, requires_grad=True)
    conv = nn.Conv2d(3, 4, 3)
    y = conv(x)
    assert y.shape == (0, 4, 3, 3)
    y.sum().backward()
    assert x.grad.shape == (0, 3, 5, 5)
    assert not conv.weight.grad.numpy().any() and not conv.bias.grad.numpy().any()


def test_conv_runs_in_float16_inside_autocast(rng, dev):
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = wgpar.tensor(rng.standard_normal((2, 3, 5, 6)).astype(np.float32))
    want = conv(x).numpy()
    with wgpar.autocast():
        y = conv(x)
    assert y.dtype is wgpar.float16
    assert_close(y.numpy(), want, rtol=1e-2, atol=1e-2)
    y.float().sum().backward()
    assert conv.weight.grad.dtype is wgpar.float32 and conv.bias.grad.dtype is wgpar.float32


@pytest.mark.parametrize("cin,cout,k,stride,pad,dil,hw", [(96, 16, 1, 1, 0, 1, 28), (3, 32, 7, 2, 3, 1, 64),
                                                          (32, 32, 3, 1, 2, 2, 30)],
                         ids=["pointwise", "stem 7x7/2", "3x3 dilation 2"])
def test_conv_backward_peak_memory_holds_no_extra_activation(cin, cout, k, stride, pad, dil, hw, dev):
    """forward + backward of a conv layer (input, weight and bias gradients) allocates its output and the
    input gradient, plus at most the weight gradient's partial sums: no copy of the output gradient (the
    bias gradient sums positions, then images) and no input-sized buffer ahead of the pointwise product."""
    rng = np.random.default_rng(0)
    layer = nn.Conv2d(cin, cout, k, stride, pad, dil).to(dev)
    x = wgpar.tensor(rng.standard_normal((3, cin, hw, hw)).astype(np.float32), requires_grad=True)
    y = layer(x)
    g = wgpar.tensor(rng.standard_normal(y.shape).astype(np.float32))
    y.backward(g)
    x.grad = layer.weight.grad = layer.bias.grad = None
    del y
    wgpar.synchronize(dev)
    base = wgpar.memory_stats(dev)["allocated_bytes"]
    wgpar.reset_peak_memory_stats(dev)
    layer(x).backward(g)
    peak = wgpar.memory_stats(dev)["peak_allocated_bytes"] - base
    parts = 1 + g.numel() // cout // conv_ops._PART_MIN  # the weight gradient's split-K partial sums
    bound = g.numel() * 4 + x.numel() * 4 + (parts + 2) * layer.weight.numel() * 4 + cout * 16
    assert peak <= bound, f"{peak} bytes at peak, bound {bound}"
    np.testing.assert_allclose(layer.bias.grad.numpy(), g.numpy().sum((0, 2, 3)), rtol=1e-4, atol=1e-4)


def test_gpu_weight_gradient_split_stays_within_the_output_gradient(rng, torch, monkeypatch, dev):
    """On a GPU the weight gradient splits its positions into parts for more workgroups; their partial sums
    are kept within the output gradient's size (here 2 parts, not the 3 the position count allows), and the
    gradient still matches torch."""
    monkeypatch.setattr(dev, "adapter_type", "DiscreteGPU")
    layer = nn.Conv2d(128, 128, 3, 1, 2, 2, bias=False).to(dev)
    x = wgpar.tensor(rng.standard_normal((4, 128, 28, 28)).astype(np.float32), requires_grad=True)
    g = wgpar.tensor(rng.standard_normal((4, 128, 28, 28)).astype(np.float32))
    wgpar.synchronize(dev)
    base = wgpar.memory_stats(dev)["allocated_bytes"]
    wgpar.reset_peak_memory_stats(dev)
    layer(x).backward(g)
    peak = wgpar.memory_stats(dev)["peak_allocated_bytes"] - base
    bound = 3 * g.numel() * 4 + layer.weight.numel() * 4  # output, input gradient, partial sums, their sum
    assert peak <= bound, f"{peak} bytes at peak, bound {bound}"
    tx = torch.tensor(x.numpy(), requires_grad=True)
    tw = torch.tensor(layer.weight.numpy(), requires_grad=True)
    torch.nn.functional.conv2d(tx, tw, None, 1, 2, 2).backward(torch.tensor(g.numpy()))
    assert_close(layer.weight.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
    assert_close(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("tile", [*mm.CONV_TILINGS, *mm.TILINGS])
def test_every_implicit_gemm_tile_matches_torch(tile, rng, torch, monkeypatch):
    """Each tile the implicit GEMMs may take (the 128-row ones are a GPU's choice from 128 channels), forced
    on the forward and both gradients: channels past a whole tile (131 out, 130 in), stride 2 (four input
    gradient phases) and groups."""
    t = {**mm.CONV_TILINGS, **mm.TILINGS}[tile]
    monkeypatch.setattr(conv_ops, "gemm_tiling", lambda dev, M, N, nb, weight_grad=False: t)
    monkeypatch.setattr(conv_ops, "_SHORT_TILES", ())
    for shapes, s, p, d, g in ((((2, 130, 9, 7), (131, 130, 3, 3), (131,)), 2, 1, 1, 1),
                               (((3, 12, 11, 6), (132, 6, 2, 3), (132,)), 1, (1, 0), (2, 1), 2)):
        conv_ops.PATHS.clear()
        _against_torch(torch, rng, shapes, s, p, d, g, tol=2e-4)
        assert conv_ops.PATHS == {"gemm": 3}, conv_ops.PATHS


def test_gpu_implicit_gemms_take_128_row_tiles_from_128_channels(dev, monkeypatch):
    """The rule measured on an H100: from M = 128, 128 x 128 tiles where they give 256 workgroups, else
    128 x 64 where those give 128, else the matmul's; the weight gradient 128 x 64 (it splits K for
    workgroups); a CPU adapter (lavapipe) keeps the matmul's tiles."""
    wide, narrow = mm.CONV_TILINGS.values()
    base = mm.gemm_tiling(dev, 64, 32768, 1)
    monkeypatch.setattr(dev, "adapter_type", "DiscreteGPU")
    assert mm.gemm_tiling(dev, 128, 128 * 256, 1) is wide  # ResNet-18's 3x3 128 at 16 x 16, batch 128
    assert mm.gemm_tiling(dev, 256, 128 * 64, 1) is narrow  # 256 channels at 8 x 8: 128 x 128 gives 128
    assert mm.gemm_tiling(dev, 512, 128 * 16, 1) is narrow  # 512 channels at 4 x 4: 128 workgroups
    assert mm.gemm_tiling(dev, 512, 512, 1) is not narrow and mm.gemm_tiling(dev, 512, 512, 1).bm == 64
    assert mm.gemm_tiling(dev, 128, 1152, 1, weight_grad=True) is narrow
    assert mm.gemm_tiling(dev, 64, 32768, 1) is base  # fewer channels: as before
    monkeypatch.setattr(dev, "adapter_type", "CPU")
    assert mm.gemm_tiling(dev, 128, 128 * 256, 1).bm == 64


def test_pointwise_convolution_adds_its_bias_in_the_product(rng, torch, dev):
    """A 1x1 convolution with a bias is one dispatch (the bias added as the product stores its tiles) and
    equals torch's, at an odd number of filters."""
    x = rng.standard_normal((3, 12, 5, 8)).astype(np.float32)
    w, b = rng.standard_normal((13, 12, 1, 1)).astype(np.float32), rng.standard_normal(13).astype(np.float32)
    xs, ws, bs = (wgpar.tensor(a) for a in (x, w, b))
    conv_ops.PATHS.clear()
    n0 = dev.num_dispatches
    with wgpar.no_grad():
        y = F.conv2d(xs, ws, bs)
    assert dev.num_dispatches - n0 == 1 and conv_ops.PATHS == {"matmul": 1}
    want = torch.nn.functional.conv2d(*(torch.tensor(a, dtype=torch.float64) for a in (x, w, b))).numpy()
    assert_close(y.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
