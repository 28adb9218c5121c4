"""split / chunk / unbind backward: the pieces' gradients are joined into one buffer (torch's split
backward is one cat), not each written into a zero tensor of the input's size and summed. Hooks,
retain_grad, retain_graph, backward_input, version checks and graph release on the pieces."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn, ops
from wgpar.autograd import backward, backward_input, no_grad
from wgpar.nn import functional as F

from .helpers import assert_close, record_dispatches


@pytest.fixture
def dispatches(monkeypatch):
    """The families of the kernels dispatched while the test runs (cleared by the test where it starts counting)."""
    return record_dispatches(monkeypatch)


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("seeded", [(0, 1, 2), (0, 2), (1,)], ids=["all", "ends", "middle"])
def test_split_backward_is_one_join(rng, dispatches, seeded):
    """Seeded at the pieces, backward writes each piece's gradient into its place of one buffer (one
    copy each), zeros only where no gradient came (one fill), and that buffer becomes x.grad as is;
    before, every piece filled a zero tensor of x's size and copied into it, and the engine added them."""
    xa = _f32(rng, 3, 5, 12)
    x = wgpar.tensor(xa, requires_grad=True)
    pieces = x.split(4, -1)
    gs = {i: _f32(rng, 3, 5, 4) for i in seeded}
    seeds = [wgpar.tensor(gs[i]) for i in seeded]
    dispatches.clear()
    backward([pieces[i] for i in seeded], seeds)
    gaps = sum(1 for i in range(3) if i not in seeded and (i == 0 or i - 1 in seeded))  # runs of unseeded pieces
    assert len(dispatches) == len(seeded) + gaps, dispatches
    want = np.zeros_like(xa)
    for i, g in gs.items():
        want[..., 4 * i:4 * i + 4] = g
    assert_close(x.grad.numpy(), want, rtol=0, atol=0)


def test_unbind_backward_fills_only_the_gaps(rng, dispatches):
    x = wgpar.tensor(_f32(rng, 6, 7), requires_grad=True)
    rows = x.unbind(0)
    gs = {i: _f32(rng, 7) for i in (0, 1, 5)}
    dispatches.clear()
    backward([rows[i] for i in gs], [wgpar.tensor(g) for g in gs.values()])
    assert len(dispatches) == 3 + 1, dispatches  # rows 2..4 are one gap, one fill
    want = np.zeros((6, 7), np.float32)
    for i, g in gs.items():
        want[i] = g
    assert_close(x.grad.numpy(), want, rtol=0, atol=0)


def test_fused_projection_gradient_is_never_a_full_size_zero_fill(rng, monkeypatch):
    """The attention blocks split their fused q|k|v projection: its gradient is joined, so backward makes
    no zero tensor of the projection's shape (getitem's backward made three) and adds none."""
    att = nn.CausalSelfAttention(16, 2)
    x = wgpar.tensor(_f32(rng, 2, 5, 16), requires_grad=True)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    y = att(x).sum() + mha(x, x, x, need_weights=False)[0].sum()
    fills, adds = [], []
    real_fill, real_binary = ops.fill, ops.binary
    monkeypatch.setattr(ops, "fill", lambda shape, *a: (fills.append(tuple(shape)), real_fill(shape, *a))[1])
    monkeypatch.setattr(ops, "binary", lambda op, a, b: (adds.append(getattr(a, "shape", ())) if op == "add" else None,
                                                         real_binary(op, a, b))[1])
    y.backward()
    assert (2, 5, 48) not in fills and (2, 5, 48) not in adds, (fills, adds)


