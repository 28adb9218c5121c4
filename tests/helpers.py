"""Comparison helpers shared by the test files."""

from __future__ import annotations

import contextlib
import sys

import numpy as np


def load_tool(name: str):
    """The module tools/<name>.py (the tools are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_close(got, want, rtol=1e-5, atol=1e-6, what=""):
    """|got - want| <= atol + rtol |want| elementwise; ``atol`` may be an array broadcast against them (a
    tolerance per row, say)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what} shape {got.shape} != {want.shape}"
    if np.ndim(atol) == 0:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
        return
    bound = np.broadcast_to(atol + rtol * np.abs(want), want.shape)
    bad = np.argwhere(~((np.abs(got - want) <= bound) | (np.isnan(got) & np.isnan(want))))  # as assert_allclose
    if len(bad):
        i = tuple(int(j) for j in bad[0])
        raise AssertionError(f"{what}: {len(bad)} of {got.size} elements off, first at {i}: {got[i]} vs "
                             f"{want[i]} (bound {bound[i]:.3g})")


def same_random_grads(rng, params, torch_params) -> None:
    """Give each wgpar parameter and its torch twin the same standard-normal float32 gradient, drawn in order."""
    import wgpar

    for p, tp in zip(params, torch_params):
        g = rng.standard_normal(p.shape).astype(np.float32)
        p.grad, tp.grad = wgpar.tensor(g), tp.new_tensor(g)


def assign_grads(params, grads, kinds, shared) -> None:
    """``p.grad = g`` for each parameter, laid out as its kind says: "a" / "b" the first 100 elements / the rest
    of the float32 tensor ``shared`` (two gradients viewing one buffer), "t" a transposed view (strided),
    anything else a fresh contiguous tensor."""
    import wgpar

    for p, g, kind in zip(params, grads, kinds):
        if kind in ("a", "b"):
            view = shared[:100] if kind == "a" else shared[100:]
            view.copy_(wgpar.tensor(g))
            p.grad = view
        else:
            p.grad = wgpar.tensor(g.T.copy()).T if kind == "t" else wgpar.tensor(g)


def record_dispatches(monkeypatch) -> list[str]:
    """The families of the kernels dispatched from now on, in order (every device; the test clears the list
    where it starts counting, monkeypatch restores dispatch)."""
    from wgpar.runtime.device import Device

    calls: list[str] = []
    real = Device.dispatch
    monkeypatch.setattr(Device, "dispatch",
                        lambda self, k, *a, **kw: (calls.append(k.family), real(self, k, *a, **kw))[1])
    return calls


def torch_state_as_numpy(sd: dict) -> dict:
    """A torch optimizer's state_dict as wgpar's load_state_dict takes it: state tensors as NumPy arrays, steps
    as Python numbers, the param_groups as they are."""
    return {"state": {k: {n: (v.numpy() if v.ndim else v.item()) for n, v in st.items()}
                      for k, st in sd["state"].items()},
            "param_groups": sd["param_groups"]}


SIZES = (1, 3, 7, 33, 129, 1000)


def np_sdpa(q, k, v, g=None, mask=None, causal=False):
    """softmax(q k^T / sqrt(d) + mask) v in float64, and with ``g`` its analytic gradients (dq, dk, dv).

    ``mask``: bool (True: may attend) or additive float, broadcast over the leading dims; ``causal``:
    top-left aligned (query i sees keys 0..i), as torch's scaled_dot_product_attention.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        mask = np.tril(np.ones(s.shape[-2:], dtype=bool))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask.astype(np.float64)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    y = p @ v
    if g is None:
        return y
    g = np.asarray(g, np.float64)
    dv = np.swapaxes(p, -1, -2) @ g
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return y, (ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv)


def rel_err(got, want) -> float:
    """max |got - want| relative to want's largest entry (float32 sums in another order stay < ~1e-6)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@contextlib.contextmanager
def no_device_waits(what: str):
    """Fail the test if ``what`` waits for the device (a readback, synchronize: every wait goes through
    ``runtime.transfer.wait_promise``). Counting submits would not do: a GPU may submit early after a wait."""
    import pytest

    transfer = sys.modules["wgpar.runtime.transfer"]
    real = transfer.wait_promise

    def refuse(*args, **kwargs):
        pytest.fail(f"{what} must not wait for the device")

    transfer.wait_promise = refuse
    try:
        yield
    finally:
        transfer.wait_promise = real
