"""ConvTranspose1d / ConvTranspose2d and conv_transpose1d / 2d: forward against a NumPy float64 scatter
reference, gradients against finite differences and PyTorch (state dicts loaded), on awkward sizes (stride,
padding, output_padding, dilation, groups), chunked batches, and the adjoint identity with conv2d."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F
from wgpar.ops import conv as conv_ops

from . import gradcheck
from .helpers import assert_close


def conv_transpose2d_ref(x, w, b=None, stride=(1, 1), padding=(0, 0), output_padding=(0, 0), groups=1,
                         dilation=(1, 1)):
    """Each input element scatters weight-scaled copies of its kernel into the output, in float64."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    _, cog, kh, kw = w.shape
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = stride, padding, output_padding, dilation
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    full = np.zeros((n, groups * cog, oh + 2 * ph + sh * h + dh * kh, ow + 2 * pw + sw * wd + dw * kw))
    cig = c // groups
    for g in range(groups):
        xg = x[:, g * cig:(g + 1) * cig]
        wg = w[g * cig:(g + 1) * cig]
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", xg, wg[:, :, i, j])
                full[:, g * cog:(g + 1) * cog, i * dh:i * dh + sh * h:sh, j * dw:j * dw + sw * wd:sw] += contrib
    y = full[:, :, ph:ph + oh, pw:pw + ow]
    return y if b is None else y + b.astype(np.float64)[None, :, None, None]


