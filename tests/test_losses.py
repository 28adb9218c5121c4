"""Losses with torch's options (ignore_index, weight, label_smoothing, probability targets, [N, C, d...]
inputs, pos_weight, beta / delta, log_target, every reduction) against NumPy float64 (values, and
gradients by central differences) and, through the torch fixture, against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

from .gradcheck import check
from .helpers import assert_close


def _t(a, requires_grad=False):
    return wgpar.tensor(np.asarray(a, np.float32), requires_grad=requires_grad)


def _log_softmax(x, axis=1):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def np_cross_entropy(x, t, w=None, ignore=-100, reduction="mean", smoothing=0.0, log_probs=False):
    """torch's cross_entropy (nll_loss with ``log_probs``) for class-index targets, in float64."""
    c = x.shape[1]
    lp = x if log_probs else _log_softmax(x)
    rows = np.moveaxis(lp, 1, -1).reshape(-1, c)
    tt = t.reshape(-1)
    keep = tt != ignore
    safe = np.where(keep, tt, 0)
    wv = np.ones(c) if w is None else w
    with np.errstate(invalid="ignore"):  # an ignored row's -inf times a zero smoothing: masked below
        per = (1 - smoothing) * -wv[safe] * rows[np.arange(len(tt)), safe] + smoothing / c * -(rows * wv).sum(-1)
    per = np.where(keep, per, 0.0)
    if reduction == "none":
        return per.reshape(t.shape)
    return per.sum() if reduction == "sum" else per.sum() / (wv[safe] * keep).sum()


def np_cross_entropy_probs(x, p, w=None, reduction="mean", smoothing=0.0):
    c = x.shape[1]
    p = p * (1 - smoothing) + smoothing / c
    wv = np.ones(c) if w is None else w
    per = -(_log_softmax(x) * p * wv.reshape((c,) + (1,) * (x.ndim - 2))).sum(1)
    return per if reduction == "none" else per.sum() if reduction == "sum" else per.sum() / per.size


def _targets(rng, shape, c, ignore):
    t = rng.integers(0, c, shape)
    flat = t.reshape(-1)
    flat[:: 3] = ignore  # every third entry ignored
    if (flat == ignore).all():  # the rest drawn as ignore_index too (1 in 625 for 7 targets of 5 classes):
        flat[1] = (ignore + 1) % c  # keep one, as 0 / 0 is test_cross_entropy_unbatched_and_all_ignored's case
    return t


SHAPES = [(7, 5), (3, 4, 6), (2, 3, 4, 5)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, -100, 2])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_options_against_numpy(shape, weighted, ignore, smoothing, reduction, rng):
    c = shape[1]
    x = rng.standard_normal(shape) * 2
    tshape = shape[:1] + shape[2:]
    t = rng.integers(0, c, tshape) if ignore is None else _targets(rng, tshape, c, ignore)
    w = rng.uniform(0.2, 2.0, c) if weighted else None
    kw = {} if ignore is None else {"ignore_index": ignore}
    wt = None if w is None else _t(w)
    check(lambda z: F.cross_entropy(z, t.astype(np.int32), wt, reduction=reduction, label_smoothing=smoothing,
                                    **kw),
          lambda z: np_cross_entropy(z, t, w, -100 if ignore is None else ignore, reduction, smoothing), [x], rng)
    if ignore is None or smoothing:
        return
    logp = _log_softmax(x)  # nll_loss takes the same options, on log-probabilities
    check(lambda z: F.nll_loss(z, wgpar.tensor(t.astype(np.int32)), wt, reduction=reduction, **kw),
          lambda z: np_cross_entropy(z, t, w, ignore, reduction, log_probs=True), [logp], rng)


