"""StepLR, MultiStepLR, ExponentialLR, CosineAnnealingWarmRestarts, ChainedScheduler, OneCycleLR and
ReduceLROnPlateau: 35+ steps of two parameter groups against closed forms written from torch's
documentation, against torch.optim.lr_scheduler (the same floats and state_dict) through the ``torch``
fixture, and resumed from a checkpoint file."""

from __future__ import annotations

import functools
import math
from bisect import bisect_right

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.optim import lr_scheduler as sched

from .helpers import same_random_grads
from .test_lr_scheduler import _plain, check_resume

LRS = (3e-3, 7e-4)
STEPS = 36


def _cawr(t0, t_mult, eta_min):
    """SGDR from its definition: cycle k has T_0 * T_mult**k epochs; the lr follows a half cosine in each."""
    def f(b, e):
        start, t_i = 0.0, t0
        while e >= start + t_i:
            start, t_i = start + t_i, t_i * t_mult
        return eta_min + (b - eta_min) * (1 + math.cos(math.pi * (e - start) / t_i)) / 2
    return f


# Each builds the same schedule in either library (L: the lr_scheduler module, o: the optimizer).
SCHEDULES = {
    "step": lambda L, o: L.StepLR(o, step_size=4, gamma=0.5),
    "multistep": lambda L, o: L.MultiStepLR(o, milestones=[25, 3, 10, 10], gamma=0.3),
    "exponential": lambda L, o: L.ExponentialLR(o, gamma=0.93),
    "warm-restarts": lambda L, o: L.CosineAnnealingWarmRestarts(o, T_0=5, eta_min=1e-5),
    "warm-restarts-mult": lambda L, o: L.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=2e-5),
    "chained": lambda L, o: L.ChainedScheduler([L.ExponentialLR(o, gamma=0.95), L.StepLR(o, 6, gamma=0.5)]),
    "sequential-step": lambda L, o: L.SequentialLR(
        o, [L.LinearLR(o, start_factor=0.1, total_iters=4), L.StepLR(o, step_size=5, gamma=0.5)], [6]),
}

# The learning rate after e steps from base lr b.
CLOSED_FORMS = {
    "step": lambda b, e: b * 0.5 ** (e // 4),
    "multistep": lambda b, e: b * 0.3 ** bisect_right([3, 10, 10, 25], e),
    "exponential": lambda b, e: b * 0.93 ** e,
    "warm-restarts": _cawr(5, 1, 1e-5),
    "warm-restarts-mult": _cawr(3, 2, 2e-5),
    "chained": lambda b, e: b * 0.95 ** e * 0.5 ** (e // 6),
    "sequential-step": lambda b, e: b * (0.1 + 0.9 * min(e, 4) / 4) if e < 6 else b * 0.5 ** ((e - 6) // 5),
}


def _wgpar(name, lrs=LRS, cls=optim.AdamW):
    o = cls([{"params": [nn.Parameter(wgpar.zeros(2))], "lr": lrs[0]},
             {"params": [nn.Parameter(wgpar.zeros(3))], "lr": lrs[1]}])
    return o, SCHEDULES[name](sched, o)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_learning_rates_follow_the_closed_forms(name):
    o, s = _wgpar(name)
    for step in range(STEPS):
        want = [CLOSED_FORMS[name](b, step) for b in LRS]
        assert s.get_last_lr() == pytest.approx(want, rel=1e-10, abs=1e-15), f"step {step}"
        assert [g["lr"] for g in o.param_groups] == s.get_last_lr()
        o.step()
        s.step()


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_learning_rates_and_state_match_torch(name, torch):
    o, s = _wgpar(name)
    t = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": LRS[0]},
                           {"params": [torch.nn.Parameter(torch.zeros(3))], "lr": LRS[1]}])
    ts = SCHEDULES[name](torch.optim.lr_scheduler, t)
    assert s.get_last_lr() == ts.get_last_lr()
    for step in range(STEPS):
        o.step()
        t.step()
        s.step()
        ts.step()
        assert s.get_last_lr() == ts.get_last_lr(), f"step {step}"
    assert _plain(s.state_dict()) == _plain(ts.state_dict())


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_resume_from_checkpoint_continues_exactly(name, tmp_path):
    check_resume(functools.partial(_wgpar, name), tmp_path, 11, STEPS - 11)


# -- CosineAnnealingWarmRestarts with fractional epochs ----------------------------------------------
EPOCHS = [0, 0.25, 0.5, 1.75, 2.9999, 3, 3.5, 4.2, 8.99, 9, 9.5, 20.5, 21, 7.25, 0.1, 44.0, 45.3]


def test_warm_restarts_fractional_epochs():
    o, s = _wgpar("warm-restarts-mult")
    for e in EPOCHS:
        s.step(e)
        assert s.get_last_lr() == pytest.approx([_cawr(3, 2, 2e-5)(b, e) for b in LRS], rel=1e-9), f"epoch {e}"
        assert s.last_epoch == math.floor(e)
    o, s = _wgpar("warm-restarts")
    for e in EPOCHS:
        s.step(e)
        assert s.get_last_lr() == pytest.approx([_cawr(5, 1, 1e-5)(b, e) for b in LRS], rel=1e-9), f"epoch {e}"
    with pytest.raises(ValueError, match="non-negative epoch"):
        s.step(-1)


def test_warm_restarts_fractional_epochs_match_torch(torch):
    o, s = _wgpar("warm-restarts-mult")
    t = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": LRS[0]},
                           {"params": [torch.nn.Parameter(torch.zeros(3))], "lr": LRS[1]}])
    ts = SCHEDULES["warm-restarts-mult"](torch.optim.lr_scheduler, t)
    for i, e in enumerate(EPOCHS):
        if i % 3 == 2:  # integer steps interleaved with explicit epochs
            s.step()
            ts.step()
        else:
            s.step(e)
            ts.step(e)
        assert s.get_last_lr() == ts.get_last_lr(), f"call {i}"
    assert _plain(s.state_dict()) == _plain(ts.state_dict())


