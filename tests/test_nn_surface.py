"""torch.nn.functional forms and layers a PyTorch user types in the first week, against NumPy float64
(values, and gradients by central differences) and, through the torch fixture, against PyTorch."""

from __future__ import annotations

import inspect
import re
import warnings

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

from .gradcheck import check
from .helpers import assert_close


def _t(a, requires_grad=False):
    return wgpar.tensor(np.asarray(a, np.float32), requires_grad=requires_grad)


def _backward_like_torch(torch, f_w, f_t, arrays, rng, rtol=1e-4, atol=1e-5):
    """Forward and backward of f_w (wgpar) and f_t (torch, float64) on the same inputs and upstream gradient."""
    ws = [_t(a, True) for a in arrays]
    ts = [torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in arrays]
    yw, yt = f_w(*ws), f_t(*ts)
    assert_close(yw.numpy(), yt.detach().numpy(), rtol, atol, "forward")
    g = rng.standard_normal(yt.shape)
    yw.backward(_t(g))
    yt.backward(torch.tensor(g))
    for k, (w, t) in enumerate(zip(ws, ts)):
        assert_close(w.grad.numpy(), t.grad.numpy(), rtol, atol, f"grad {k}")


# -- activations -----------------------------------------------------------------------------------
def _np_silu(x):
    return x / (1 + np.exp(-x))


def _np_leaky(x, s=0.01):
    return np.where(x > 0, x, s * x)


def _np_elu(x, a=1.0):
    return np.where(x > 0, x, a * np.expm1(np.minimum(x, 0)))


@pytest.mark.parametrize("name", ["silu", "leaky_relu", "elu"])
def test_activations_against_numpy(name, rng):
    x = rng.standard_normal((7, 13)) * 3
    f_w, f_np = {"silu": (F.silu, _np_silu),
                 "leaky_relu": (lambda t: F.leaky_relu(t, 0.23), lambda a: _np_leaky(a, 0.23)),
                 "elu": (lambda t: F.elu(t, 1.7), lambda a: _np_elu(a, 1.7))}[name]
    check(f_w, f_np, [x], rng)
    module = {"silu": nn.SiLU(), "leaky_relu": nn.LeakyReLU(0.23), "elu": nn.ELU(1.7)}[name]
    assert_close(module(_t(x)).numpy(), f_np(x), 1e-5, 1e-6)


def test_activation_edges_match_torch(rng, torch):
    x = np.array([0.0, -0.0, 1e-30, -50.0, 50.0, 100.0, -100.0, np.inf, -np.inf, np.nan])
    for f_w, f_t in ((F.silu, torch.nn.functional.silu),
                     (lambda t: F.leaky_relu(t, 0.3), lambda t: torch.nn.functional.leaky_relu(t, 0.3)),
                     (lambda t: F.elu(t, 0.5), lambda t: torch.nn.functional.elu(t, 0.5))):
        xw = _t(x, True)
        xt = torch.tensor(x, dtype=torch.float32, requires_grad=True)
        yw, yt = f_w(xw), f_t(xt)
        np.testing.assert_allclose(yw.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-20)
        yw.sum().backward()
        yt.sum().backward()
        finite = np.isfinite(x)  # silu's gradient at +-inf is NaN in both, by different routes
        np.testing.assert_allclose(xw.grad.numpy()[finite], xt.grad.numpy()[finite], rtol=1e-5, atol=1e-20)


def test_activation_modules_repr_and_inplace():
    assert repr(nn.SiLU()) == "SiLU()"
    assert repr(nn.LeakyReLU()) == "LeakyReLU(negative_slope=0.01)"
    assert repr(nn.ELU(0.5)) == "ELU(alpha=0.5)"
    assert repr(nn.Identity()) == "Identity()"
    x = _t([1.0, -2.0])
    assert nn.Identity(54, unused="argument")(x) is x
    for f in (F.silu, F.leaky_relu, F.elu):
        with pytest.raises(ValueError, match="inplace"):
            f(x, inplace=True)
    with pytest.raises(ValueError, match="inplace"):
        nn.SiLU(inplace=True)