@pytest.mark.parametrize("shape", [(6, 4), (2, 5, 3, 2)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_probability_targets_against_numpy(shape, weighted, smoothing, reduction, rng):
    x = rng.standard_normal(shape)
    p = np.exp(_log_softmax(rng.standard_normal(shape)))
    w = rng.uniform(0.2, 2.0, shape[1]) if weighted else None
    check(lambda z, q: F.cross_entropy(z, q, None if w is None else _t(w), reduction=reduction,
                                       label_smoothing=smoothing),
          lambda z, q: np_cross_entropy_probs(z, q, w, reduction, smoothing), [x, p], rng)


def test_cross_entropy_unbatched_and_all_ignored(rng):
    x = rng.standard_normal(6)
    check(lambda z: F.cross_entropy(z, np.array(4, np.int32)), lambda z: -_log_softmax(z[None])[0, 4], [x], rng)
    out = F.cross_entropy(_t(x), np.array(4, np.int32), reduction="none")
    assert out.shape == () and abs(out.item() + _log_softmax(x[None])[0, 4]) < 1e-5
    z = _t(rng.standard_normal((3, 4)), True)
    for smoothing in (0.0, 0.15):
        loss = F.cross_entropy(z, np.full(3, 2, np.int32), ignore_index=2, label_smoothing=smoothing)
        assert np.isnan(loss.item())  # 0 / 0, as torch
        z.grad = None
        loss.backward()
        assert not z.grad.numpy().any()  # and a zero gradient, as torch's (not NaN)
    loss = F.cross_entropy(z, np.full(3, -100, np.int32))
    assert np.isnan(loss.item())
    assert F.cross_entropy(z, np.full(3, -100, np.int32), reduction="sum").item() == 0.0


def test_ignored_rows_with_infinite_logits_stay_out(rng):
    x = rng.standard_normal((4, 3))
    x[1, 0] = -np.inf  # an ignored row whose class-0 log-probability is -inf: no NaN may leak out
    xt = _t(x, True)
    t = np.array([2, -100, 1, 0], np.int32)
    loss = F.cross_entropy(xt, t)
    loss.backward()
    assert_close(loss.item(), np_cross_entropy(x, t), 1e-5, 1e-6)
    assert np.isfinite(xt.grad.numpy()).all() and (xt.grad.numpy()[1] == 0).all()


def test_device_targets_with_ignore_index_read_back_once(rng):
    x = rng.standard_normal((5, 4))
    t = wgpar.tensor(np.array([1, 3, 0, 2, 1], np.int32)) - 1  # -1 only known on the device
    got = F.cross_entropy(_t(x), t, ignore_index=-1).item()
    assert_close(got, np_cross_entropy(x, np.array([0, 2, -1, 1, 0]), ignore=-1), 1e-5, 1e-6)
    with pytest.raises(IndexError, match="4 classes"):
        F.cross_entropy(_t(x), t + 4, ignore_index=-1)


CE_TORCH = [((7, 5), {}), ((3, 4, 6), {"weight": True, "ignore_index": 1}),
            ((2, 3, 4, 5), {"label_smoothing": 0.2, "weight": True}), ((9, 4), {"ignore_index": -100}),
            ((4, 6), {"label_smoothing": 0.1, "ignore_index": 0, "weight": True, "reduction": "sum"}),
            ((3, 5, 2), {"reduction": "none", "ignore_index": 3, "label_smoothing": 0.05}),
            ((6, 3), {"probs": True, "weight": True, "label_smoothing": 0.3}),
            ((2, 4, 3), {"probs": True, "reduction": "none"})]


@pytest.mark.parametrize("shape,opts", CE_TORCH)
def test_cross_entropy_and_nll_match_torch(shape, opts, rng, torch):
    opts = dict(opts)
    c = shape[1]
    x = rng.standard_normal(shape)
    w = rng.uniform(0.2, 2.0, c) if opts.pop("weight", False) else None
    ignore = opts.get("ignore_index", -100)
    if opts.pop("probs", False):
        tgt = np.exp(_log_softmax(rng.standard_normal(shape)))
        ours, theirs = _t(tgt), torch.tensor(tgt)
    else:
        tgt = _targets(rng, shape[:1] + shape[2:], c, ignore)
        ours, theirs = tgt.astype(np.int32), torch.tensor(tgt)
    xw, xt = _t(x, True), torch.tensor(x, requires_grad=True)
    lw = nn.CrossEntropyLoss(None if w is None else _t(w), **opts)(xw, ours)
    lt = torch.nn.CrossEntropyLoss(None if w is None else torch.tensor(w), **opts)(xt, theirs)
    assert_close(lw.numpy(), lt.detach().numpy(), 1e-5, 1e-6, "loss")
    g = rng.standard_normal(lt.shape)
    lw.backward(_t(g) if lt.ndim else None) if lt.ndim else (lw * float(g)).backward()
    lt.backward(torch.tensor(g))
    assert_close(xw.grad.numpy(), xt.grad.numpy(), 1e-5, 1e-6, "grad")
    if tgt.dtype.kind == "i" and "label_smoothing" not in opts:
        lp = _log_softmax(x)
        got = nn.NLLLoss(None if w is None else _t(w), **opts)(_t(lp), ours)
        want = torch.nn.NLLLoss(None if w is None else torch.tensor(w), **opts)(torch.tensor(lp), theirs)
        assert_close(got.numpy(), want.numpy(), 1e-5, 1e-6, "nll_loss")


# -- binary cross entropy --------------------------------------------------------------------------
def np_bce(x, t, w=None, reduction="mean"):
    per = (t - 1) * np.maximum(np.log1p(-x), -100) - t * np.maximum(np.log(x), -100)
    per = per if w is None else per * w
    return per if reduction == "none" else per.sum() if reduction == "sum" else per.mean()


def np_bce_logits(x, t, w=None, pw=None, reduction="mean"):
    sp = np.logaddexp(0, -x)
    per = (1 - t) * x + (1 if pw is None else 1 + (pw - 1) * t) * sp
    per = per if w is None else per * w
    return per if reduction == "none" else per.sum() if reduction == "sum" else per.mean()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy_against_numpy(reduction, weighted, rng):
    x = rng.uniform(0.05, 0.95, (5, 7))
    t = rng.uniform(0, 1, (5, 7))
    w = rng.uniform(0.5, 2, (7,)) if weighted else None
    check(lambda z, q: F.binary_cross_entropy(z, q, None if w is None else _t(w), reduction=reduction),
          lambda z, q: np_bce(z, q, w, reduction), [x, t], rng)
    pw = rng.uniform(0.5, 3, (7,)) if weighted else None
    x = rng.standard_normal((5, 7)) * 4
    check(lambda z, q: F.binary_cross_entropy_with_logits(z, q, None if w is None else _t(w), reduction=reduction,
                                                          pos_weight=None if pw is None else _t(pw)),
          lambda z, q: np_bce_logits(z, q, w, pw, reduction), [x, t], rng)


def test_bce_edges_match_torch(rng, torch):
    x = np.array([0.0, 1.0, 1e-30, 0.5, 1 - 1e-7])
    t = np.array([1.0, 0.0, 1.0, 0.3, 1.0])
    got = F.binary_cross_entropy(_t(x), _t(t), reduction="none").numpy()
    want = torch.nn.functional.binary_cross_entropy(torch.tensor(x, dtype=torch.float32),
                                                    torch.tensor(t, dtype=torch.float32), reduction="none")
    assert_close(got, want.numpy(), 1e-5, 1e-5)
    z = np.array([-200.0, -30.0, 0.0, 30.0, 200.0])
    pw = np.array([2.0])
    got = F.binary_cross_entropy_with_logits(_t(z), _t(t), reduction="none", pos_weight=_t(pw)).numpy()
    want = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(z), torch.tensor(t), reduction="none",
                                                                pos_weight=torch.tensor(pw))
    assert_close(got, want.numpy(), 1e-5, 1e-5)


def _same_loss_and_grad(ours, theirs, x, target, torch) -> None:
    """The loss modules ``ours`` (wgpar) and ``theirs`` (torch) give the same loss of (x, target) and the same
    gradient of x."""
    xw, xt = _t(x, True), torch.tensor(x, requires_grad=True)
    lw, lt = ours(xw, _t(target)), theirs(xt, torch.tensor(target))
    lw.backward()
    lt.backward()
    assert_close(lw.item(), lt.item(), 1e-5, 1e-6)
    assert_close(xw.grad.numpy(), xt.grad.numpy(), 1e-5, 1e-7)


def test_bce_modules_match_torch(rng, torch):
    x = rng.standard_normal((6, 4))
    t = (rng.uniform(size=(6, 4)) > 0.5).astype(np.float64)
    w, pw = rng.uniform(0.5, 2, (4,)), rng.uniform(0.5, 3, (4,))
    ours = nn.BCEWithLogitsLoss(_t(w), pos_weight=_t(pw))
    theirs = torch.nn.BCEWithLogitsLoss(torch.tensor(w), pos_weight=torch.tensor(pw))
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "pos_weight"]
    assert repr(ours) == repr(theirs) == "BCEWithLogitsLoss()"
    _same_loss_and_grad(ours, theirs, x, t, torch)
    p = 1 / (1 + np.exp(-x))
    assert_close(nn.BCELoss(_t(w), reduction="sum")(_t(p), _t(t)).item(),
                 torch.nn.BCELoss(torch.tensor(w), reduction="sum")(torch.tensor(p), torch.tensor(t)).item(), 1e-5)