# -- OneCycleLR: lr and momentum (SGD) or beta1 (Adam) ------------------------------------------------
def _anneal(kind, start, end, pct):
    if kind == "cos":
        return end + (start - end) / 2 * (1 + math.cos(math.pi * pct))
    return start + (end - start) * pct


def _one_cycle(e, total, max_lr, pct_start=0.3, anneal_strategy="cos", base_momentum=0.85, max_momentum=0.95,
               div_factor=25.0, final_div_factor=1e4, three_phase=False):
    """(lr, momentum) at step e, from torch's documentation of the 1cycle policy."""
    pct, kind, base_m, max_m, div, final_div = (pct_start, anneal_strategy, base_momentum, max_momentum, div_factor,
                                                final_div_factor)
    init = max_lr / div
    low = init / final_div
    up = pct * total - 1
    if three_phase:
        phases = [(up, init, max_lr, max_m, base_m), (2 * pct * total - 2, max_lr, init, base_m, max_m),
                  (total - 1, init, low, max_m, max_m)]
    else:
        phases = [(up, init, max_lr, max_m, base_m), (total - 1, max_lr, low, base_m, max_m)]
    start = 0.0
    for i, (end, lr0, lr1, m0, m1) in enumerate(phases):
        if e <= end or i == len(phases) - 1:
            pct_ = (e - start) / (end - start)
            return _anneal(kind, lr0, lr1, pct_), _anneal(kind, m0, m1, pct_)
        start = end


ONE_CYCLE = {
    "cos-sgd": (optim.SGD, dict(total_steps=40)),
    "linear-adam": (optim.Adam, dict(epochs=5, steps_per_epoch=8, anneal_strategy="linear", pct_start=0.25)),
    "three-phase-sgd": (optim.SGD, dict(total_steps=40, three_phase=True, base_momentum=[0.8, 0.7],
                                        max_momentum=0.9, div_factor=10.0, final_div_factor=100.0)),
    "three-phase-adamw-linear": (optim.AdamW, dict(total_steps=37, three_phase=True, anneal_strategy="linear")),
    "no-momentum-rmsprop": (optim.RMSprop, dict(total_steps=40, cycle_momentum=False)),
}
MAX_LRS = [0.1, 0.02]


def _one_cycle_pair(L, o_mod, name, params):
    cls, kw = ONE_CYCLE[name]
    o = getattr(o_mod, cls.__name__)([{"params": [params[0]]}, {"params": [params[1]], "lr": 5.0}], lr=1.0)
    return o, L.OneCycleLR(o, max_lr=MAX_LRS, **kw)


def _momentum(group):
    return group["betas"][0] if "betas" in group else group["momentum"]