# -- one_hot ---------------------------------------------------------------------------------------
def test_one_hot(rng):
    idx = rng.integers(0, 11, (4, 7))
    got = F.one_hot(wgpar.tensor(idx.astype(np.int32)))
    assert got.dtype is wgpar.int32 and got.shape == (4, 7, idx.max() + 1)
    np.testing.assert_array_equal(got.numpy(), np.eye(idx.max() + 1, dtype=np.int32)[idx])
    np.testing.assert_array_equal(F.one_hot(idx.astype(np.int32), 13).numpy(), np.eye(13, dtype=np.int32)[idx])
    with pytest.raises(ValueError, match="smaller than num_classes"):
        F.one_hot(wgpar.tensor(np.array([0, 5], np.int32)), 3)
    with pytest.raises(ValueError, match="non-negative"):
        F.one_hot(wgpar.tensor(np.array([0, -1], np.int32)))
    with pytest.raises(TypeError, match="index tensor"):
        F.one_hot(_t([0.0, 1.0]))
    assert F.one_hot(wgpar.tensor(np.zeros((0,), np.int32)), 4).shape == (0, 4)


# -- pad -------------------------------------------------------------------------------------------
_NP_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _np_pad(x, pad, mode, value=0.0):
    k = len(pad) // 2
    for i in range(k):  # crop (negative pads) first, as torch
        d = x.ndim - 1 - i
        lo, hi = -min(pad[2 * i], 0), x.shape[d] + min(pad[2 * i + 1], 0)
        x = np.take(x, np.arange(lo, hi), axis=d)
    widths = [(0, 0)] * x.ndim
    for i in range(k):
        widths[x.ndim - 1 - i] = (max(pad[2 * i], 0), max(pad[2 * i + 1], 0))
    kw = {"constant_values": value} if mode == "constant" else {}
    return np.pad(x, widths, mode=_NP_MODE[mode], **kw)


CASES = [
    ("constant", (5,), (2, 3)), ("constant", (3, 4, 5), (1, -2, 0, 3, 2, 1)), ("constant", (2, 3, 4, 5), (1, 1)),
    ("constant", (2, 3, 2, 2, 3), (1, 0, 0, 1, 2, 2, 1, 1, 0, 1)),
    ("reflect", (3, 7), (2, 6)), ("reflect", (2, 3, 7), (3, 1)), ("reflect", (2, 5, 6), (2, 3, 4, 1)),
    ("reflect", (2, 3, 5, 6), (-1, 2, 4, 0)), ("reflect", (2, 3, 4, 5, 3), (1, 2, 3, 0, 2, 1)),
    ("replicate", (3, 7), (4, 9)), ("replicate", (2, 3, 5, 6), (2, 3, 4, 5)), ("replicate", (3, 4, 5, 6), (1,) * 6),
    ("circular", (2, 3, 7), (7, 3)), ("circular", (2, 3, 5, 6), (2, 6, 1, 5)),
]


@pytest.mark.parametrize("mode,shape,pad", CASES)
def test_pad_against_numpy(mode, shape, pad, rng):
    x = rng.standard_normal(shape)
    value = 0.75 if mode == "constant" else None
    check(lambda t: F.pad(t, pad, mode, value), lambda a: _np_pad(a, pad, mode, value or 0.0), [x], rng)


@pytest.mark.parametrize("mode,shape,pad", CASES)
def test_pad_matches_torch(mode, shape, pad, rng, torch):
    x = rng.standard_normal(shape)
    _backward_like_torch(torch, lambda t: F.pad(t, pad, mode), lambda t: torch.nn.functional.pad(t, pad, mode),
                         [x], rng)