# -- regression losses and kl_div ------------------------------------------------------------------
def _reduce(per, reduction, w=None):
    if w is not None:
        per = per * w
        if reduction == "mean":
            return per.sum() / w.sum()
    return per if reduction == "none" else per.sum() if reduction == "sum" else per.mean()


def np_smooth_l1(d, beta):
    a = np.abs(d)
    return a if beta == 0 else np.where(a < beta, 0.5 * d * d / beta, a - 0.5 * beta)


def np_huber(d, delta):
    a = np.abs(d)
    return np.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses_against_numpy(reduction, rng):
    x, y = rng.standard_normal((6, 5)) * 2, rng.standard_normal((6, 5))
    w = rng.uniform(0.1, 2, (6, 5))
    check(lambda a, b: F.l1_loss(a, b, reduction=reduction), lambda a, b: _reduce(np.abs(a - b), reduction), [x, y],
          rng)
    check(lambda a, b: F.l1_loss(a, b, reduction=reduction, weight=_t(w)),
          lambda a, b: _reduce(np.abs(a - b), reduction, w), [x, y], rng)
    for beta in (1.0, 0.37, 0.0):
        check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta),  # noqa: B023
              lambda a, b: _reduce(np_smooth_l1(a - b, beta), reduction), [x, y], rng)  # noqa: B023
    for delta in (1.0, 0.6):
        check(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=delta),  # noqa: B023
              lambda a, b: _reduce(np_huber(a - b, delta), reduction), [x, y], rng)  # noqa: B023
    check(lambda a, b: F.huber_loss(a, b, reduction=reduction, weight=_t(w)),
          lambda a, b: _reduce(np_huber(a - b, 1.0), reduction, w), [x, y], rng)