@pytest.mark.parametrize("name", sorted(ONE_CYCLE))
def test_one_cycle_follows_the_closed_form(name):
    cls, kw = ONE_CYCLE[name]
    o, s = _one_cycle_pair(sched, optim, name, [nn.Parameter(wgpar.zeros(2)), nn.Parameter(wgpar.zeros(3))])
    total = kw.get("total_steps") or kw["epochs"] * kw["steps_per_epoch"]
    args = {k: v for k, v in kw.items() if k not in ("total_steps", "epochs", "steps_per_epoch", "cycle_momentum")}
    for step in range(total):
        for i, (g, m) in enumerate(zip(o.param_groups, MAX_LRS)):
            base_m = args.get("base_momentum", 0.85)
            lr, mom = _one_cycle(step, total, m, **{**args, "base_momentum": base_m[i] if isinstance(base_m, list)
                                                    else base_m})
            assert g["lr"] == pytest.approx(lr, rel=1e-9), f"step {step} group {i}"
            if kw.get("cycle_momentum", True):
                assert _momentum(g) == pytest.approx(mom, rel=1e-9), f"momentum step {step} group {i}"
        o.step()
        if step < total - 1:
            s.step()
    assert o.param_groups[0]["lr"] == pytest.approx(MAX_LRS[0] / kw.get("div_factor", 25.0)
                                                    / kw.get("final_div_factor", 1e4), rel=1e-9)
    s.step()  # step `total` is the last allowed one
    with pytest.raises(ValueError, match="Tried to step"):
        s.step()


@pytest.mark.parametrize("name", sorted(ONE_CYCLE))
def test_one_cycle_matches_torch(name, torch, rng):
    """Schedules and the training they drive: the same lrs, momenta and parameters step after step."""
    w = [rng.standard_normal(n).astype(np.float32) for n in (2, 3)]
    ps = [nn.Parameter(wgpar.tensor(a)) for a in w]
    tps = [torch.nn.Parameter(torch.tensor(a)) for a in w]
    o, s = _one_cycle_pair(sched, optim, name, ps)
    t, ts = _one_cycle_pair(torch.optim.lr_scheduler, torch.optim, name, tps)
    for step in range(30):
        same_random_grads(rng, ps, tps)
        o.step()
        t.step()
        s.step()
        ts.step()
        assert s.get_last_lr() == ts.get_last_lr(), f"step {step}"
        for g, tg in zip(o.param_groups, t.param_groups):
            for k in ("lr", "initial_lr", "max_lr", "min_lr", "momentum", "betas", "max_momentum", "base_momentum"):
                assert (k in g) == (k in tg) and g.get(k) == tg.get(k), f"{k} at step {step}"
        for p, tp in zip(ps, tps):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=2e-5, atol=2e-6)
    assert _plain(s.state_dict()) == _plain(ts.state_dict())


def test_one_cycle_resume_and_errors(tmp_path):
    ps = [nn.Parameter(wgpar.zeros(2)), nn.Parameter(wgpar.zeros(3))]
    o, s = _one_cycle_pair(sched, optim, "three-phase-sgd", ps)
    for _ in range(13):
        s.step()
    wgpar.save({"opt": o.state_dict(), "sched": s.state_dict()}, tmp_path / "ck.safetensors")
    rest = [s.step() or (s.get_last_lr(), [g["momentum"] for g in o.param_groups]) for _ in range(20)]
    ck = wgpar.load(tmp_path / "ck.safetensors")
    o2, s2 = _one_cycle_pair(sched, optim, "cos-sgd", [nn.Parameter(wgpar.zeros(2)), nn.Parameter(wgpar.zeros(3))])
    o2.load_state_dict(ck["opt"])
    s2.load_state_dict(ck["sched"])
    assert [s2.step() or (s2.get_last_lr(), [g["momentum"] for g in o2.param_groups]) for _ in range(20)] == rest
    o = optim.SGD(ps, lr=0.1)
    with pytest.raises(ValueError, match="total_steps OR"):
        sched.OneCycleLR(o, max_lr=0.1)
    with pytest.raises(ValueError, match="pct_start"):
        sched.OneCycleLR(o, max_lr=0.1, total_steps=10, pct_start=1)
    with pytest.raises(ValueError, match="anneal_strategy"):
        sched.OneCycleLR(o, max_lr=0.1, total_steps=10, anneal_strategy="exp")
    with pytest.raises(ValueError, match="max_lr must have the same length"):
        sched.OneCycleLR(o, max_lr=[0.1, 0.2], total_steps=10)
    with pytest.raises(ValueError, match="momentum or beta1"):
        sched.OneCycleLR(optim.Adagrad(ps), max_lr=0.1, total_steps=10)


# -- ReduceLROnPlateau -----------------------------------------------------------------------------
PLATEAU = {
    "min-rel": dict(patience=2, factor=0.5),
    "min-abs-cooldown": dict(mode="min", threshold=0.05, threshold_mode="abs", patience=1, cooldown=2,
                             min_lr=[1e-3, 5e-4], factor=0.3),
    "max-rel": dict(mode="max", threshold=0.01, patience=3, factor=0.2, min_lr=1e-4),
    "max-abs-eps": dict(mode="max", threshold_mode="abs", threshold=0.1, patience=0, factor=0.9, eps=1e-4),
}