def test_pad_errors():
    x = _t(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="divisible by 2"):
        F.pad(x, (1, 2, 3))
    with pytest.raises(ValueError, match="less than or equal to two times"):
        F.pad(x, (1,) * 8)
    with pytest.raises(ValueError, match="not supported for 3D"):
        F.pad(x, (1,) * 6, mode="reflect")
    with pytest.raises(ValueError, match="less than its size 4"):
        F.pad(x, (4, 0), mode="reflect")
    with pytest.raises(ValueError, match="at most its size 4"):
        F.pad(x, (5, 0), mode="circular")
    with pytest.raises(ValueError, match="doesn't take in value"):
        F.pad(x, (1, 1), mode="reflect", value=2.0)
    with pytest.raises(ValueError, match="unrecognised padding mode"):
        F.pad(x, (1, 1), mode="reflct")
    with pytest.raises(ValueError, match="cropping"):
        F.pad(x, (0, -5))
    assert F.pad(x, (0, -4)).shape == (2, 3, 0)


# -- normalize -------------------------------------------------------------------------------------
@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, -1), (3.0, 0)])
def test_normalize_against_numpy(p, dim, rng):
    x = rng.standard_normal((5, 6, 3))

    def f_np(a):
        return a / np.maximum((np.abs(a) ** p).sum(dim, keepdims=True) ** (1 / p), 1e-12)

    check(lambda t: F.normalize(t, p, dim), f_np, [x], rng)


def test_normalize_zero_row_matches_torch(rng, torch):
    x = rng.standard_normal((4, 5))
    x[2] = 0.0
    _backward_like_torch(torch, lambda t: F.normalize(t, dim=1, eps=1e-3),
                         lambda t: torch.nn.functional.normalize(t, dim=1, eps=1e-3), [x], rng)
    with pytest.raises(ValueError, match="out="):
        F.normalize(_t(x), out=_t(x))


