"""Matrix multiplication against NumPy float64: 2-D, batched, broadcast batches, 1-D operands, strided views."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpar

TOL = 1e-5


def rel_err(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.size == 0:
        return 0.0
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def u(rng, shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def mm(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 7, 33), (33, 1, 7), (129, 65, 1), (1, 129, 1000), (65, 200, 130),
                                   (7, 1000, 3), (64, 64, 64), (100, 17, 129)])
def test_matmul_2d(dev, rng, m, k, n):
    a, b = u(rng, (m, k)), u(rng, (k, n))
    x, y = wgpar.tensor(a), wgpar.tensor(b)
    got = x @ y
    assert got.shape == (m, n) and got.dtype is wgpar.float32
    assert rel_err(got.numpy(), mm(a, b)) < TOL
    assert rel_err(wgpar.matmul(x, y).numpy(), mm(a, b)) < TOL
    assert rel_err(x.matmul(y).numpy(), mm(a, b)) < TOL


@pytest.mark.parametrize("sa,sb", [
    ((5, 7, 33), (5, 33, 3)),
    ((1, 7, 33), (4, 33, 9)),       # broadcast batch of 1
    ((7, 33), (3, 33, 65)),         # 2-D with a batch
    ((3, 1, 7, 9), (2, 9, 4)),      # batch dims broadcast against each other -> (3, 2)
    ((2, 3, 65, 1), (1, 1, 70)),    # K = 1
    ((129, 2, 5), (5, 129)),
])
def test_matmul_batched_and_broadcast(dev, rng, sa, sb):
    a, b = u(rng, sa), u(rng, sb)
    got = wgpar.tensor(a) @ wgpar.tensor(b)
    want = mm(a, b)
    assert got.shape == want.shape
    assert rel_err(got.numpy(), want) < TOL


@pytest.mark.parametrize("sa,sb", [((33,), (33,)), ((33,), (33, 7)), ((7, 33), (33,)), ((129,), (3, 129, 5)),
                                   ((4, 3, 129), (129,)), ((1,), (1, 1000))])
def test_matmul_1d_operands(dev, rng, sa, sb):
    a, b = u(rng, sa), u(rng, sb)
    got = wgpar.tensor(a) @ wgpar.tensor(b)
    want = mm(a, b)
    assert got.shape == want.shape
    assert rel_err(got.numpy(), want) < TOL


def test_vector_dot_is_0d(dev, rng):
    a, b = u(rng, (1000,)), u(rng, (1000,))
    got = wgpar.tensor(a) @ wgpar.tensor(b)
    assert got.shape == () and got.ndim == 0
    assert abs(got.item() - float(mm(a, b))) <= TOL * np.abs(a.astype(np.float64) * b).sum()


def test_transposed_operands_without_copy(dev, rng):
    a, b = u(rng, (65, 33)), u(rng, (129, 65))  # a.T: (33, 65), b.T: (65, 129)
    x, y = wgpar.tensor(a), wgpar.tensor(b)
    assert not x.T.is_contiguous() and not y.mT.is_contiguous()
    cases = [(x.T, y.T, a.T, b.T), (x.T, y.transpose(0, 1), a.T, b.T), (y, x, b, a),
             (x.mT, wgpar.tensor(u(rng, (65, 7))), a.T, None)]
    for p, q, pa, qa in cases:
        qa = q.numpy() if qa is None else qa
        gc.collect()
        base = wgpar.memory_allocated(dev)
        wgpar.reset_peak_memory_stats(dev)
        out = p @ q
        # the kernel reads the strides directly: the only memory used is the output's
        assert wgpar.max_memory_allocated(dev) - base == out.nbytes
        assert rel_err(out.numpy(), mm(pa, qa)) < TOL


def test_batched_transposes_and_strided_views(dev, rng):
    a = u(rng, (4, 33, 17))
    b = u(rng, (4, 33, 9))
    x, y = wgpar.tensor(a), wgpar.tensor(b)
    want = mm(np.swapaxes(a, -1, -2), b)
    assert rel_err((x.mT @ y).numpy(), want) < TOL
    assert rel_err((x.transpose(1, 2) @ y).numpy(), want) < TOL
    assert rel_err((x.permute(0, 2, 1) @ y).numpy(), want) < TOL
    # batch-major transposes, offsets, steps and negative steps
    p = x.permute(2, 0, 1)[3:11]  # (8, 4, 33)
    q = y.permute(2, 1, 0)[::-1, :, 1:]  # (9, 33, 3)
    want = mm(a.transpose(2, 0, 1)[3:11], b.transpose(2, 1, 0)[::-1, :, 1:][:8])
    assert rel_err((p @ q[:8]).numpy(), want) < TOL
    w = u(rng, (40, 50))
    z = wgpar.tensor(w)
    assert rel_err((z[1::3, ::-2] @ z[::2, 5:30].T[:, :17]).numpy(),
                   mm(w[1::3, ::-2], w[::2, 5:30].T[:, :17])) < TOL
    e = wgpar.ones(3, 1).expand(3, 7)  # stride-0 operand
    assert rel_err((e @ wgpar.tensor(w[:7])).numpy(), mm(np.ones((3, 7), np.float32), w[:7])) < TOL


def test_matmul_zero_sizes(dev, rng):
    a = u(rng, (5, 0))
    b = u(rng, (0, 7))
    got = wgpar.tensor(a) @ wgpar.tensor(b)
    assert got.shape == (5, 7)
    np.testing.assert_array_equal(got.numpy(), np.zeros((5, 7)))
    assert (wgpar.zeros(0, 3) @ wgpar.zeros(3, 4)).shape == (0, 4)
    assert (wgpar.zeros(2, 0, 3) @ wgpar.zeros(3, 4)).shape == (2, 0, 4)


def test_matmul_in_a_chain_and_with_elementwise(dev, rng):
    a, w1, w2 = u(rng, (33, 64)), u(rng, (64, 129)), u(rng, (129, 10))
    h = (wgpar.tensor(a) @ wgpar.tensor(w1)).relu()
    out = (h @ wgpar.tensor(w2)).softmax(-1)
    hh = np.maximum(mm(a, w1), 0)
    z = mm(hh, w2)
    e = np.exp(z - z.max(-1, keepdims=True))
    assert rel_err(out.numpy(), e / e.sum(-1, keepdims=True)) < TOL


def test_matmul_shape_errors(dev):
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(5, 6\)"):
        wgpar.zeros(3, 4) @ wgpar.zeros(5, 6)
    with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(3, 4, 5\)"):
        wgpar.zeros(2, 3, 4) @ wgpar.zeros(3, 4, 5)  # batch 2 vs 3
    with pytest.raises(ValueError):
        wgpar.tensor(2.0) @ wgpar.zeros(3)
    with pytest.raises(TypeError):
        wgpar.zeros(3, 3, dtype=wgpar.int32) @ wgpar.zeros(3, 3, dtype=wgpar.int32)
    with pytest.raises(TypeError):
        wgpar.zeros(3, 3) @ np.zeros((3, 3), np.float32)


def test_long_inner_dimension(dev, rng):
    # lavapipe leaves a shader's loops after 65535 iterations: a long K must still be summed fully.
    for m, k, n in [(1, 60_001, 1), (3, 60_001, 2)]:
        a, b = u(rng, (m, k)), u(rng, (k, n))
        got = wgpar.tensor(a) @ wgpar.tensor(b)
        want = mm(a, b)
        # many terms cancel here: compare against the sum of magnitudes instead of the result
        scale = (np.abs(a).astype(np.float64) @ np.abs(b)).max()
        assert np.abs(got.numpy() - want).max() / scale < 1e-5
    v = np.ones(70_000, np.float32)
    assert (wgpar.tensor(v) @ wgpar.tensor(v)).item() == 70_000.0


# -- a product's plan remembered by its operands' layout (ops/matmul.py _RECIPES) ----------------------
LAYOUTS = {
    "2-d": lambda r: (u(r, (37, 24)), u(r, (24, 20)), lambda x, y: (x, y)),
    "batched": lambda r: (u(r, (3, 9, 8)), u(r, (3, 8, 12)), lambda x, y: (x, y)),
    "transposed views": lambda r: (u(r, (16, 12)), u(r, (20, 16)), lambda x, y: (x.t(), y.t())),
    "offset views": lambda r: (u(r, (40, 16)), u(r, (16, 24)), lambda x, y: (x[4:36], y[:, 4:20])),
    "shared weight": lambda r: (u(r, (2, 5, 8)), u(r, (8, 12)), lambda x, y: (x, y)),
    "broadcast batch (a copy)": lambda r: (u(r, (3, 1, 7, 8)), u(r, (2, 8, 4)), lambda x, y: (x, y)),
    "vector": lambda r: (u(r, (9, 8)), u(r, (8,)), lambda x, y: (x, y)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_repeated_layout_replays_its_plan_on_new_operands(dev, rng, monkeypatch, layout):
    """A second call with operands of the same layout skips plan() (where the first made a recipe that binds
    the operands themselves) and multiplies the new operands, not the first call's; a layout differing
    only in an offset or a stride gets its own plan."""
    import sys
    mmod = sys.modules["wgpar.ops.matmul"]
    calls = []
    real = mmod.plan
    monkeypatch.setattr(mmod, "plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    results = []
    for _ in range(3):
        a, b, view = LAYOUTS[layout](rng)
        x, y = view(wgpar.tensor(a), wgpar.tensor(b))
        want = np.matmul(*(np.asarray(t.numpy(), np.float64) for t in (x, y)))
        got = x @ y
        assert rel_err(got.numpy(), want) < TOL, layout
        results.append(len(calls))
    replays = layout not in ("broadcast batch (a copy)", "vector")
    assert results[0] >= 1
    assert (results[2] == results[0]) is replays, (layout, results)


def test_layouts_differing_in_offset_or_strides_do_not_share_a_plan(dev, rng):
    base = u(rng, (48, 20))
    b = u(rng, (20, 12))
    x, y = wgpar.tensor(base), wgpar.tensor(b)
    for lo in (0, 4, 8, 0, 4):  # the same shapes at three offsets, each seen twice
        got = x[lo:lo + 32] @ y
        assert rel_err(got.numpy(), mm(base[lo:lo + 32], b)) < TOL
    sq = wgpar.tensor(u(rng, (20, 20)))
    for _ in range(2):  # the same shape, row-major then transposed
        for v in (sq, sq.t()):
            assert rel_err((v @ y).numpy(), mm(v.numpy(), b)) < TOL


def test_forcing_a_variant_or_split_is_not_replayed_past(dev, rng):
    """A recipe made under force_variant is not replayed outside it, nor the other way round."""
    import sys
    mmod = sys.modules["wgpar.ops.matmul"]
    a, b = u(rng, (64, 128)), u(rng, (128, 64))
    x, y = wgpar.tensor(a), wgpar.tensor(b)
    for forced in (None, "general", None, (None, 2), None):
        name, split = forced if isinstance(forced, tuple) else (forced, None)
        with mmod.force_variant(name, split):
            with wgpar.profiler.profile() as prof:
                got = x @ y
                wgpar.synchronize()
        fams = [k.family for k in prof.kernels()]
        assert rel_err(got.numpy(), mm(a, b)) < TOL
        if name == "general":  # (a GPU splits the general kernel's long K itself: a sum may follow)
            assert "matmul" in fams and "matmul_fast" not in fams, fams
        else:
            assert "matmul_fast" in fams and ("matmul" not in fams), fams
            assert (len(fams) > 1) is (split == 2), fams  # split-K: the parts' sum after


def test_linear_bias_replays_and_falls_back(dev, rng):
    """F.linear's fused bias (matmul_bias) repeated, and a bias that needs the separate add, repeated."""
    from wgpar.nn import functional as F
    for shape_in, out_f in (((32, 16), 24), ((5, 6), 3)):
        for _ in range(2):
            xa, w, bias = u(rng, shape_in), u(rng, (out_f, shape_in[1])), u(rng, (out_f,))
            got = F.linear(wgpar.tensor(xa), wgpar.tensor(w), wgpar.tensor(bias))
            assert rel_err(got.numpy(), mm(xa, w.T) + bias) < TOL