def _metrics(rng, mode, n=45):
    """A metric that improves, then stalls (noise), improves again, and stalls."""
    trend = np.concatenate([np.linspace(1, 0.5, 8), np.full(14, 0.5), np.linspace(0.5, 0.3, 6), np.full(n - 28, 0.3)])
    m = trend + 0.02 * rng.standard_normal(n)
    return (m if mode == "min" else -m).tolist()


def test_reduce_on_plateau_closed_form():
    """A hand-computed run: patience 2, factor 0.5, cooldown 1, absolute threshold 0.1."""
    o = optim.SGD([{"params": [nn.Parameter(wgpar.zeros(2))], "lr": 1.0},
                   {"params": [nn.Parameter(wgpar.zeros(3))], "lr": 0.1}])
    s = sched.ReduceLROnPlateau(o, patience=2, factor=0.5, cooldown=1, threshold=0.1, threshold_mode="abs",
                                min_lr=[0.3, 0.0])
    metrics = [5.0, 4.0, 3.95, 3.95, 3.95, 3.95, 3.95, 3.95, 3.95, 3.95, 1.0, 1.0]
    # best 5 -> 4; 3.95 is not better by 0.1: bad epochs 1, 2, 3 at calls 3..5 -> reduce at call 5 (index 4);
    # cooldown 1 eats call 6; bad 1, 2, 3 at calls 7..9 -> reduce at index 8; group 0 stops at min_lr 0.3.
    want = [(1.0, 0.1)] * 4 + [(0.5, 0.05)] * 4 + [(0.3, 0.025)] * 4
    for m, lrs in zip(metrics, want):
        s.step(m)
        assert tuple(s.get_last_lr()) == pytest.approx(lrs), f"after metric {m}, epoch {s.last_epoch}"
    assert s.best == 1.0 and s.last_epoch == len(metrics)
    s.step(wgpar.tensor(0.5))  # a one-element tensor is read back
    assert s.best == 0.5


@pytest.mark.parametrize("name", sorted(PLATEAU))
def test_reduce_on_plateau_matches_torch(name, torch, rng):
    kw = PLATEAU[name]
    o = optim.SGD([{"params": [nn.Parameter(wgpar.zeros(2))], "lr": 0.1},
                   {"params": [nn.Parameter(wgpar.zeros(3))], "lr": 0.01}])
    t = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": 0.1},
                         {"params": [torch.nn.Parameter(torch.zeros(3))], "lr": 0.01}])
    s, ts = sched.ReduceLROnPlateau(o, **kw), torch.optim.lr_scheduler.ReduceLROnPlateau(t, **kw)
    reductions = 0
    for i, m in enumerate(_metrics(rng, kw.get("mode", "min"))):
        before = s.get_last_lr()
        s.step(m)
        ts.step(m)
        reductions += s.get_last_lr() != before
        assert s.get_last_lr() == ts.get_last_lr(), f"metric {i}"
        assert [g["lr"] for g in o.param_groups] == [g["lr"] for g in t.param_groups]
    assert reductions > 0
    assert s.state_dict() == ts.state_dict()


def test_reduce_on_plateau_resume_and_errors(tmp_path, rng):
    def make():
        o = optim.Adam([{"params": [nn.Parameter(wgpar.zeros(2))], "lr": 0.1},
                        {"params": [nn.Parameter(wgpar.zeros(3))], "lr": 0.01}])
        return o, sched.ReduceLROnPlateau(o, **PLATEAU["max-rel"])
    metrics = _metrics(rng, "max")
    o, s = make()
    for m in metrics[:15]:
        s.step(m)
    wgpar.save({"opt": o.state_dict(), "sched": s.state_dict()}, tmp_path / "ck.safetensors")
    rest = [s.step(m) or s.get_last_lr() for m in metrics[15:]]
    ck = wgpar.load(tmp_path / "ck.safetensors")
    o2, s2 = make()
    o2.load_state_dict(ck["opt"])
    s2.load_state_dict(ck["sched"])
    assert [s2.step(m) or s2.get_last_lr() for m in metrics[15:]] == rest
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        sched.ReduceLROnPlateau(o, factor=1.0)
    with pytest.raises(ValueError, match="mode avg is unknown"):
        sched.ReduceLROnPlateau(o, mode="avg")
    with pytest.raises(ValueError, match="threshold mode"):
        sched.ReduceLROnPlateau(o, threshold_mode="pct")
    with pytest.raises(ValueError, match="expected 2 min_lrs"):
        sched.ReduceLROnPlateau(o, min_lr=[0.1])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        sched.ChainedScheduler([sched.StepLR(o, 2), s])
    with pytest.raises(ValueError, match="step_size"):
        sched.StepLR(o, 0)
    with pytest.raises(ValueError, match="T_0"):
        sched.CosineAnnealingWarmRestarts(o, T_0=0)
    with pytest.raises(ValueError, match="T_mult"):
        sched.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=1.5)
