"""Mixed precision: autocast's op rules (torch's CUDA lists), float32 master weights, the shader-f16
error, and GradScaler step by step (scale, growth, back-off, skipped steps) against its contract written
out in Python below, and against torch.amp.GradScaler where torch is installed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.amp import GradScaler
from wgpar.nn import functional as F

from .helpers import assign_grads, record_dispatches


class RefScaler:
    """torch.amp.GradScaler's contract in plain Python (scale kept in float32, as torch keeps it): step
    unscales, skips when any gradient is inf / NaN; update backs off after a skipped step and grows after
    ``growth_interval`` clean ones in a row."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale, self.growth, self.backoff, self.interval = np.float32(init_scale), growth_factor, \
            backoff_factor, growth_interval
        self.tracker, self.found = 0, None

    def unscale(self, grads):
        inv = np.float32(1.0) / self.scale
        self.found = not all(np.isfinite(g).all() for g in grads)
        return [(g * inv).astype(np.float32) for g in grads]

    def step_sgd(self, params, grads, lr):
        """Parameters after scaler.step(SGD(lr)) from scaled gradients (not unscaled yet)."""
        grads = self.unscale(grads)
        if self.found:
            return params
        return [(p - np.float32(lr) * g).astype(np.float32) for p, g in zip(params, grads)]

    def update(self):
        if self.found:
            self.scale, self.tracker = np.float32(self.scale * np.float32(self.backoff)), 0
        elif self.tracker + 1 == self.interval:
            self.scale, self.tracker = np.float32(self.scale * self.growth), 0
        else:
            self.tracker += 1

    def state_dict(self):
        return {"scale": float(self.scale), "growth_factor": self.growth, "backoff_factor": self.backoff,
                "growth_interval": self.interval, "_growth_tracker": self.tracker}


def test_autocast_op_rules(rng):
    """float16 for matmul / linear / attention, float32 for softmax, norms, losses, sum, exp (torch's CUDA
    autocast lists); other ops keep their inputs' types; parameters and their gradients stay float32."""
    lin = nn.Linear(8, 8)
    x = wgpar.tensor(rng.standard_normal((4, 8)).astype(np.float32), requires_grad=True)
    with wgpar.autocast(dtype=wgpar.float16):
        assert wgpar.amp.is_autocast_enabled()
        y = lin(x)
        q = y.reshape(1, 1, 4, 8)
        got = {
            "linear": y.dtype, "matmul": (x @ x.T).dtype, "sdpa": F.scaled_dot_product_attention(q, q, q).dtype,
            "softmax": F.softmax(y, -1).dtype, "log_softmax": F.log_softmax(y, -1).dtype,
            "layer_norm": F.layer_norm(y, 8).dtype, "cross_entropy": F.cross_entropy(y, [0, 1, 2, 3]).dtype,
            "mse_loss": F.mse_loss(y, y.detach()).dtype, "sum": y.sum().dtype, "exp": y.exp().dtype,
            "log": y.log().dtype, "rsqrt": y.rsqrt().dtype, "pow": (y ** 2).dtype,
            "gelu": F.gelu(y).dtype, "add f16+f32": (y + x).dtype, "mean": y.mean().dtype,
        }
        loss = F.cross_entropy(lin(x), [0, 1, 2, 3])
        with wgpar.autocast(enabled=False):
            assert (x @ x.T).dtype is wgpar.float32 and not wgpar.amp.is_autocast_enabled()
    assert not wgpar.amp.is_autocast_enabled() and (x @ x.T).dtype is wgpar.float32
    h, f = wgpar.float16, wgpar.float32
    assert got == {"linear": h, "matmul": h, "sdpa": h, "softmax": f, "log_softmax": f, "layer_norm": f,
                   "cross_entropy": f, "mse_loss": f, "sum": f, "exp": f, "log": f,
                   "rsqrt": f, "pow": f, "gelu": h, "add f16+f32": f, "mean": h}
    loss.backward()  # master weights: float32 parameters get float32 gradients through the casts
    assert lin.weight.dtype is f and lin.weight.grad.dtype is f and x.grad.dtype is f


