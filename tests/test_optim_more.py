"""RMSprop, Adagrad, per-group hyperparameters of every optimizer, and clip_grad_value_, against NumPy
float64 references of PyTorch's algorithms (torch/optim/{rmsprop,adagrad}.py, single-tensor path) and
PyTorch itself through the ``torch`` fixture."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.nn.parameter import Parameter

from .helpers import assert_close, no_device_waits, same_random_grads, torch_state_as_numpy
from .test_optim import ref_adam, ref_sgd

SHAPES = [(1,), (7,), (33, 5), (129,)]


def ref_rmsprop(w, g, st, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                maximize=False):
    g = -g if maximize else g
    if weight_decay:
        g = g + weight_decay * w
    st["sq"] = st.get("sq", np.zeros_like(w)) * alpha + (1 - alpha) * g * g
    if centered:
        st["ga"] = st.get("ga", np.zeros_like(w)) + (1 - alpha) * (g - st.get("ga", np.zeros_like(w)))
        avg = np.sqrt(st["sq"] - st["ga"] ** 2) + eps
    else:
        avg = np.sqrt(st["sq"]) + eps
    if momentum > 0:
        st["buf"] = st.get("buf", np.zeros_like(w)) * momentum + g / avg
        return w - lr * st["buf"]
    return w - lr * g / avg


def ref_adagrad(w, g, st, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                maximize=False):
    g = -g if maximize else g
    st["t"] = st.get("t", 0) + 1
    if weight_decay:
        g = g + weight_decay * w
    clr = lr / (1 + (st["t"] - 1) * lr_decay)
    st["sum"] = st.get("sum", np.full_like(w, initial_accumulator_value)) + g * g
    return w - clr * g / (np.sqrt(st["sum"]) + eps)


CONFIGS = [
    ("rmsprop", optim.RMSprop, ref_rmsprop, dict()),
    ("rmsprop-centered-momentum", optim.RMSprop, ref_rmsprop,
     dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.05, momentum=0.8, centered=True)),
    ("rmsprop-momentum-max", optim.RMSprop, ref_rmsprop, dict(lr=0.003, momentum=0.5, maximize=True)),
    ("rmsprop-centered", optim.RMSprop, ref_rmsprop, dict(lr=0.02, alpha=0.95, centered=True)),
    ("adagrad", optim.Adagrad, ref_adagrad, dict()),
    ("adagrad-all", optim.Adagrad, ref_adagrad,
     dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.5, eps=1e-6, maximize=True)),
]


def _params(rng, shapes=SHAPES):
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return [w.astype(np.float64) for w in ws], [Parameter(wgpar.tensor(w)) for w in ws]


@pytest.mark.parametrize("name,cls,ref,kw", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_matches_numpy_reference(name, cls, ref, kw, rng, dev):
    ws, ps = _params(rng)
    states = [{} for _ in ps]
    opt = cls(ps, **kw)
    for step in range(6):
        for i, (p, st) in enumerate(zip(ps, states)):
            if step == 2 and i == 1:  # no gradient: skipped, and its state does not advance
                p.grad = None
                continue
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad = wgpar.tensor(g)
            ws[i] = ref(ws[i], g.astype(np.float64), st, **kw)
        opt.step()
        for p, w in zip(ps, ws):
            assert_close(p.numpy(), w, rtol=5e-5, atol=5e-6, what=f"{name} step {step} shape {p.shape}")
    assert [opt.state[p]["step"] for p in ps] == [6, 5, 6, 6]
    names = {"RMSprop": {"step", "square_avg"} | ({"momentum_buffer"} if kw.get("momentum") else set())
             | ({"grad_avg"} if kw.get("centered") else set()), "Adagrad": {"step", "sum"}}[cls.__name__]
    assert set(opt.state[ps[0]]) == names


def test_one_kernel_per_parameter_and_no_readback(rng, dev):
    _, ps = _params(rng)
    for opt in (optim.RMSprop(ps, momentum=0.9, centered=True), optim.Adagrad(ps, lr_decay=0.1)):
        for p in ps:
            p.grad = wgpar.ones(p.shape)
        dispatches = dev.num_dispatches
        with no_device_waits("step()"):
            opt.step()
        assert dev.num_dispatches - dispatches == len(ps)


# Two groups each: the second overrides several hyperparameters (and is added with add_param_group).
GROUPS = [
    (optim.SGD, ref_sgd, dict(lr=0.1), dict(lr=0.03, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (optim.Adam, ref_adam, dict(lr=0.01), dict(lr=0.002, betas=[0.5, 0.9], amsgrad=True, weight_decay=0.1)),
    (optim.AdamW, lambda *a, **k: ref_adam(*a, decoupled=True, **k), dict(lr=0.01, weight_decay=0.5),
     dict(lr=0.03, eps=1e-4, weight_decay=0.0, maximize=True)),
    (optim.RMSprop, ref_rmsprop, dict(lr=0.01), dict(lr=0.001, alpha=0.5, momentum=0.9, centered=True)),
    (optim.Adagrad, ref_adagrad, dict(lr=0.1, lr_decay=0.01),
     dict(lr=0.5, lr_decay=0.0, initial_accumulator_value=2.0, weight_decay=0.2)),
]


@pytest.mark.parametrize("cls,ref,base,override", GROUPS, ids=[g[0].__name__ for g in GROUPS])
def test_param_groups_have_their_own_hyperparameters(cls, ref, base, override, rng, dev):
    ws, ps = _params(rng, [(7,), (33, 5), (129,)])
    opt = cls([{"params": ps[:2]}], **base)
    opt.add_param_group({"params": [ps[2]], **override})
    group_kw = [base, base, {**base, **override}]
    # The reference takes what torch's group carries: the constructor's defaults under the override.
    for kw in group_kw:
        if "betas" in kw:
            kw["betas"] = tuple(kw["betas"])
    assert opt.param_groups[1]["lr"] == override["lr"] and opt.param_groups[0]["lr"] == base["lr"]
    states = [{} for _ in ps]
    for step in range(5):
        for i, p in enumerate(ps):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad = wgpar.tensor(g)
            ws[i] = ref(ws[i], g.astype(np.float64), states[i], **group_kw[i])
        opt.step()
        for p, w in zip(ps, ws):
            assert_close(p.numpy(), w, rtol=5e-5, atol=5e-6, what=f"{cls.__name__} step {step} {p.shape}")
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2]]
    assert sd["param_groups"][1]["lr"] == override["lr"]


@pytest.mark.parametrize("cls", [optim.RMSprop, optim.Adagrad])
def test_float16_parameters(cls, rng, dev):
    if not dev.has_f16:
        pytest.skip("adapter has no shader-f16")
    w = rng.standard_normal(65).astype(np.float16)
    p = Parameter(wgpar.tensor(w, dtype=wgpar.float16))
    opt = cls([p], lr=0.01)
    want, st = w.astype(np.float64), {}
    for _ in range(3):
        # Away from 0: the state is float16 as in torch, and a tiny squared gradient would be subnormal
        # there, where the float64 reference (unrounded state) differs by far more than rounding.
        g = (rng.choice([-1, 1], 65) * rng.uniform(0.5, 2, 65)).astype(np.float16)
        p.grad = wgpar.tensor(g, dtype=wgpar.float16)
        opt.step()
        want = (ref_rmsprop if cls is optim.RMSprop else ref_adagrad)(want, g.astype(np.float64), st, lr=0.01)
    assert p.dtype is wgpar.float16
    assert_close(p.numpy(), want, rtol=1e-2, atol=2e-3)


def test_optimizer_errors(dev):
    p = Parameter(wgpar.ones(3))
    for cls, kw, msg in [(optim.RMSprop, dict(lr=-1.0), "learning rate"),
                         (optim.RMSprop, dict(alpha=-0.1), "alpha"),
                         (optim.RMSprop, dict(momentum=-0.5), "momentum"),
                         (optim.RMSprop, dict(eps=-1e-8), "epsilon"),
                         (optim.Adagrad, dict(lr_decay=-1.0), "lr_decay"),
                         (optim.Adagrad, dict(initial_accumulator_value=-1.0), "initial_accumulator_value"),
                         (optim.Adagrad, dict(weight_decay=-1.0), "weight_decay")]:
        with pytest.raises(ValueError, match=msg):
            cls([p], **kw)
    with pytest.raises(TypeError, match="real number"):
        optim.RMSprop([p], alpha="0.9")
    opt = optim.Adagrad([p])
    with pytest.raises(ValueError, match="lr_decay"):
        opt.add_param_group({"params": [Parameter(wgpar.ones(2))], "lr_decay": -0.5})


# -- against PyTorch: two groups, several steps, and loading torch's state --------------------
TORCH_CASES = {
    "rmsprop": ("RMSprop", dict(lr=0.01, alpha=0.9, momentum=0.5), dict(lr=0.002, centered=True, weight_decay=0.1)),
    # (torch fills every group's sum from the constructor's initial_accumulator_value: see Adagrad's docstring)
    "adagrad": ("Adagrad", dict(lr=0.1, lr_decay=0.02, initial_accumulator_value=0.3), dict(lr=0.05, eps=1e-6)),
    "sgd": ("SGD", dict(lr=0.05), dict(lr=0.01, momentum=0.9, dampening=0.1)),
    "adam": ("Adam", dict(lr=0.01), dict(lr=0.003, betas=(0.8, 0.9), amsgrad=True)),
    "adamw": ("AdamW", dict(lr=0.01), dict(lr=0.003, weight_decay=0.3, maximize=True)),
}


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_two_groups_match_torch(name, rng, dev, torch):
    cls_name, base, override = TORCH_CASES[name]
    ws = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    tps = [torch.nn.Parameter(torch.tensor(w)) for w in ws]
    ps = [Parameter(wgpar.tensor(w)) for w in ws]
    topt = getattr(torch.optim, cls_name)([{"params": tps[:2]}, {"params": tps[2:], **override}], **base)
    opt = getattr(optim, cls_name)([{"params": ps[:2]}, {"params": ps[2:], **override}], **base)
    for step in range(8):
        same_random_grads(rng, ps, tps)
        topt.step()
        opt.step()
        for p, tp in zip(ps, tps):
            assert_close(p.numpy(), tp.detach().numpy(), rtol=2e-5, atol=2e-6, what=f"{name} step {step}")
    # torch's state loads here and goes on in step (state tensors as NumPy arrays, steps as ints).
    sd = topt.state_dict()
    ours = torch_state_as_numpy(sd)
    qs = [Parameter(wgpar.tensor(tp.detach().numpy())) for tp in tps]
    opt2 = getattr(optim, cls_name)([{"params": qs[:2]}, {"params": qs[2:]}])
    opt2.load_state_dict(ours)
    saved = opt2.state_dict()["state"]
    assert {k: {n for n, v in st.items() if v is not None} for k, st in saved.items()} == \
        {k: {n for n, v in st.items() if v is not None} for k, st in sd["state"].items()}
    for _ in range(3):
        same_random_grads(rng, qs, tps)
        topt.step()
        opt2.step()
    for q, tp in zip(qs, tps):
        assert_close(q.numpy(), tp.detach().numpy(), rtol=2e-5, atol=2e-6, what=f"{name} after loading")


# -- clip_grad_value_ ---------------------------------------------------------------------------
def test_clip_grad_value_matches_numpy(rng, dev):
    gs = [rng.standard_normal(s).astype(np.float32) * 3 for s in SHAPES]
    gs[0][0] = np.nan
    ps = [Parameter(wgpar.zeros(s)) for s in SHAPES] + [Parameter(wgpar.zeros(4))]  # the last has no grad
    for p, g in zip(ps, gs):
        p.grad = wgpar.tensor(g)
    assert nn.utils.clip_grad_value_(ps, 1.25) is None
    for p, g in zip(ps, gs):
        np.testing.assert_array_equal(p.grad.numpy(), np.clip(g, -1.25, 1.25))
    assert ps[-1].grad is None
    one = Parameter(wgpar.zeros(5))
    one.grad = wgpar.tensor(np.arange(-2, 3, dtype=np.float32))
    nn.utils.clip_grad_value_(one, 1)  # a single tensor, an int bound
    np.testing.assert_array_equal(one.grad.numpy(), [-1, -1, 0, 1, 1])
    with pytest.raises(TypeError, match="parameters\\[0\\]"):
        nn.utils.clip_grad_value_([np.zeros(3)], 1.0)
    with pytest.raises(TypeError, match="clip_value"):
        nn.utils.clip_grad_value_(ps, None)


def test_clip_grad_value_matches_torch(rng, dev, torch):
    g = rng.standard_normal((17, 3)).astype(np.float32) * 2
    p, tp = Parameter(wgpar.zeros((17, 3))), torch.nn.Parameter(torch.zeros(17, 3))
    p.grad, tp.grad = wgpar.tensor(g), torch.tensor(g)
    nn.utils.clip_grad_value_([p], 0.7)
    torch.nn.utils.clip_grad_value_([tp], 0.7)
    np.testing.assert_array_equal(p.grad.numpy(), tp.grad.numpy())
