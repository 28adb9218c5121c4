"""optim.lr_scheduler against the schedules' closed forms (and, where installed, torch.optim.lr_scheduler:
the same learning rates step by step, the same state_dict), and a schedule restored from a checkpoint
continuing exactly."""

from __future__ import annotations

import functools
import math

import pytest

import wgpar
from wgpar import nn, optim
from wgpar.optim import lr_scheduler as sched


def _warmup_cosine(warmup: int, total: int, floor: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
    return f


# Each builds the same schedule in either library (L: lr_scheduler module, o: optimizer).
SCHEDULES = {
    "lambda": lambda L, o: L.LambdaLR(o, _warmup_cosine(4, 20, 0.1)),
    "linear": lambda L, o: L.LinearLR(o, start_factor=0.05, end_factor=0.9, total_iters=7),
    "cosine": lambda L, o: L.CosineAnnealingLR(o, T_max=9, eta_min=1e-4),  # past T_max: cosine rises again
    "warmup+cosine": lambda L, o: L.SequentialLR(
        o, [L.LinearLR(o, start_factor=0.01, total_iters=5), L.CosineAnnealingLR(o, T_max=15, eta_min=3e-4)], [5]),
}


def _linear(start, end, total):
    return lambda e: start + (end - start) * min(e, total) / total


def _cosine(t_max, eta_min):
    """A factor of the base lr b: eta_min + (b - eta_min) (1 + cos(pi e / T_max)) / 2, periodic past T_max."""
    return lambda b, e: eta_min + (b - eta_min) * 0.5 * (1 + math.cos(math.pi * e / t_max))


# The learning rate after e steps from base lr b, written out from torch's documented formulas.
CLOSED_FORMS = {
    "lambda": lambda b, e: b * _warmup_cosine(4, 20, 0.1)(e),
    "linear": lambda b, e: b * _linear(0.05, 0.9, 7)(e),
    "cosine": _cosine(9, 1e-4),
    # Before the milestone the warm-up; from it the cosine, restarted at its epoch 0 (from the base lr).
    "warmup+cosine": lambda b, e: b * _linear(0.01, 1.0, 5)(e) if e < 5 else _cosine(15, 3e-4)(b, e - 5),
}


def _wgpar(name: str, lrs=(3e-3, 7e-4)):
    p = nn.Parameter(wgpar.zeros(2))
    q = nn.Parameter(wgpar.zeros(3))
    w = optim.AdamW([{"params": [p], "lr": lrs[0]}, {"params": [q], "lr": lrs[1]}])
    return w, SCHEDULES[name](sched, w)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_learning_rates_follow_the_closed_forms(name):
    """25 steps (past each schedule's end) of two param groups with their own lrs; the optimizer's lrs are
    the schedule's; the state_dict holds the step count, base lrs and last lrs."""
    lrs = (3e-3, 7e-4)
    w, ws = _wgpar(name, lrs)
    for step in range(26):
        want = [CLOSED_FORMS[name](b, step) for b in lrs]
        got = ws.get_last_lr()
        assert got == pytest.approx(want, rel=1e-10, abs=1e-15), f"step {step}"
        assert [g["lr"] for g in w.param_groups] == got
        w.step()
        ws.step()
    state = ws.state_dict()
    assert state["last_epoch"] == 26 and state["_last_lr"] == ws.get_last_lr()
    assert [g["initial_lr"] for g in w.param_groups] == list(lrs)
    for sub in state.get("_schedulers", [state]):
        assert sub["base_lrs"] == list(lrs)


def _pair(torch, name: str, lrs=(3e-3, 7e-4)):
    w, ws = _wgpar(name, lrs)
    t = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lrs[0]},
                           {"params": [torch.nn.Parameter(torch.zeros(3))], "lr": lrs[1]}])
    return w, ws, t, SCHEDULES[name](torch.optim.lr_scheduler, t)


def _plain(state: dict) -> dict:
    """A state_dict without the keys whose values are objects (lambdas), for comparison."""
    return {k: ([_plain(s) for s in v] if k == "_schedulers" else v) for k, v in state.items()}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_learning_rates_and_state_match_torch(name, torch):
    w, ws, t, ts = _pair(torch, name)
    assert ws.get_last_lr() == ts.get_last_lr()
    for step in range(25):
        w.step()
        t.step()
        ws.step()
        ts.step()
        assert ws.get_last_lr() == ts.get_last_lr(), f"step {step}"
        assert [g["lr"] for g in w.param_groups] == ws.get_last_lr()
    assert _plain(ws.state_dict()) == _plain(ts.state_dict())  # same keys, same values: the same arithmetic
    assert [g["initial_lr"] for g in w.param_groups] == [g["initial_lr"] for g in t.param_groups]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_resume_from_checkpoint_continues_exactly(name, tmp_path):
    check_resume(functools.partial(_wgpar, name), tmp_path, 8, 10)


def check_resume(make, tmp_path, before: int, after: int) -> None:
    """Save the optimizer and scheduler ``make()`` builds after ``before`` steps (through wgpar.save), restore
    them into fresh objects with other lrs (everything must come from the file), and check the next ``after``
    learning rates are the same."""
    o, s = make()
    for _ in range(before):
        o.step()
        s.step()
    wgpar.save({"opt": o.state_dict(), "sched": s.state_dict()}, tmp_path / "ck.safetensors")
    rest = [s.step() or s.get_last_lr() for _ in range(after)]
    ck = wgpar.load(tmp_path / "ck.safetensors")
    o2, s2 = make(lrs=(1.0, 1.0))
    o2.load_state_dict(ck["opt"])
    s2.load_state_dict(ck["sched"])
    assert [s2.step() or s2.get_last_lr() for _ in range(after)] == rest


def test_errors():
    p = nn.Parameter(wgpar.zeros(2))
    o = optim.SGD([p], lr=0.1)
    with pytest.raises(TypeError, match="is not an Optimizer"):
        sched.LambdaLR(object(), lambda e: 1.0)
    with pytest.raises(ValueError, match="Expected 1 lr_lambdas"):
        sched.LambdaLR(o, [lambda e: 1.0] * 2)
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        sched.LinearLR(o, start_factor=0.0)
    with pytest.raises(KeyError, match="initial_lr"):
        sched.CosineAnnealingLR(optim.SGD([nn.Parameter(wgpar.zeros(1))], lr=0.1), T_max=3, last_epoch=4)
    other = optim.SGD([nn.Parameter(wgpar.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="same optimizer"):
        sched.SequentialLR(o, [sched.LinearLR(o), sched.LinearLR(other)], [3])