# (N, C_in, H, W, C_out, kernel, stride, padding, output_padding, groups, dilation)
CASES = [
    (2, 3, 4, 5, 5, (3, 2), (2, 1), (1, 0), (1, 0), 1, (1, 2)),
    (1, 4, 3, 3, 6, 3, 2, 1, 1, 2, 1),
    (3, 6, 5, 2, 6, 2, 3, 0, 2, 6, 1),          # depthwise, output_padding 2 < stride 3
    (2, 2, 6, 7, 3, (1, 3), (1, 2), (0, 2), (0, 1), 1, (1, 1)),
    (1, 3, 2, 4, 4, 2, 1, 0, (1, 0), 1, 2),     # output_padding below dilation, stride 1
]


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])))
def test_forward_and_gradients_match_numpy(case, rng):
    n, c, h, w, o, k, s, p, op, g, d = case
    kh, kw = _pair(k)
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((c, o // g, kh, kw)) * 0.5
    b = rng.standard_normal(o)
    kw_args = dict(stride=s, padding=p, output_padding=op, groups=g, dilation=d)
    ref_args = dict(stride=_pair(s), padding=_pair(p), output_padding=_pair(op), groups=g, dilation=_pair(d))
    gradcheck.check(lambda x, w, b: nn.conv_transpose2d(x, w, b, **kw_args),
                    lambda x, w, b: conv_transpose2d_ref(x, w, b, **ref_args), [x, wt, b], rng)


def test_adjoint_of_conv2d(rng):
    """<conv2d(u, w), v> = <u, conv_transpose2d(v, w)>: the same window and weight, transposed roles."""
    u = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    wt = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    kw = dict(stride=(2, 3), padding=(1, 1), dilation=(2, 1), groups=2)
    cu = F.conv2d(wgpar.tensor(u), wgpar.tensor(wt), **kw)
    v = rng.standard_normal(cu.shape).astype(np.float32)
    op = (9 + 2 - 2 * 2 - 1) % 2, (8 + 2 - 1 - 1) % 3  # the rows / columns the strided conv left unread
    tv = nn.conv_transpose2d(wgpar.tensor(v), wgpar.tensor(wt), output_padding=op, **kw)
    assert tv.shape == u.shape
    lhs = np.sum(cu.numpy().astype(np.float64) * v)
    rhs = np.sum(u.astype(np.float64) * tv.numpy())
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(lhs))


def test_chunked_batches_match_one_chunk(rng, monkeypatch):
    x = rng.standard_normal((5, 3, 6, 5)).astype(np.float32)
    wt = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    want = conv_transpose2d_ref(x, wt, b, (2, 2), (1, 1), (1, 0))
    xw = wgpar.tensor(x, requires_grad=True)
    ww, bw = wgpar.tensor(wt, requires_grad=True), wgpar.tensor(b, requires_grad=True)
    y = nn.conv_transpose2d(xw, ww, bw, stride=2, padding=1, output_padding=(1, 0))
    y.sum().backward()
    grads = [t.grad.numpy() for t in (xw, ww, bw)]
    patch_bytes = 4 * 9 * 6 * 5 * 4  # one image's patches of the adjoint conv: 4 channels, 3x3, 6x5 positions
    monkeypatch.setattr(conv_ops, "WORKSPACE_BYTES", 2 * patch_bytes)  # chunks of two images
    monkeypatch.setattr(conv_ops, "_force", "im2col")
    assert len(conv_ops.chunks(wgpar.ops.window.window((5, 4, 12, 9), 3, 2, 1, 1, "t"), y)) == 3
    xw2 = wgpar.tensor(x, requires_grad=True)
    ww2, bw2 = wgpar.tensor(wt, requires_grad=True), wgpar.tensor(b, requires_grad=True)
    y2 = nn.conv_transpose2d(xw2, ww2, bw2, stride=2, padding=1, output_padding=(1, 0))
    assert_close(y2.numpy(), want, 1e-5, 1e-5, "chunked forward")
    y2.sum().backward()
    for what, a, t in zip(("x", "w", "b"), grads, (xw2, ww2, bw2)):
        assert_close(t.grad.numpy(), a, 1e-5, 1e-5, what)


@pytest.mark.parametrize("args", [
    dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2),
         groups=2, dilation=(1, 2)),
    dict(in_channels=3, out_channels=5, kernel_size=4, stride=2, padding=1, bias=False),
], ids=["grouped", "upsample"])
def test_module_loads_torch_and_matches(args, rng, torch):
    tm, wm = torch.nn.ConvTranspose2d(**args), nn.ConvTranspose2d(**args)
    assert list(wm.state_dict()) == list(tm.state_dict())
    assert wm.weight.shape == tuple(tm.weight.shape)
    wm.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = rng.standard_normal((2, args["in_channels"], 5, 4)).astype(np.float32)
    xt, xw = torch.tensor(x, requires_grad=True), wgpar.tensor(x, requires_grad=True)
    to, wo = tm(xt), wm(xw)
    assert_close(wo.numpy(), to.detach().numpy(), 1e-5, 1e-5, "output")
    g = rng.standard_normal(to.shape).astype(np.float32)
    to.backward(torch.tensor(g))
    wo.backward(wgpar.tensor(g))
    assert_close(xw.grad.numpy(), xt.grad.numpy(), 1e-4, 1e-5, "input grad")
    for k, p in tm.named_parameters():
        assert_close(getattr(wm, k).grad.numpy(), p.grad.numpy(), 1e-4, 1e-4, k)
    # Unbatched, and output_size choosing output_padding as torch does.
    size = (to.shape[2] + 1, to.shape[3]) if args["kernel_size"] == 4 else tuple(to.shape[2:])
    assert_close(wm(xw[0], output_size=size).numpy(), tm(xt[0], output_size=size).detach().numpy(), 1e-5, 1e-5,
                 "unbatched with output_size")