def np_kl(x, t, reduction, log_target):
    per = np.exp(t) * (t - x) if log_target else np.where(t > 0, t * np.log(np.where(t > 0, t, 1)), 0) - t * x
    if reduction == "batchmean":
        return per.sum() / x.shape[0]
    return _reduce(per, reduction)


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "none", "mean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_against_numpy(reduction, log_target, rng):
    x = _log_softmax(rng.standard_normal((5, 6)))
    t = _log_softmax(rng.standard_normal((5, 6)))
    if not log_target:
        t = np.exp(t)
    with pytest.warns(UserWarning, match="batchmean") if reduction == "mean" else _no_warning():
        check(lambda a, b: F.kl_div(a, b, reduction=reduction, log_target=log_target),
              lambda a, b: np_kl(a, b, reduction, log_target), [x, t], rng)
        if not log_target:  # zero probabilities contribute 0 (forward only: d/dt t log t is -inf there)
            t[0, :2] = 0.0
            got = F.kl_div(_t(x), _t(t), reduction=reduction).numpy()
            assert_close(got, np_kl(x, t, reduction, False), 1e-5, 1e-6)


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("name", ["L1Loss", "SmoothL1Loss", "HuberLoss", "KLDivLoss"])
def test_regression_modules_match_torch(name, rng, torch):
    kw = {"SmoothL1Loss": {"beta": 0.4}, "HuberLoss": {"delta": 0.7},
          "KLDivLoss": {"reduction": "batchmean", "log_target": True}}.get(name, {})
    x, y = rng.standard_normal((4, 7)), rng.standard_normal((4, 7))
    ours, theirs = getattr(nn, name)(**kw), getattr(torch.nn, name)(**kw)
    assert repr(ours) == repr(theirs) and list(ours.state_dict()) == []
    _same_loss_and_grad(ours, theirs, x, y, torch)


def test_loss_errors():
    z = _t(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="size_average"):
        F.cross_entropy(z, np.zeros(4, np.int32), size_average=True)
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(z, np.zeros(4, np.int32), label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        F.cross_entropy(z, np.zeros(4, np.int32), weight=_t(np.ones(4)))
    with pytest.raises(ValueError, match="expected"):
        F.cross_entropy(_t(np.zeros((4, 3, 2))), np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="must match"):
        F.cross_entropy(z, _t(np.zeros((4, 2))))
    with pytest.raises(ValueError, match="reduction"):
        F.kl_div(z, z, reduction="avg")
    with pytest.raises(ValueError, match="same size"):
        F.l1_loss(z, z, weight=_t(np.ones(3)))
    with pytest.raises(ValueError, match="does not broadcast"):
        F.l1_loss(z, _t(np.zeros((4, 2))))
    with pytest.raises(ValueError, match="reduce"):
        nn.L1Loss(reduce=False)
