"""Mixed precision: autocast's op rules (torch's CUDA lists), float32 master weights, the shader-f16
error, and GradScaler against torch.amp.GradScaler step by step (scale, growth, back-off, skipped steps)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.amp import GradScaler
from wgpar.nn import functional as F

torch = pytest.importorskip("torch")


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
            "gelu": F.gelu(y).dtype, "add f16+f32": (y + x).dtype, "mean": y.mean().dtype,
        }
        loss = F.cross_entropy(lin(x), [0, 1, 2, 3])
        with wgpar.autocast(enabled=False):
            assert (x @ x.T).dtype is wgpar.float32 and not wgpar.amp.is_autocast_enabled()
    assert not wgpar.amp.is_autocast_enabled() and (x @ x.T).dtype is wgpar.float32
    h, f = wgpar.float16, wgpar.float32
    assert got == {"linear": h, "matmul": h, "sdpa": h, "softmax": f, "log_softmax": f, "layer_norm": f,
                   "cross_entropy": f, "mse_loss": f, "sum": f, "exp": f, "gelu": h, "add f16+f32": f, "mean": h}
    loss.backward()  # master weights: float32 parameters get float32 gradients through the casts
    assert lin.weight.dtype is f and lin.weight.grad.dtype is f and x.grad.dtype is f


def test_gradients_keep_their_inputs_dtype(rng):
    """A float16 branch added into a float32 one gets float16 gradients, as in PyTorch (so the branch's
    matmuls run the float16 kernels in backward); the values equal torch's."""
    a = rng.standard_normal((5, 6)).astype(np.float32)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    x = wgpar.tensor(a, requires_grad=True)
    h = (x.to(wgpar.float16) @ wgpar.tensor(w).to(wgpar.float16))  # a float16 branch
    h.retain_grad()
    out = (h + x @ wgpar.tensor(w)) * 3.0  # float16 + float32: float32
    out.sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    th = tx.half() @ torch.tensor(w).half()
    th.retain_grad()
    ((th + tx @ torch.tensor(w)) * 3.0).sum().backward()
    assert h.grad.dtype is wgpar.float16 and th.grad.dtype is torch.float16
    np.testing.assert_array_equal(h.grad.numpy(), th.grad.numpy())
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=2e-3, atol=2e-3)


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


def _torch_pair(shapes, **kw):
    ws = [nn.Parameter(wgpar.zeros(*s)) for s in shapes]
    ts = [torch.nn.Parameter(torch.zeros(*s)) for s in shapes]
    tsc = torch.amp.GradScaler("cpu", **kw)
    tsc.scale(torch.ones(()))  # torch makes its scale tensor on the first scale()
    return ws, optim.SGD(ws, lr=0.5), GradScaler(**kw), ts, torch.optim.SGD(ts, lr=0.5), tsc


def test_grad_scaler_matches_torch_step_by_step(rng):
    """Gradients arrive scaled; some steps carry an inf or a NaN: both scalers skip the same steps, back off,
    grow after growth_interval clean steps, and leave identical parameters and state."""
    shapes = [(5, 3), (7,), (2, 2, 2)]
    ws, wopt, wsc, ts, topt, tsc = _torch_pair(shapes, init_scale=2.0 ** 10, growth_interval=3)
    bad_steps = {2: np.inf, 3: -np.inf, 7: np.nan}
    skipped = []
    for step in range(12):
        scale = wsc.get_scale()
        assert scale == tsc.get_scale(), f"step {step}"
        for i, (w, t) in enumerate(zip(ws, ts)):
            g = (rng.standard_normal(w.shape) * scale).astype(np.float32)
            if step in bad_steps and i == 1:
                g.flat[3] = bad_steps[step]
            w.grad = wgpar.tensor(g)
            t.grad = torch.tensor(g)
        before = ws[0].numpy()
        wsc.step(wopt)
        tsc.step(topt)
        if np.array_equal(before, ws[0].numpy()):
            skipped.append(step)
        wsc.update()
        tsc.update()
        for w, t in zip(ws, ts):
            np.testing.assert_allclose(w.numpy(), t.detach().numpy(), rtol=1e-6, atol=1e-7)
        assert wsc.state_dict() == tsc.state_dict(), f"step {step}"
    assert skipped == sorted(bad_steps)
    assert wsc.get_scale() != 2.0 ** 10  # it moved both ways: backed off at the bad steps, grew after 3 clean ones


def test_unscale_then_clip_reads_back_once_per_step(rng, monkeypatch):
    """unscale_ before clip_grad_norm_ (torch's recipe); the inf check costs one 4-byte readback per step,
    not one per parameter."""
    ws, wopt, wsc, ts, topt, tsc = _torch_pair([(9,)] * 6, init_scale=256.0)
    for w, t in zip(ws, ts):
        g = (rng.standard_normal(9) * 256).astype(np.float32)
        w.grad, t.grad = wgpar.tensor(g), torch.tensor(g)
    wgpar.synchronize()
    dev = ws[0].device
    calls = []
    real = type(dev).download
    monkeypatch.setattr(type(dev), "download", lambda self, *a: calls.append(a[-1]) or real(self, *a))
    wsc.unscale_(wopt)
    nn.utils.clip_grad_norm_(ws, 1.0)
    wsc.step(wopt)
    assert calls == [4]
    monkeypatch.undo()
    tsc.unscale_(topt)
    torch.nn.utils.clip_grad_norm_(ts, 1.0)
    tsc.step(topt)
    for w, t in zip(ws, ts):
        np.testing.assert_allclose(w.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        wsc.step(wopt)
    with pytest.raises(RuntimeError, match="after step"):
        wsc.unscale_(wopt)
    wsc.update()
    wsc.unscale_(wopt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        wsc.unscale_(wopt)


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