def test_conv_transpose1d_matches_torch(rng, torch):
    tm = torch.nn.ConvTranspose1d(4, 6, 3, stride=3, padding=1, output_padding=2, groups=2, dilation=2)
    wm = nn.ConvTranspose1d(4, 6, 3, stride=3, padding=1, output_padding=2, groups=2, dilation=2)
    wm.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = rng.standard_normal((3, 4, 7)).astype(np.float32)
    xt, xw = torch.tensor(x, requires_grad=True), wgpar.tensor(x, requires_grad=True)
    to, wo = tm(xt), wm(xw)
    assert wo.shape == tuple(to.shape)
    assert_close(wo.numpy(), to.detach().numpy(), 1e-5, 1e-5, "output")
    to.sum().backward()
    wo.sum().backward()
    assert_close(xw.grad.numpy(), xt.grad.numpy(), 1e-4, 1e-5, "input grad")
    assert_close(wm.weight.grad.numpy(), tm.weight.grad.numpy(), 1e-4, 1e-4, "weight grad")


def test_errors():
    x = wgpar.zeros(1, 4, 3, 3)
    w = wgpar.zeros(4, 2, 3, 3)
    with pytest.raises(ValueError, match="output_padding"):
        nn.conv_transpose2d(x, w, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="groups=3"):
        nn.conv_transpose2d(x, w, groups=3)
    with pytest.raises(ValueError, match="in_channels = weight.shape"):
        nn.conv_transpose2d(x, wgpar.zeros(3, 2, 3, 3))
    with pytest.raises(ValueError, match="output of size"):
        nn.conv_transpose2d(x, w, padding=3)
    with pytest.raises(ValueError, match="output_size"):
        nn.ConvTranspose2d(4, 2, 3, stride=2)(x, output_size=(9, 9))
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.ConvTranspose2d(4, 3, 3, groups=2)


@pytest.mark.parametrize("kw", [
    dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2, dilation=(1, 2)),
    dict(stride=1, padding=2, dilation=2),
    dict(stride=3, padding=1, output_padding=(0, 3), dilation=(2, 4), groups=6),  # depthwise adjoint
], ids=["grouped", "dilated", "depthwise"])
def test_functional_conv_transpose2d_matches_torch(kw, rng, torch):
    g = kw.get("groups", 1)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((2, 6, 5, 4), (6, 12 // g, 3, 2), (12,))]
    ours = [wgpar.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = wgpar.nn.functional.conv_transpose2d(*ours, **kw)
    yt = torch.nn.functional.conv_transpose2d(*theirs, **kw)
    assert_close(y.numpy(), yt.detach().numpy(), 1e-4, 1e-4, "output")
    gy = rng.standard_normal(yt.shape).astype(np.float32)
    y.backward(wgpar.tensor(gy))
    yt.backward(torch.tensor(gy))
    for a, t, what in zip(ours, theirs, ("input", "weight", "bias")):
        assert_close(a.grad.numpy(), t.grad.numpy(), 1e-4, 1e-4, what)
    x1 = rng.standard_normal((2, 6, 7)).astype(np.float32)
    w1 = rng.standard_normal((6, 4, 3)).astype(np.float32)
    assert_close(wgpar.nn.functional.conv_transpose1d(wgpar.tensor(x1), wgpar.tensor(w1), stride=2, groups=2).numpy(),
                 torch.nn.functional.conv_transpose1d(torch.tensor(x1), torch.tensor(w1), stride=2, groups=2).numpy(),
                 1e-4, 1e-4, "conv_transpose1d")


def test_few_output_channels_take_the_direct_kernel(rng, torch):
    """A transposed conv to 3 channels (an image decoder's last layer) is a 3-channel conv's input gradient:
    the direct kernel, forced here as on a GPU."""
    tm, wm = torch.nn.ConvTranspose2d(16, 3, 4, stride=2, padding=1), nn.ConvTranspose2d(16, 3, 4, stride=2, padding=1)
    wm.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = rng.standard_normal((2, 16, 7, 5)).astype(np.float32)
    conv_ops.PATHS.clear()
    with conv_ops.force_path("direct"):
        y = wm(wgpar.tensor(x))
    assert conv_ops.PATHS == {"direct": 1}, conv_ops.PATHS
    assert_close(y.numpy(), tm(torch.tensor(x)).detach().numpy(), 1e-4, 1e-4, "output")