# -- dropout2d -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 37, 3, 5), (37, 4, 3)])
def test_dropout2d_drops_whole_channels(shape, rng):
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    p = 0.3
    x = rng.standard_normal(shape) + 5.0  # no zeros of its own
    xt = _t(x, True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3-d input warns, as torch's
        y = F.dropout2d(xt, p)
        assert F.dropout2d(xt, p, training=False) is xt
        m = nn.Dropout2d(p)
        assert m.eval()(xt) is xt
    got = y.numpy().reshape(shape[0], shape[1], -1)
    dropped = (got == 0).all(-1)
    kept = ~dropped
    assert ((got == 0).any(-1) == dropped).all()  # a channel is all zero or not at all
    assert_close(got[kept], (x.reshape(got.shape) / (1 - p))[kept], 1e-5, 1e-5)
    assert 0.15 < dropped.mean() < 0.45
    g = rng.standard_normal(shape)
    y.backward(_t(g))
    want = g.reshape(got.shape) * kept[..., None] / (1 - p)
    assert_close(xt.grad.numpy().reshape(got.shape), want, 1e-5, 1e-5)
    assert repr(m) == "Dropout2d(p=0.3, inplace=False)"


def test_dropout2d_warns_as_torch():
    with pytest.warns(UserWarning, match="3D input"):
        F.dropout2d(_t(np.ones((2, 3, 4))))
    with pytest.warns(UserWarning, match="2-D input"):
        F.dropout2d(_t(np.ones((2, 3))))
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout2d(_t(np.ones((2, 3, 4, 4))), 1.5)
    assert (F.dropout2d(_t(np.ones((2, 3, 4, 4))), 1.0).numpy() == 0).all()


# -- embedding -------------------------------------------------------------------------------------
@pytest.mark.parametrize("padding_idx", [2, -1])
@pytest.mark.parametrize("host", [True, False])
def test_embedding_padding_idx(padding_idx, host, rng):
    w = rng.standard_normal((7, 5))
    idx = rng.integers(0, 7, (3, 11)).astype(np.int32)
    idx[0, :3] = padding_idx % 7
    wt = _t(w, True)
    y = F.embedding(idx if host else wgpar.tensor(idx), wt, padding_idx=padding_idx)
    assert_close(y.numpy(), w.astype(np.float32)[idx], 0, 0)
    g = rng.standard_normal(idx.shape + (5,))
    y.backward(_t(g))
    want = np.zeros_like(w)
    np.add.at(want, idx, g)
    want[padding_idx % 7] = 0.0
    assert_close(wt.grad.numpy(), want, 1e-5, 1e-5)


def test_embedding_module_padding_idx_and_errors(rng, torch):
    m = nn.Embedding(9, 4, padding_idx=-2)
    assert repr(m) == "Embedding(9, 4, padding_idx=7)" and m.padding_idx == 7
    np.testing.assert_array_equal(m.weight.numpy()[7], 0.0)  # torch zeroes the padding row at init
    ref = torch.nn.Embedding(9, 4, padding_idx=-2)
    m.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    idx = rng.integers(0, 9, (5,))
    assert_close(m(idx.astype(np.int32)).numpy(), ref(torch.tensor(idx)).detach().numpy(), 0, 0)
    w = _t(np.ones((4, 2)))
    with pytest.raises(ValueError, match="within num_embeddings"):
        F.embedding(np.array([0]), w, padding_idx=4)
    with pytest.raises(ValueError, match="max_norm"):
        F.embedding(np.array([0]), w, max_norm=1.0)
    with pytest.raises(ValueError, match="scale_grad_by_freq"):
        nn.Embedding(4, 2, sparse=True)


# -- interpolate -----------------------------------------------------------------------------------
def _np_src(n_in, n_out, scale, align_corners):
    dst = np.arange(n_out, dtype=np.float64)
    if align_corners:
        return dst * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    s = n_in / n_out if scale is None else 1.0 / scale
    return np.maximum(s * (dst + 0.5) - 0.5, 0.0)


def _np_interpolate(x, out_hw, scales, mode, align_corners):
    for axis, n_out, s in zip((2, 3), out_hw, scales):
        n_in = x.shape[axis]
        if mode == "nearest":
            s = n_in / n_out if s is None else 1.0 / s
            src = np.arange(n_out) if n_out == n_in else np.minimum(np.floor(np.arange(n_out) * s), n_in - 1)
            x = np.take(x, src.astype(int), axis=axis)
        else:
            src = _np_src(n_in, n_out, s, align_corners)
            i0 = np.minimum(np.floor(src).astype(int), n_in - 1)
            i1 = np.minimum(i0 + 1, n_in - 1)
            lam = (src - i0).reshape((-1,) + (1,) * (x.ndim - 1 - axis))
            x = np.take(x, i0, axis=axis) * (1 - lam) + np.take(x, i1, axis=axis) * lam
    return x


INTERP = [("nearest", None, (5, 9), None), ("nearest", None, None, 1.7), ("nearest", None, None, (2, 0.6)),
          ("bilinear", False, (7, 4), None), ("bilinear", True, (7, 11), None), ("bilinear", None, None, 2.3),
          ("bilinear", True, None, (0.5, 1.5)), ("bilinear", False, (1, 1), None)]


@pytest.mark.parametrize("mode,align,size,scale", INTERP)
def test_interpolate_against_numpy(mode, align, size, scale, rng):
    x = rng.standard_normal((2, 3, 5, 6))
    if size is not None:
        out_hw, scales = size, (None, None)
    else:
        sc = scale if isinstance(scale, tuple) else (scale, scale)
        out_hw, scales = tuple(int(np.floor(n * s)) for n, s in zip(x.shape[2:], sc)), sc
    check(lambda t: F.interpolate(t, size, scale, mode, align),
          lambda a: _np_interpolate(a, out_hw, scales, mode, bool(align)), [x], rng)


@pytest.mark.parametrize("mode,align,size,scale", INTERP)
def test_interpolate_matches_torch(mode, align, size, scale, rng, torch):
    x = rng.standard_normal((2, 3, 5, 6))
    _backward_like_torch(torch, lambda t: F.interpolate(t, size, scale, mode, align),
                         lambda t: torch.nn.functional.interpolate(t, size, scale, mode, align), [x], rng)


def test_interpolate_errors():
    x = _t(np.zeros((1, 1, 3, 3)))
    with pytest.raises(ValueError, match="align_corners option"):
        F.interpolate(x, size=5, align_corners=True)
    with pytest.raises(ValueError, match="'bicubic' is not supported"):
        F.interpolate(x, size=5, mode="bicubic")
    with pytest.raises(ValueError, match="4-d input"):
        F.interpolate(_t(np.zeros((1, 1, 3))), size=5)
    with pytest.raises(ValueError, match="either size or scale_factor"):
        F.interpolate(x)
    with pytest.raises(ValueError, match="antialias"):
        F.interpolate(x, size=2, mode="bilinear", antialias=True)


# -- GroupNorm, RMSNorm, AdaptiveAvgPool2d -----------------------------------------------------------
def _np_group_norm(x, g, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    xg = x.reshape(n, g, -1)
    y = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + eps)).reshape(x.shape)
    per = (c,) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(per)) + (0 if b is None else b.reshape(per))


