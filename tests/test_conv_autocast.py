"""Convolutions under autocast: a float16 result computed from the operands as they are stored (float32
master weights and inputs read as float32: the casts folded into the kernels, no float16 copies made), each
gradient in its operand's own dtype, on every kernel path; against a NumPy float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.nn import functional as F
from wgpar.ops import conv as conv_ops

from .test_conv import conv2d_ref


def conv2d_vjp(x, w, g, stride, padding, dilation, groups):
    """(input, weight) gradients of ``conv2d_ref`` for the output gradient ``g``, in float64 (padding symmetric)."""
    x, w, g = x.astype(np.float64), w.astype(np.float64), g.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh, ow = g.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    gxp = np.zeros_like(xp)
    xg, gxg = (t.reshape(n, groups, cg, *xp.shape[2:]) for t in (xp, gxp))
    wg = w.reshape(groups, o // groups, cg, kh, kw)
    gg = g.reshape(n, groups, o // groups, oh, ow)
    gw = np.zeros_like(wg)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            gw[:, :, :, i, j] = np.einsum("ngcpq,ngopq->goc", xg[:, :, :, rows, cols], gg)
            gxg[:, :, :, rows, cols] += np.einsum("ngopq,goc->ngcpq", gg, wg[:, :, :, i, j])
    return gxp[:, :, ph:ph + h, pw:pw + wd], gw.reshape(w.shape)


def _rel(got, want):
    return np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)


# (N, C, H, W, O, kernel, stride, padding, dilation, groups), the path each takes (forward, input gradient)
CASES = {
    "gemm": ((2, 6, 9, 7, 10, (3, 2), (2, 1), (1, 1), (1, 2), 2), None),
    "depthwise": ((2, 6, 9, 8, 12, 3, 1, 1, 1, 6), None),
    "pointwise": ((2, 8, 6, 6, 12, 1, 1, 0, 1, 1), None),
    "direct": ((2, 3, 13, 11, 8, 5, 2, 2, 1, 1), None),
    "im2col": ((2, 4, 7, 6, 5, 3, 1, 1, 1, 1), "im2col"),
}
PATHS = {"gemm": ("gemm", "gemm"), "depthwise": ("depthwise", "depthwise"), "pointwise": ("matmul", "matmul"),
         "direct": ("gemm", "direct"), "im2col": ("im2col", "im2col")}


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


@pytest.mark.parametrize("xdtype", ["float32", "float16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_conv2d_under_autocast_reads_operands_as_stored(case, xdtype, rng, dev):
    """float32 operands give a float16 result of their float32 product (one dispatch on the kernel paths: no
    casts), float32 gradients of float32 math on the float16 output gradient; a float16 input (an earlier
    layer's output) gets a float16 gradient."""
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    (n, c, h, w, o, k, s, p, d, g), force = CASES[case]
    kh, kw = _pair(k)
    s, p, d = _pair(s), _pair(p), _pair(d)
    x = rng.standard_normal((n, c, h, w)).astype(xdtype)
    wt = (rng.standard_normal((o, c // g, kh, kw)) / np.sqrt(c // g * kh * kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    xw = wgpar.tensor(x, dtype=getattr(wgpar, xdtype), requires_grad=True)
    ww, bw = wgpar.tensor(wt, requires_grad=True), wgpar.tensor(b, requires_grad=True)
    conv_ops.PATHS.clear()
    with conv_ops.force_path(force), wgpar.autocast():
        d0 = dev.num_dispatches
        y = F.conv2d(xw, ww, bw, s, p, d, g)
        if force is None and xdtype == "float32":
            assert dev.num_dispatches - d0 == 1, "float32 operands were copied to float16"
        assert y.dtype is wgpar.float16
        gy = rng.standard_normal(y.shape).astype(np.float16)
        assert conv_ops.PATHS[PATHS[case][0]] == 1, conv_ops.PATHS
        y.backward(wgpar.tensor(gy, dtype=wgpar.float16))
    assert conv_ops.PATHS[PATHS[case][1]] >= 1, conv_ops.PATHS
    want = conv2d_ref(x, wt, b, s, ((p[0], p[0]), (p[1], p[1])), d, g)
    assert _rel(y.numpy(), want) < 1e-3  # float16's rounding of each output
    gx, gw = conv2d_vjp(x, wt, gy, s, p, d, g)
    assert xw.grad.dtype is xw.dtype and ww.grad.dtype is wgpar.float32 and bw.grad.dtype is wgpar.float32
    # float32 math from the values as stored: float32 gradients to float32 rounding (the im2col path copies
    # its operands to the result's dtype first: float16 in the forward, float32 for float32 gradients)
    assert _rel(xw.grad.numpy(), gx) < (1e-3 if xdtype == "float16" else 2e-5), "input gradient"
    assert _rel(ww.grad.numpy(), gw) < 2e-5, "weight gradient"
    assert _rel(bw.grad.numpy(), gy.astype(np.float64).sum((0, 2, 3))) < 2e-5, "bias gradient"  # float32 sums


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_transpose2d_under_autocast_takes_a_float16_input_and_float32_weights(stride, rng, dev):
    """The adjoint convolution in float16 under autocast, as torch's: a float16 input (a convolution's output)
    with the layer's float32 weights gives a float16 output and gradients in each operand's dtype (this raised
    a dtype error before)."""
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    n, c, h, w, o, k = 2, 6, 5, 7, 4, 3
    x = rng.standard_normal((n, c, h, w)).astype(np.float16)
    wt = (rng.standard_normal((c, o, k, k)) / 4).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    xw = wgpar.tensor(x, dtype=wgpar.float16, requires_grad=True)
    ww, bw = wgpar.tensor(wt, requires_grad=True), wgpar.tensor(b, requires_grad=True)
    with wgpar.autocast():
        y = F.conv_transpose2d(xw, ww, bw, stride, 1)
        assert y.dtype is wgpar.float16
        gy = rng.standard_normal(y.shape).astype(np.float16)
        y.backward(wgpar.tensor(gy, dtype=wgpar.float16))
    # conv_transpose2d(x, w) is conv2d's input gradient for output gradient x over y's size (weight [c, o, k, k]
    # as conv2d's [out = c, in = o]); its gradients are conv2d of gy (input) and conv2d's weight gradient.
    s, p, dil = (stride, stride), (1, 1), (1, 1)
    want, _ = conv2d_vjp(np.zeros((n, o) + y.shape[2:]), wt, x, s, p, dil, 1)
    want = want + b[None, :, None, None]
    assert _rel(y.numpy(), want) < 1e-3
    gx = conv2d_ref(gy, wt, None, s, ((1, 1), (1, 1)), dil, 1)
    _, gw = conv2d_vjp(gy, wt, x, s, p, dil, 1)
    assert xw.grad.dtype is wgpar.float16 and ww.grad.dtype is wgpar.float32 and bw.grad.dtype is wgpar.float32
    assert _rel(xw.grad.numpy(), gx) < 1e-3
    assert _rel(ww.grad.numpy(), gw) < 2e-5
    assert _rel(bw.grad.numpy(), gy.astype(np.float64).sum((0, 2, 3))) < 2e-5


def test_autocast_conv_saves_no_float16_copies(rng, dev):
    """The graph of a convolution under autocast holds its float32 input and weight as they are: between
    forward and backward only the float16 output is new (the float16 copies of input and weight are gone)."""
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    x = wgpar.tensor(rng.standard_normal((4, 16, 20, 20)).astype(np.float32), requires_grad=True)
    w = wgpar.tensor(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), requires_grad=True)
    wgpar.synchronize(dev)
    base = wgpar.memory_stats(dev)["allocated_bytes"]
    with wgpar.autocast():
        y = F.conv2d(x, w, None, 1, 1)
    wgpar.synchronize(dev)
    held = wgpar.memory_stats(dev)["allocated_bytes"] - base
    assert held == y.numel() * 2, f"{held} bytes held, the float16 output is {y.numel() * 2}"
