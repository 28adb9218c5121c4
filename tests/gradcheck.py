"""Check wgpar's backward against central finite differences of a NumPy float64 forward."""

from __future__ import annotations

import numpy as np

import wgpar


def numeric_grad(f_np, arrays, upstream, eps=1e-6):
    """d sum(f(arrays) * upstream) / d arrays[i], in float64."""
    grads = []
    for i, a in enumerate(arrays):
        g = np.zeros_like(a, dtype=np.float64)
        it = np.nditer(a, flags=["multi_index"])
        for _ in it:
            idx = it.multi_index
            plus = [x.astype(np.float64).copy() for x in arrays]
            minus = [x.astype(np.float64).copy() for x in arrays]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            g[idx] = (np.sum(f_np(*plus) * upstream) - np.sum(f_np(*minus) * upstream)) / (2 * eps)
        grads.append(g)
    return grads


def check(f_w, f_np, arrays, rng, rtol=2e-3, atol=2e-4):
    """Run f_w on wgpar tensors, backward with a random upstream gradient, compare to finite differences."""
    tensors = [wgpar.tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    out = f_w(*tensors)
    want_out = f_np(*[a.astype(np.float64) for a in arrays])
    np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-4, atol=1e-5, err_msg="forward")
    upstream = rng.standard_normal(np.shape(want_out))
    out.backward(wgpar.tensor(upstream.astype(np.float32)) if out.shape else None) if out.shape else \
        (out * float(upstream)).backward()
    want = numeric_grad(f_np, arrays, upstream)
    for k, (t, w) in enumerate(zip(tensors, want)):
        assert t.grad is not None, f"input {k} got no gradient"
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(t.grad.numpy(), w, rtol=rtol, atol=atol * scale, err_msg=f"grad of input {k}")