@pytest.mark.parametrize("shape,groups", [((3, 6, 5, 7), 3), ((2, 5, 9), 5), ((4, 6), 1)])
def test_group_norm_against_numpy(shape, groups, rng):
    x = rng.standard_normal(shape) * 2 + 1
    w, b = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    check(lambda t, tw, tb: F.group_norm(t, groups, tw, tb, 1e-3),
          lambda a, aw, ab: _np_group_norm(a, groups, aw, ab, 1e-3), [x, w, b], rng)


def _np_rms(x, k, w=None, eps=1e-6):
    axes = tuple(range(x.ndim - k, x.ndim))
    y = x / np.sqrt((x * x).mean(axes, keepdims=True) + eps)
    return y if w is None else y * w


@pytest.mark.parametrize("shape,k", [((5, 7), 1), ((2, 3, 4, 5), 2)])
def test_rms_norm_against_numpy(shape, k, rng):
    x = rng.standard_normal(shape)
    w = rng.standard_normal(shape[x.ndim - k:])
    check(lambda t, tw: F.rms_norm(t, shape[x.ndim - k:], tw, 1e-6), lambda a, aw: _np_rms(a, k, aw), [x, w], rng)
    eps32 = float(np.finfo(np.float32).eps)  # eps=None: the dtype's epsilon
    tiny = x * 1e-4
    assert_close(F.rms_norm(_t(tiny), shape[x.ndim - k:]).numpy(), _np_rms(tiny, k, eps=eps32), 1e-4, 1e-5)