def _mixed_branches(a, w):
    """(h + x @ w) * 3 with h = x @ w computed in float16; returns h and x (both retaining gradients)."""
    x = wgpar.tensor(a, requires_grad=True)
    h = (x.to(wgpar.float16) @ wgpar.tensor(w).to(wgpar.float16))  # a float16 branch
    h.retain_grad()
    out = (h + x @ wgpar.tensor(w)) * 3.0  # float16 + float32: float32
    out.sum().backward()
    return h, x


def test_gradients_keep_their_inputs_dtype(rng):
    """A float16 branch added into a float32 one gets float16 gradients, as in PyTorch (so the branch's
    matmuls run the float16 kernels in backward); the values are the float64 ones within float16 rounding."""
    a = rng.standard_normal((5, 6)).astype(np.float32)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    h, x = _mixed_branches(a, w)
    assert h.grad.dtype is wgpar.float16 and x.grad.dtype is wgpar.float32
    np.testing.assert_array_equal(h.grad.numpy(), np.full((5, 6), 3.0))  # 3 is exact in float16
    # d/dx: 3 * ones @ w^T through each branch; the float16 one sees w rounded to float16.
    w16 = w.astype(np.float16).astype(np.float64)
    want = 3.0 * np.ones((5, 6)) @ w16.T + 3.0 * np.ones((5, 6)) @ w.astype(np.float64).T
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=2e-3, atol=2e-3)