@pytest.mark.parametrize("how", ["split", "chunk", "unbind", "sections"])
def test_piece_gradients_match_torch(rng, reference, how):
    """Pieces used once, twice or not at all, x also used whole, and a second split of x: every mix of
    joined pieces and full gradients, against PyTorch or NumPy float64."""
    xa, wa = rng.standard_normal((4, 9)), rng.standard_normal((4, 9))

    def pieces(lib, x):
        if how == "split":
            return x.split(4, 1)
        if how == "chunk":
            return lib.chunk(x, 3, 1)
        if how == "unbind":
            return x.unbind(1)
        return lib.split(x, [2, 0, 5, 2], 1)

    def run(lib):
        x = lib.tensor(xa.astype(np.float32), requires_grad=True)
        w = lib.tensor(wa.astype(np.float32))
        p = pieces(lib, x * 1.0)  # a non-leaf's pieces: joined into the pending gradient of x * 1
        q = pieces(lib, x)  # a leaf's pieces: joined into x.grad
        loss = (p[0] * 2.0).sum() + (p[-1] ** 2).sum() + (p[-1] * 3.0).sum() + (x * w).sum() + (q[0] * q[-1]).sum()
        loss.backward()
        return x.grad.numpy()

    got = run(wgpar)
    if reference is not None:
        want = run(reference)
    else:  # NumPy: the same pieces by index
        n = xa.shape[1]
        cols = {"split": [range(0, 4), range(8, 9)], "chunk": [range(0, 3), range(6, 9)],
                "unbind": [range(0, 1), range(n - 1, n)], "sections": [range(0, 2), range(7, 9)]}[how]
        first, last = list(cols[0]), list(cols[1])
        f, la = xa[:, first], xa[:, last]
        want = wa.copy()
        want[:, first] += 2.0 + la  # broadcast where the last piece is one column
        want[:, last] += 2 * la + 3.0 + (f if len(first) == len(last) else f.sum(1, keepdims=True))
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_hooks_and_retain_grad_see_their_own_piece(rng):
    x = wgpar.tensor(_f32(rng, 3, 6), requires_grad=True)
    a, b, c = x.split(2, 1)
    seen = []
    a.register_hook(lambda g: seen.append(g.shape))
    b.register_hook(lambda g: g * 10.0)  # replaces b's gradient: x's middle columns get 10x
    c.retain_grad()
    w = _f32(rng, 3, 6)
    loss = (a * wgpar.tensor(w[:, :2])).sum() + (b * wgpar.tensor(w[:, 2:4])).sum() + (c * wgpar.tensor(w[:, 4:])).sum()
    loss.backward()
    assert seen == [(3, 2)]
    assert_close(c.grad.numpy(), w[:, 4:], rtol=0, atol=0)
    want = w.copy()
    want[:, 2:4] *= 10
    assert_close(x.grad.numpy(), want, rtol=1e-6)


def test_retain_graph_accumulates_and_a_freed_graph_refuses(rng):
    x = wgpar.tensor(_f32(rng, 4, 6), requires_grad=True)
    q, k, v = (x * 1.0).chunk(3, -1)
    loss = (q * 1.0 + k * 2.0 + v * 3.0).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert_close(x.grad.numpy(), np.repeat([[2.0, 2.0, 4.0, 4.0, 6.0, 6.0]], 4, 0), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_version_check_covers_the_pieces(rng):
    x = wgpar.tensor(_f32(rng, 4, 6), requires_grad=True)
    h = x * 1.0
    q, k = h.split(3, 1)
    loss = (q * k).sum()  # saves both pieces: views of h
    with no_grad():
        k.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()


def test_backward_input_then_deferred_equals_one_backward(rng):
    """A zero-bubble split backward through a fused projection's pieces: input gradient now, weight later."""
    xa, wa, ua = _f32(rng, 5, 4), _f32(rng, 9, 4), _f32(rng, 3, 3)

    def build():
        x = wgpar.tensor(xa, requires_grad=True)
        w = wgpar.tensor(wa, requires_grad=True)
        u = wgpar.tensor(ua, requires_grad=True)
        q, k, v = F.linear(x, w).split(3, -1)
        return x, w, u, (F.linear(q, u) * k + v).sum()

    x0, w0, u0, out0 = build()
    out0.backward()
    x, w, u, out = build()
    later = backward_input(out, None, [x])
    assert_close(x.grad.numpy(), x0.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert w.grad is None and u.grad is None and later.pending > 0
    later.run()
    assert_close(w.grad.numpy(), w0.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert_close(u.grad.numpy(), u0.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_split_pieces_are_views_with_their_own_nodes(rng):
    x = wgpar.tensor(_f32(rng, 3, 8), requires_grad=True)
    pieces = x.split([3, 5], 1)
    assert all(p.untyped_storage() is x.untyped_storage() for p in pieces)
    assert pieces[0].grad_fn is not pieces[1].grad_fn and pieces[0].grad_fn.name == "split"
    with no_grad():
        assert all(p.grad_fn is None for p in x.split(4, 1))