def _np_adaptive(x, out_hw):
    h, w = x.shape[-2:]
    oh, ow = out_hw
    out = np.zeros(x.shape[:-2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, r1 = (i * h) // oh, -(-((i + 1) * h) // oh)
            c0, c1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            out[..., i, j] = x[..., r0:r1, c0:c1].mean((-2, -1))
    return out


@pytest.mark.parametrize("shape,size,out_hw", [((2, 3, 7, 10), (3, 4), (3, 4)), ((3, 5, 6), 1, (1, 1)),
                                               ((2, 2, 5, 9), (None, 4), (5, 4)), ((1, 2, 4, 6), 6, (6, 6))])
def test_adaptive_avg_pool2d_against_numpy(shape, size, out_hw, rng):
    x = rng.standard_normal(shape)
    check(lambda t: F.adaptive_avg_pool2d(t, size), lambda a: _np_adaptive(a, out_hw), [x], rng)
    assert_close(nn.AdaptiveAvgPool2d(size)(_t(x)).numpy(), _np_adaptive(x, out_hw), 1e-5, 1e-5)


def test_normalization_layers_load_torch_state_dicts(rng, torch):
    pairs = [(nn.GroupNorm(3, 6), torch.nn.GroupNorm(3, 6), (4, 6, 5, 3)),
             (nn.GroupNorm(2, 4, affine=False), torch.nn.GroupNorm(2, 4, affine=False), (3, 4, 7)),
             (nn.RMSNorm(5), torch.nn.RMSNorm(5), (3, 5)),
             (nn.RMSNorm([3, 4], eps=1e-3, elementwise_affine=False),
              torch.nn.RMSNorm([3, 4], eps=1e-3, elementwise_affine=False), (2, 3, 4)),
             (nn.AdaptiveAvgPool2d((3, None)), torch.nn.AdaptiveAvgPool2d((3, None)), (2, 3, 7, 5)),
             (nn.AdaptiveAvgPool2d(3), torch.nn.AdaptiveAvgPool2d(3), (2, 8, 7)),
             (nn.Embedding(5, 3, padding_idx=0), torch.nn.Embedding(5, 3, padding_idx=0), None)]
    group_norm_bias = "bias" in inspect.signature(torch.nn.GroupNorm).parameters  # torch >= 2.12 (GPU machine: 2.11)
    if group_norm_bias:
        pairs.append((nn.GroupNorm(2, 4, bias=False), torch.nn.GroupNorm(2, 4, bias=False), (3, 4, 7)))
    for ours, theirs, shape in pairs:
        if group_norm_bias or not isinstance(ours, nn.GroupNorm):  # an older torch's repr lacks bias=
            assert repr(ours) == repr(theirs)
        sd = theirs.state_dict()
        assert list(ours.state_dict()) == list(sd)
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(torch.randn(p.shape))
        ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
        if shape is None:
            continue
        x = rng.standard_normal(shape)
        _backward_like_torch(torch, ours, lambda t, m=theirs: m.double()(t), [x], rng)


def test_normalization_errors():
    with pytest.raises(ValueError, match="divisible by num_groups"):
        nn.GroupNorm(3, 4)
    with pytest.raises(ValueError, match="divisible by num_groups"):
        F.group_norm(_t(np.zeros((2, 4, 3))), 3)
    with pytest.raises(ValueError, match="does not end with"):
        F.rms_norm(_t(np.zeros((2, 4))), (3,))
    with pytest.raises(ValueError, match="output_size"):
        F.adaptive_avg_pool2d(_t(np.zeros((1, 2, 4, 4))), (0, 2))


def test_layer_norm_without_bias_matches_torch(rng, torch):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    for kw in ({}, {"bias": False}, {"elementwise_affine": False}):
        ours, theirs = nn.LayerNorm(5, **kw), torch.nn.LayerNorm(5, **kw)
        mine = repr(ours) if "bias=" in repr(theirs) else re.sub(r", bias=\w+", "", repr(ours))  # torch < 2.12
        assert mine == repr(theirs) and list(ours.state_dict()) == list(theirs.state_dict()), kw
        assert_close(ours(wgpar.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), 1e-5, 1e-5)


def test_kaiming_uniform_and_calculate_gain_match_torch(torch):
    for name, param in [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None), ("relu", None),
                        ("leaky_relu", None), ("leaky_relu", 0.2), ("leaky_relu", 0), ("selu", None)]:
        assert nn.init.calculate_gain(name, param) == pytest.approx(torch.nn.init.calculate_gain(name, param))
    for mode in ("fan_in", "fan_out"):
        for nonlinearity, a in [("leaky_relu", 0.0), ("leaky_relu", 0.3), ("relu", 0.0), ("tanh", 0.0)]:
            w, tw = wgpar.zeros(64, 8, 3), torch.zeros(64, 8, 3)
            nn.init.kaiming_uniform_(w, a, mode, nonlinearity)
            torch.nn.init.kaiming_uniform_(tw, a, mode, nonlinearity)
            got, want = np.abs(w.numpy()).max(), np.abs(tw.numpy()).max()  # the same bound, other draws
            assert want * 0.95 < got <= want / 0.99 and np.abs(w.numpy()).max() > 0, (mode, nonlinearity, a)
    with pytest.raises(ValueError, match="Mode"):
        nn.init.kaiming_uniform_(wgpar.zeros(4, 4), mode="fan_avg")
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.init.kaiming_uniform_(wgpar.zeros(4, 4), nonlinearity="swish")