def test_gradients_keep_their_inputs_dtype_torch(rng, torch):
    a = rng.standard_normal((5, 6)).astype(np.float32)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    h, x = _mixed_branches(a, w)
    tx = torch.tensor(a, requires_grad=True)
    th = tx.half() @ torch.tensor(w).half()
    th.retain_grad()
    ((th + tx @ torch.tensor(w)) * 3.0).sum().backward()
    assert h.grad.dtype is wgpar.float16 and th.grad.dtype is torch.float16
    np.testing.assert_array_equal(h.grad.numpy(), th.grad.numpy())
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("xdtype", ["float32", "float16"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_under_autocast_rounds_the_weight_once(xdtype, with_bias, rng, dev):
    """F.linear in autocast: the input read as stored (no float16 copy of a float32 one), the weight rounded to
    float16 once (torch's autocast casts it), the product rounded once to float16; gradients in each operand's
    dtype: the input's multiplies by the rounded weight (as torch's), the weight's is float32 math on the
    float16 output gradient and the input as stored. Held besides what the graph had: the float16 output and,
    for the input's gradient, the float16 weight."""
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    n, k, m = 37, 20, 12
    x = rng.standard_normal((n, k)).astype(xdtype)
    w = (rng.standard_normal((m, k)) / 4).astype(np.float32)
    w16 = w.astype(np.float16).astype(np.float64)
    b = rng.standard_normal(m).astype(np.float32)
    xw = wgpar.tensor(x, dtype=getattr(wgpar, xdtype), requires_grad=True)
    ww, bw = wgpar.tensor(w, requires_grad=True), wgpar.tensor(b, requires_grad=True)
    wgpar.synchronize(dev)
    base = wgpar.memory_stats(dev)["allocated_bytes"]
    with wgpar.autocast():
        d0 = dev.num_dispatches
        y = F.linear(xw, ww, bw if with_bias else None)
        assert dev.num_dispatches - d0 == 2, "expected the weight's cast and one product"
    wgpar.synchronize(dev)
    assert wgpar.memory_stats(dev)["allocated_bytes"] - base == n * m * 2 + m * k * 2
    assert y.dtype is wgpar.float16
    want = x.astype(np.float64) @ w16.T + (b if with_bias else 0)
    rel = lambda got, ref: np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max()  # noqa: E731
    assert rel(y.numpy(), want) < 1e-3
    g = rng.standard_normal((n, m)).astype(np.float16)
    y.backward(wgpar.tensor(g, dtype=wgpar.float16))
    g64 = g.astype(np.float64)
    assert xw.grad.dtype is xw.dtype and ww.grad.dtype is wgpar.float32
    # float32 x: the unrounded weight would miss by about 1e-4
    assert rel(xw.grad.numpy(), g64 @ w16) < (1e-3 if xdtype == "float16" else 2e-5)
    assert rel(ww.grad.numpy(), g64.T @ x.astype(np.float64)) < 2e-5
    if with_bias:
        assert bw.grad.dtype is wgpar.float32 and rel(bw.grad.numpy(), g64.sum(0)) < 2e-5
    del y
    wgpar.synchronize(dev)
    assert wgpar.memory_stats(dev)["allocated_bytes"] - base == (n * k * 4 if xdtype == "float32" else n * k * 2) \
        + m * k * 4 + (m * 4 if with_bias else 0), "the float16 weight outlived the backward"


def test_autocast_is_thread_local_and_a_decorator():
    seen = []

    def other():
        seen.append((wgpar.ones(2, 2) @ wgpar.ones(2, 2)).dtype)

    with wgpar.autocast():
        t = threading.Thread(target=other)
        t.start()
        t.join()

    @wgpar.autocast()
    def inside():
        return (wgpar.ones(2, 2) @ wgpar.ones(2, 2)).dtype

    assert seen == [wgpar.float32] and inside() is wgpar.float16
    with pytest.raises(TypeError, match="bfloat16"):
        wgpar.autocast(dtype="bfloat16")
    with pytest.raises(ValueError, match="device_type"):
        wgpar.autocast("cuda")


def test_adapter_without_shader_f16_gets_a_clear_error(dev, monkeypatch):
    monkeypatch.setattr(dev, "has_f16", False)
    a = wgpar.ones(4, 4, device=dev)
    with wgpar.autocast(), pytest.raises(TypeError, match="no shader-f16 feature"):
        a @ a


def test_autocast_training_tracks_float32(rng):
    """Ten AdamW steps of a small attention + MLP model in autocast with a GradScaler stay within float16
    rounding of the same steps in float32."""
    def model():
        wgpar.manual_seed(3)
        return nn.ModuleList([nn.Linear(16, 16), nn.CausalSelfAttention(16, 2), nn.LayerNorm(16), nn.Linear(16, 5)])

    def forward(m, x):
        h = m[0](x)
        h = h + m[1](h)
        return m[3](m[2](h)).reshape(-1, 5)

    X = rng.standard_normal((2, 8, 16)).astype(np.float32)  # one batch, fitted over the steps
    Y = rng.integers(0, 5, 16)
    curves = {}
    for amp in (False, True):
        m = model()
        opt = optim.AdamW(m.parameters(), lr=3e-3)
        scaler = GradScaler(enabled=amp)
        losses = []
        for _ in range(10):
            opt.zero_grad()
            with wgpar.autocast(enabled=amp):
                loss = F.cross_entropy(forward(m, wgpar.tensor(X)), Y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
        assert all(p.dtype is wgpar.float32 for p in m.parameters())
        curves[amp] = losses
    np.testing.assert_allclose(curves[True], curves[False], rtol=2e-2)
    assert curves[True][-1] < curves[True][0]


SCALER_SHAPES = [(5, 3), (7,), (2, 2, 2)]
BAD_STEPS = {2: np.inf, 3: -np.inf, 7: np.nan}


def _wgpar_scaler_run(rng, **kw):
    """Each step's (scale before it, parameters and state_dict after it) of GradScaler + SGD(lr=0.5).

    Gradients are made from the scale the scaler reports, so a wrong scale changes them (and fails)."""
    ws = [nn.Parameter(wgpar.zeros(*s)) for s in SCALER_SHAPES]
    opt, sc = optim.SGD(ws, lr=0.5), GradScaler(**kw)
    noise = [[rng.standard_normal(s).astype(np.float32) for s in SCALER_SHAPES] for _ in range(12)]
    trace = []
    for step in range(12):
        scale = sc.get_scale()
        gs = [(n * np.float32(scale)).astype(np.float32) for n in noise[step]]
        if step in BAD_STEPS:
            gs[1].flat[3] = BAD_STEPS[step]
        for w, g in zip(ws, gs):
            w.grad = wgpar.tensor(g)
        sc.step(opt)
        sc.update()
        trace.append((scale, gs, [w.numpy() for w in ws], sc.state_dict()))
    return trace


def test_grad_scaler_contract_step_by_step(rng):
    """Gradients arrive scaled; some steps carry an inf or a NaN: the scaler skips exactly those steps,
    backs off, grows after growth_interval clean steps, and its parameters and state equal the contract's."""
    kw = {"init_scale": 2.0 ** 10, "growth_interval": 3}
    ref = RefScaler(**kw)
    params = [np.zeros(s, np.float32) for s in SCALER_SHAPES]
    scales = []
    for step, (scale, gs, got, state) in enumerate(_wgpar_scaler_run(rng, **kw)):
        assert scale == float(ref.scale), f"step {step}: scale {scale} != {ref.scale}"
        scales.append(scale)
        new = ref.step_sgd(params, gs, 0.5)
        assert (new is params) == (step in BAD_STEPS), f"step {step}"
        params = new
        ref.update()
        for g, p in zip(got, params):
            np.testing.assert_allclose(g, p, rtol=1e-6, atol=1e-7, err_msg=f"step {step}")
        assert state == ref.state_dict(), f"step {step}"
    # Backed off at 2, 3 and 7, grew after 3 clean steps (4-6, 8-10): the schedule the contract gives.
    assert scales == [1024.0, 1024.0, 1024.0, 512.0, 256.0, 256.0, 256.0, 512.0, 256.0, 256.0, 256.0, 512.0]


def test_grad_scaler_matches_torch_step_by_step(rng, torch):
    """The same steps through torch.amp.GradScaler: identical scales, parameters and state."""
    kw = {"init_scale": 2.0 ** 10, "growth_interval": 3}
    ts = [torch.nn.Parameter(torch.zeros(*s)) for s in SCALER_SHAPES]
    topt, tsc = torch.optim.SGD(ts, lr=0.5), torch.amp.GradScaler("cpu", **kw)
    tsc.scale(torch.ones(()))  # torch makes its scale tensor on the first scale()
    for step, (scale, gs, got, state) in enumerate(_wgpar_scaler_run(rng, **kw)):
        assert scale == tsc.get_scale(), f"step {step}"
        for t, g in zip(ts, gs):
            t.grad = torch.tensor(g)
        tsc.step(topt)
        tsc.update()
        for g, t in zip(got, ts):
            np.testing.assert_allclose(g, t.detach().numpy(), rtol=1e-6, atol=1e-7)
        assert state == tsc.state_dict(), f"step {step}"


def _unscale_clip_step(grads, monkeypatch):
    """unscale_, clip_grad_norm_(1.0), step with SGD(lr=0.5) from zero parameters; the download sizes seen."""
    ws = [nn.Parameter(wgpar.zeros(*g.shape)) for g in grads]
    opt, sc = optim.SGD(ws, lr=0.5), GradScaler(init_scale=256.0)
    for w, g in zip(ws, grads):
        w.grad = wgpar.tensor(g)
    wgpar.synchronize()
    dev = ws[0].device
    calls = []
    real = type(dev).download
    monkeypatch.setattr(type(dev), "download", lambda self, *a: calls.append(a[-1]) or real(self, *a))
    sc.unscale_(opt)
    nn.utils.clip_grad_norm_(ws, 1.0)
    sc.step(opt)
    monkeypatch.undo()
    return ws, opt, sc, calls


def test_unscale_then_clip_reads_nothing_back_in_the_step(rng, monkeypatch):
    """unscale_ before clip_grad_norm_ (torch's recipe) clips the true gradients; the inf check reads
    nothing back in the step (a built-in optimizer's step is guarded on the device); misuse of the stages
    raises as torch's does."""
    grads = [(rng.standard_normal(9) * 256).astype(np.float32) for _ in range(6)]
    ws, wopt, wsc, calls = _unscale_clip_step(grads, monkeypatch)
    assert calls == []
    true = [g.astype(np.float64) / 256 for g in grads]
    norm = np.sqrt(sum((g ** 2).sum() for g in true))
    coef = min(1.0, 1.0 / (norm + 1e-6))
    for w, g in zip(ws, true):
        np.testing.assert_allclose(w.numpy(), -0.5 * coef * g, rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        wsc.step(wopt)
    with pytest.raises(RuntimeError, match="after step"):
        wsc.unscale_(wopt)
    wsc.update()
    wsc.unscale_(wopt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        wsc.unscale_(wopt)


def test_unscale_then_clip_matches_torch(rng, monkeypatch, torch):
    grads = [(rng.standard_normal(9) * 256).astype(np.float32) for _ in range(6)]
    ws, _, _, _ = _unscale_clip_step(grads, monkeypatch)
    ts = [torch.nn.Parameter(torch.zeros(9)) for _ in grads]
    topt, tsc = torch.optim.SGD(ts, lr=0.5), torch.amp.GradScaler("cpu", init_scale=256.0)
    tsc.scale(torch.ones(()))
    for t, g in zip(ts, grads):
        t.grad = torch.tensor(g)
    tsc.unscale_(topt)
    torch.nn.utils.clip_grad_norm_(ts, 1.0)
    tsc.step(topt)
    for w, t in zip(ws, ts):
        np.testing.assert_allclose(w.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad", [None, 0, 15])
def test_unscale_takes_six_gradients_a_dispatch(bad, rng, dev, monkeypatch):
    """unscale_ divides every gradient by the scale exactly as float32 does, up to six a dispatch: two gradients
    viewing one buffer go to different dispatches (a buffer bound twice for writing is invalid), a strided one
    through a contiguous copy; an inf in the first or the last slot of a dispatch skips the step. Two steps:
    the first with the host's scale, the second with the device's (after an update on the device)."""
    shapes = [(1,), (255,), (256,), "a", "b", (257,), (3, 5), (1000,), (4,), "t", (2, 3, 7), (9,), (64,),
              (129,), (6,), (33,), (2,)]
    big = wgpar.tensor(rng.standard_normal(300).astype(np.float32))
    ws, sc = [], GradScaler(init_scale=2.0 ** 9, growth_interval=1)
    for sh in shapes:
        ws.append(nn.Parameter(wgpar.zeros(*((100,) if sh == "a" else (200,) if sh == "b" else
                                            (5, 7) if sh == "t" else sh))))
    opt = optim.SGD(ws, lr=0.5)
    seen = record_dispatches(monkeypatch)
    for step in range(2):
        grads = [(rng.standard_normal(w.shape) * 2.0 ** 9).astype(np.float32) for w in ws]
        if bad is not None:
            grads[bad].reshape(-1)[-1] = np.inf
        assign_grads(ws, grads, shapes, big)
        scale = sc.get_scale()
        assert (sc._device_state is not None) == (step == 1), "the second step should read the device's scale"
        del seen[:]
        sc.unscale_(opt)
        assert seen.count("amp_unscale") == 4  # [0-3] [4-9] [10-15] [16], where there was one a gradient
        inv = np.float32(1.0) / np.float32(scale)
        for w, g in zip(ws, grads):
            np.testing.assert_array_equal(w.grad.numpy(), g * inv)
        found = sc.found_inf_per_device(opt)[dev]
        assert int(found.item()) == (bad is not None)
        sc.step(opt)
        sc.update()
    assert sc.get_scale() == (2.0 ** 7 if bad is not None else 2.0 ** 11)


def test_disabled_scaler_and_state_dict_round_trip(tmp_path):
    w = nn.Parameter(wgpar.ones(3))
    opt = optim.SGD([w], lr=1.0)
    off = GradScaler(enabled=False)
    w.grad = wgpar.ones(3)
    assert off.scale(w) is w and off.state_dict() == {} and off.get_scale() == 1.0
    off.step(opt)
    off.update()
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))
    on = GradScaler(init_scale=8.0, growth_interval=5)
    on._growth_tracker = 3
    wgpar.save(on.state_dict(), tmp_path / "s.safetensors")
    back = GradScaler()
    back.load_state_dict(wgpar.load(tmp_path / "s.safetensors"))
    assert back.state_dict() == on.state_dict()
    with pytest.raises(AssertionError, match="No inf checks"):
        back.update()
    with pytest.raises(ValueError, match="growth factor"):
        GradScaler(growth_factor=1.0)


def test_the_old_module_path_warns():
    import importlib
    import sys

    sys.modules.pop("wgpar.autocast_mode", None)
    with pytest.warns(DeprecationWarning, match="wgpar.autograd.autocast_mode"):
        old = importlib.import_module("wgpar.autocast_mode")
    assert old.autocast is wgpar.autocast and old.is_autocast_enabled is wgpar.amp.is_autocast_enabled


class _MySGD(optim.SGD):
    """An optimizer whose step the scaler cannot guard on the device (it overrides step)."""

    def step(self, closure=None):
        return super().step(closure)


def test_an_optimizer_with_its_own_step_reads_the_flag(rng, monkeypatch):
    """A subclass overriding step() may do anything in it: the scaler reads the 4-byte flag and skips on
    the host, as before."""
    ws = [nn.Parameter(wgpar.zeros(4)) for _ in range(2)]
    opt, sc = _MySGD(ws, lr=0.5), GradScaler(init_scale=4.0)
    for w in ws:
        w.grad = wgpar.tensor(np.array([4.0, np.inf, 0, 0], np.float32))
    dev = ws[0].device
    calls = []
    real = type(dev).download
    monkeypatch.setattr(type(dev), "download", lambda self, *a: calls.append(a[-1]) or real(self, *a))
    sc.step(opt)
    sc.update()
    monkeypatch.undo()
    assert calls == [4] and not opt._guardable()
    assert sc.get_scale() == 2.0 and all((w.numpy() == 0).all() for w in ws)


# Stateful optimizers: a skipped first step must leave no state behind (fresh buffers, step counts).
GUARDED = {
    "adam": (lambda ps: optim.Adam(ps, lr=0.1), lambda t, ps: t.optim.Adam(ps, lr=0.1)),
    "adamw_amsgrad": (lambda ps: optim.AdamW(ps, lr=0.1, weight_decay=0.1, amsgrad=True),
                      lambda t, ps: t.optim.AdamW(ps, lr=0.1, weight_decay=0.1, amsgrad=True)),
    "sgd_momentum": (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3),
                     lambda t, ps: t.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3)),
    "rmsprop": (lambda ps: optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
                lambda t, ps: t.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True)),
    "adagrad": (lambda ps: optim.Adagrad(ps, lr=0.1, lr_decay=0.01),
                lambda t, ps: t.optim.Adagrad(ps, lr=0.1, lr_decay=0.01)),
}


@pytest.mark.parametrize("name", GUARDED)
def test_guarded_steps_match_torch_without_reading_back(name, rng, torch, monkeypatch):
    """GradScaler + a stateful optimizer, steps 0, 3 and 4 with inf / NaN gradients, growth every 2 clean
    steps: scaler.step and update read nothing back (the step is skipped on the device, the scale updated
    there), yet parameters, optimizer state (step counts too) and the scale equal torch's after every step."""
    make, make_torch = GUARDED[name]
    shapes = [(5, 3), (7,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ws = [nn.Parameter(wgpar.tensor(a)) for a in init]
    ts = [torch.nn.Parameter(torch.tensor(a)) for a in init]
    opt, topt = make(ws), make_torch(torch, ts)
    kw = {"init_scale": 2.0 ** 8, "growth_interval": 2}
    sc, tsc = GradScaler(**kw), torch.amp.GradScaler("cpu", **kw)
    tsc.scale(torch.ones(()))
    bad = {0: np.inf, 3: np.nan, 4: -np.inf}
    dev = ws[0].device
    calls = []
    real = type(dev).download
    monkeypatch.setattr(type(dev), "download", lambda self, *a: calls.append(a[-1]) or real(self, *a))
    for step in range(8):
        gs = [(rng.standard_normal(s) * tsc.get_scale()).astype(np.float32) for s in shapes]
        if step in bad:
            gs[1][2] = bad[step]
        for w, t, g in zip(ws, ts, gs):
            w.grad, t.grad = wgpar.tensor(g), torch.tensor(g)
        calls.clear()
        sc.step(opt)
        sc.update()
        assert calls == [], f"step {step}: read back {calls}"
        assert len(sc._unread) <= 1, f"step {step}: flags kept unreplayed"  # already-read flags are replayed
        tsc.step(topt)
        tsc.update()
        for w, t in zip(ws, ts):
            np.testing.assert_allclose(w.numpy(), t.detach().numpy(), rtol=2e-5, atol=1e-6,
                                       err_msg=f"step {step}")
        got, want = opt.state_dict()["state"], topt.state_dict()["state"]
        assert set(got) <= set(want), f"step {step}"
        for i in want:
            if i not in got:  # never stepped (torch's Adagrad makes its state before the first step)
                assert int(want[i]["step"]) == 0, f"step {step}"
                continue
            assert sorted(got[i]) == sorted(k for k, v in want[i].items() if v is not None), f"step {step}"
            for k, v in want[i].items():
                if k == "step":
                    assert got[i][k] == int(v), f"step {step}: {k}"
                elif v is not None:
                    np.testing.assert_allclose(got[i][k].numpy(), v.numpy(), rtol=2e-5, atol=1e-6)
    assert sc.get_scale() == tsc.get_scale() and sc.state_dict() == tsc.state_dict()


def test_device_scale_hands_back_to_the_host(rng):
    """A scale kept on the device (guarded steps) goes back to the host, exactly, when asked for a new
    scale, when a loss comes from another device, or after a load_state_dict; steps then go on as the
    contract says."""
    ref = RefScaler(init_scale=2.0 ** 6, growth_interval=2)
    sc = GradScaler(init_scale=2.0 ** 6, growth_interval=2)
    devs = wgpar.devices(2)  # logical devices where the machine has one adapter
    for step, (dev_i, bad, action) in enumerate([(0, True, None), (0, False, None), (0, False, None),
                                                  (0, False, "new_scale"), (0, True, None), (1, False, None),
                                                  (1, False, "load"), (0, False, None)]):
        w = nn.Parameter(wgpar.zeros(3, device=devs[dev_i]))
        opt = optim.SGD([w], lr=1.0)
        loss = sc.scale(wgpar.ones((), device=devs[dev_i]))
        assert float(loss.numpy()) == float(ref.scale), f"step {step}"
        g = np.array([1.0, np.inf if bad else 2.0, 3.0], np.float32) * ref.scale
        w.grad = wgpar.tensor(g, device=devs[dev_i])
        sc.step(opt)
        new = ref.step_sgd([np.zeros(3, np.float32)], [g], 1.0)[0]
        np.testing.assert_array_equal(w.numpy(), new)
        if action == "new_scale":
            sc.update(new_scale=24.0)
            ref.scale, ref.tracker = np.float32(24.0), ref.tracker
        else:
            sc.update()
            ref.update()
        if action == "load":
            state = dict(sc.state_dict(), scale=12.0, _growth_tracker=1)
            sc.load_state_dict(state)
            ref.scale, ref.tracker = np.float32(12.0), 1
        assert sc.state_dict() == ref.state_dict(), f"step {step}"
