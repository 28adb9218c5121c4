"""The block / vec4 elementwise path against NumPy float64: which kernel runs, and its values.

The block kernel serves contiguous outputs whose operands are each a contiguous block of memory
(same shape, a trailing block like a bias, a row statistic, one element); it moves a vec4 per thread
when the element count, the blocks and the offsets are multiples of 4. Everything else must take the
scalar block kernel or the strided kernel and still be right.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import wgpar

from .helpers import assert_close


@pytest.fixture
def chosen(dev, monkeypatch):
    """Records (family, width) of every dispatch on the default device."""
    seen: list[tuple[str, int]] = []
    real = dev.dispatch

    def record(kspec, *args, **kwargs):
        if kspec.family == "elementwise":  # the strided kernel: elements a thread
            seen.append((kspec.family, 4 if dict(kspec.fills).get("W") == "4i" else 1))
        else:  # the block kernel: vec4 or scalar output
            seen.append((kspec.family, 4 if kspec.buffers[0][2].startswith("vec4") else 1))
        return real(kspec, *args, **kwargs)

    monkeypatch.setattr(dev, "dispatch", record)
    return seen


def f32(rng, shape):
    return rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)


def r64(a):
    return np.asarray(a, dtype=np.float64)


BLOCK4, BLOCK1 = ("elementwise_block", 4), ("elementwise_block", 1)
STRIDED, STRIDED4 = ("elementwise", 1), ("elementwise", 4)


@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 12, 1000, 1023, 1024, 4099, 65540])
def test_same_shape_ops_pick_vec4_when_n_is_a_multiple_of_4(dev, rng, chosen, n):
    a, b = f32(rng, (n,)), f32(rng, (n,))
    x, y = wgpar.tensor(a), wgpar.tensor(b)
    want_kind = BLOCK4 if n % 4 == 0 else BLOCK1
    cases = [("x + y", lambda: x + y, r64(a) + r64(b)),
             ("x * 2 + 1", lambda: x * 2.0 + 1.0, r64(a) * 2 + 1),
             ("relu", lambda: x.relu(), np.maximum(r64(a), 0)),
             ("gelu-free exp", lambda: (x * 0.5).exp(), np.exp(r64(a) * 0.5)),
             ("where", lambda: wgpar.where(x > y, x, 0.25), np.where(a > b, r64(a), 0.25))]
    for what, fn, want in cases:
        chosen.clear()
        got = fn()
        assert chosen and all(k == want_kind for k in chosen), (what, chosen)
        assert_close(got.numpy(), want, rtol=2e-6, atol=1e-6, what=what)


@pytest.mark.parametrize("n", [3, 8, 1000])
def test_comparisons_int_and_f16_through_vec4(dev, rng, chosen, n):
    a, b = f32(rng, (n,)), f32(rng, (n,))
    x, y = wgpar.tensor(a), wgpar.tensor(b)
    lt = x < y
    assert lt.dtype is wgpar.bool_
    np.testing.assert_array_equal(lt.numpy(), a < b)
    ia = rng.integers(-1000, 1000, size=n)
    ib = rng.integers(-1000, 1000, size=n)
    np.testing.assert_array_equal((wgpar.tensor(ia) * wgpar.tensor(ib) - 3).numpy(), ia * ib - 3)
    assert_close((wgpar.tensor(ia) + x).numpy(), ia + r64(a), rtol=1e-6)
    if dev.has_f16:
        h = wgpar.tensor(a, dtype="float16")
        got = h * 2.0 + wgpar.tensor(b, dtype="float16")
        assert got.dtype is wgpar.float16
        assert_close(got.numpy(), r64(a.astype(np.float16)) * 2 + r64(b.astype(np.float16)), rtol=2e-3,
                     atol=2e-3)
        mixed = h + y  # f16 + f32 -> f32
        assert mixed.dtype is wgpar.float32
        assert_close(mixed.numpy(), r64(a.astype(np.float16)) + r64(b), rtol=1e-6, atol=1e-6)
    assert all(k[0] == "elementwise_block" and k[1] == (4 if n % 4 == 0 else 1) for k in chosen), chosen


@pytest.mark.parametrize("rows,cols", [(1, 4), (5, 8), (33, 12), (7, 1024), (3, 7), (9, 5), (2, 1), (1, 1)])
def test_bias_and_row_statistics(dev, rng, chosen, rows, cols):
    a, bias, stat = f32(rng, (rows, cols)), f32(rng, (cols,)), f32(rng, (rows, 1))
    x, b, s = wgpar.tensor(a), wgpar.tensor(bias), wgpar.tensor(stat)
    vec = (rows * cols) % 4 == 0
    for what, fn, want, kind in [
        ("x + bias", lambda: x + b, r64(a) + r64(bias), BLOCK4 if vec and cols % 4 == 0 else BLOCK1),
        ("bias * x", lambda: b * x, r64(bias) * r64(a), BLOCK4 if vec and cols % 4 == 0 else BLOCK1),
        ("x - stat", lambda: x - s, r64(a) - r64(stat), BLOCK4 if vec and cols % 4 == 0 else BLOCK1),
        ("stat + bias", lambda: s + b, r64(stat) + r64(bias), BLOCK4 if vec and cols % 4 == 0 else BLOCK1),
        ("x * scalar tensor", lambda: x * wgpar.tensor(np.float32(1.5)), r64(a) * 1.5, BLOCK4 if vec else BLOCK1),
        ("where(x > bias, stat, x)", lambda: wgpar.where(x > b, s, x), np.where(a > bias, r64(stat), r64(a)),
         BLOCK4 if vec and cols % 4 == 0 else BLOCK1),
    ]:
        chosen.clear()
        got = fn()
        assert chosen and all(k == kind for k in chosen), (what, chosen)
        assert_close(got.numpy(), want, rtol=2e-6, atol=1e-6, what=what)


@pytest.mark.parametrize("sa,sb", [((3, 4, 8), (3, 1, 8)), ((2, 3, 4, 8), (3, 1, 1)), ((4, 8, 2), (1, 8, 1)),
                                   ((6, 1, 8), (1, 5, 1)), ((2, 8, 4), (2, 1, 4)), ((4, 4), (4, 1, 4))])
def test_broadcasts_that_are_not_one_block(dev, rng, chosen, sa, sb):
    a, b = f32(rng, sa), f32(rng, sb)
    got = wgpar.tensor(a) + wgpar.tensor(b)
    assert_close(got.numpy(), r64(a) + r64(b), rtol=2e-6, what=f"{sa} + {sb}")
    assert chosen, chosen


def test_block_modes():
    el = __import__("wgpar.ops.elementwise", fromlist=["_block_mode"])
    t = wgpar.empty((4, 8))
    assert el._block_mode(t, (4, 8), 32) == ("full", 1, 32)
    assert el._block_mode(wgpar.empty((8,)), (4, 8), 32) == ("mod", 1, 8)
    assert el._block_mode(wgpar.empty((4, 1)), (4, 8), 32) == ("div", 8, 4)
    assert el._block_mode(wgpar.empty((3, 1, 1)), (2, 3, 4, 8), 192) == ("div", 32, 3)
    assert el._block_mode(wgpar.empty((1, 1)), (4, 8), 32) == ("one", 1, 1)
    assert el._block_mode(wgpar.empty((3, 1, 8)), (3, 4, 8), 96) is None
    assert el._block_mode(wgpar.empty((8, 4)).T, (4, 8), 32) is None


def test_offset_views_and_transposes(dev, rng, chosen):
    a = f32(rng, (1030,))
    x = wgpar.tensor(a)
    for start, stop in [(1, 1029), (2, 1030), (4, 1028), (4, 1030), (0, 1028), (3, 7)]:
        chosen.clear()
        got = x[start:stop] * 3.0 - x[:stop - start]
        n = stop - start
        want_kind = BLOCK4 if start % 4 == 0 and n % 4 == 0 else BLOCK1
        assert chosen == [want_kind, BLOCK4 if n % 4 == 0 else BLOCK1], (start, stop, chosen)
        assert_close(got.numpy(), r64(a[start:stop]) * 3 - r64(a[:n]), rtol=2e-6, atol=1e-6)
    m = f32(rng, (12, 8))
    w = wgpar.tensor(m)
    chosen.clear()
    got = w.T + 1.0
    assert chosen == [STRIDED]  # read 8 apart: one a thread
    assert_close(got.numpy(), r64(m).T + 1)
    row = w[5]  # offset 40: a 4-aligned row
    chosen.clear()
    assert_close((row + w).numpy(), r64(m[5]) + r64(m))
    assert chosen == [BLOCK4]
    col = w[:, 3]  # strided
    chosen.clear()
    assert_close((col * 2.0).numpy(), r64(m[:, 3]) * 2)
    assert chosen == [STRIDED]
    chosen.clear()
    assert_close((w[::2, :4] * 2.0).numpy(), r64(m[::2, :4]) * 2)  # rows of 4 a block apart: 4 a thread
    assert chosen == [STRIDED4]


def test_in_place_and_out_variants(dev, rng, chosen):
    a, b = f32(rng, (16, 12)), f32(rng, (12,))
    x = wgpar.tensor(a)
    x += wgpar.tensor(b)
    assert chosen[-1] == BLOCK4
    assert_close(x.numpy(), r64(a) + r64(b), rtol=2e-6)
    y = wgpar.tensor(a)
    y[1:] += y[:-1]  # overlapping: read through a copy, never the half-written output
    want = r64(a).copy()
    want[1:] += r64(a)[:-1]
    assert_close(y.numpy(), want, rtol=2e-6)
    z = wgpar.tensor(a)
    sub = z[2:9]  # offset 24, 7 rows of 12: vec4
    chosen.clear()
    sub *= 2.0
    assert chosen == [BLOCK4]
    want = r64(a).copy()
    want[2:9] *= 2
    assert_close(z.numpy(), want)
    flat = wgpar.tensor(a.reshape(-1))
    part = flat[5:17]  # offset 5: not 4-aligned
    chosen.clear()
    part.fill_(0.5)
    assert chosen == [BLOCK1]
    want = r64(a.reshape(-1)).copy()
    want[5:17] = 0.5
    assert_close(flat.numpy(), want)
    c = wgpar.tensor(a).to(wgpar.float16) if dev.has_f16 else None
    if c is not None:
        assert_close(c.numpy(), r64(a.astype(np.float16)))


def test_one_plan_serves_every_offset_and_scalar(dev, rng):
    """A cached plan (block or strided) takes the operands' offsets and scalar values per call."""
    el = sys.modules["wgpar.ops.elementwise"]
    m = f32(rng, (9, 16))
    w = wgpar.tensor(m)
    for r in range(1, 8):  # rows r and r+1: one shape and strides, offsets 16r and 16(r+1)
        for s in (0.5, -2.0, float(r)):
            assert_close((w[r:r + 2] * s + w[r - 1:r + 1]).numpy(), r64(m[r:r + 2]) * s + r64(m[r - 1:r + 1]))
            assert_close((w[r:r + 2].T - s).numpy(), r64(m[r:r + 2]).T - s)  # the strided kernel
    p = el.plan("sub", [w[1:3].T, 1.0])
    assert p is el.plan("sub", [w[4:6].T, 2.5]) and not p.block and p.reads == (el.STRIDED, el.SCALAR)
    q = el.plan("mul", [w[1:3], 0.5])
    assert q is el.plan("mul", [w[2:4], 1.5]) and q.block and q.vec4 and q.reads == (el.UNITS, el.SCALAR)
    v = f32(rng, (40,))
    x = wgpar.tensor(v)
    for start in (4, 5):  # one plan; a 4-aligned offset takes its vec4 kernel, the other the scalar one
        assert_close((x[start:start + 32] * 3.0).numpy(), r64(v[start:start + 32]) * 3)
    widths = {key[1] for key in el.plan("mul", [x[4:36], 3.0]).kernels}
    assert widths == {True, False}


def test_writes_into_a_given_output_take_a_cached_plan(dev, rng):
    """In-place ops, copy_ and fill_ plan once per signature (the output's included): the output's offset
    and the operands' are per call, an operand that is the output itself shares its binding."""
    el = sys.modules["wgpar.ops.elementwise"]
    m = f32(rng, (9, 16))
    for r in range(0, 8):  # offsets 16r: the vec4 kernel; the same plan each time
        w = wgpar.tensor(m)
        w[r:r + 2] += w[r + 1:r + 3] if r % 2 else 2.5
        want = r64(m).copy()
        want[r:r + 2] += r64(m)[r + 1:r + 3] if r % 2 else 2.5
        assert_close(w.numpy(), want)
    w = wgpar.tensor(m)
    p = el.plan("add", [w[1:3], 1.0], w.dtype, w[1:3])
    assert p is el.plan("add", [w[4:6], -1.0], w.dtype, w[4:6]) and p.block and p.vec4
    v = f32(rng, (41,))
    for start in (4, 5):  # one plan; an odd output offset takes the scalar-width kernel
        x = wgpar.tensor(v)
        x[start:start + 32].mul_(x[start:start + 32])
        want = r64(v).copy()
        want[start:start + 32] *= r64(v)[start:start + 32]
        assert_close(x.numpy(), want)
    t = wgpar.tensor(m)
    t.T.copy_(wgpar.tensor(m.T * 2))  # a strided output: the strided kernel, planned too
    assert_close(t.numpy(), r64(m) * 2)
    assert not el.plan("copy", [wgpar.tensor(m.T)], t.dtype, t.T).block
    t.fill_(7)
    assert_close(t.numpy(), np.full((9, 16), 7.0))
    i = wgpar.tensor(np.arange(10, dtype=np.int32))
    i[2:8].copy_(wgpar.tensor(np.array([0.5, -1.7, 2.2, 3.9, -4.1, 5.5], np.float32)))  # to int32: truncated
    assert i.tolist() == [0, 1, 0, -1, 2, 3, -4, 5, 8, 9]


@pytest.mark.parametrize("perm,step", [((0, 2, 1, 3), None), ((1, 0, 2, 3), 1), ((0, 1, 3, 2), None),
                                       ((3, 2, 1, 0), 3), ((0, 2, 1, 3), 3)])
@pytest.mark.parametrize("last", [4, 12, 7, 16])
def test_strided_kernel_four_innermost_elements_a_thread(dev, rng, chosen, perm, step, last):
    """Views that are no block of memory (a head split's permute, transposes, every other element of a
    dimension) take the strided kernel, 4 innermost elements a thread where the innermost length is a
    multiple of 4 and those elements are consecutive in memory: unary, binary with a broadcast operand
    and a scalar, float16 <-> float32 casts, writes into a strided output and in place, all against
    NumPy."""
    base = (3, 5, 6, last)
    a = f32(rng, base)

    def view(t, arr):
        t, arr = t.permute(perm), arr.transpose(perm)
        if step is not None:
            key = (slice(None),) * step + (slice(None, None, 2),)
            t, arr = t[key], arr[key]
        return t, arr

    x = wgpar.tensor(a)
    v, want_v = view(x, a)
    width = 4 if v.shape[-1] % 4 == 0 and v.stride()[-1] == 1 else 1  # 4 a thread: consecutive innermost
    b = f32(rng, (v.shape[-1],))
    want_v = r64(want_v)
    for what, fn, want in [
            ("exp", lambda: v.exp(), np.exp(want_v)),
            ("v * b - 2", lambda: v * wgpar.tensor(b) - 2.0, want_v * r64(b) - 2),
            ("f16 -> f32", lambda: v.half().float(), want_v.astype(np.float16).astype(np.float64))]:
        chosen.clear()
        got = fn()
        assert ("elementwise", width) in chosen, (what, chosen)
        assert_close(got.numpy(), want, rtol=2e-6, atol=1e-6, what=what)
    h, _ = view(wgpar.tensor(a.astype(np.float16)), a)  # a float16 view cast up, as attention's K
    chosen.clear()
    assert_close(h.float().numpy(), want_v.astype(np.float16).astype(np.float64), rtol=0, atol=0, what="f16 view")
    assert chosen == [("elementwise", width)], chosen
    y = wgpar.tensor(a.copy())  # written through a strided view of itself, in place
    yv, _ = view(y, a)
    chosen.clear()
    yv.mul_(3.0)
    assert ("elementwise", width) in chosen, chosen
    ya = r64(a).transpose(perm)  # a view of the expected array, scaled where the view lies
    if step is not None:
        ya[(slice(None),) * step + (slice(None, None, 2),)] *= 3
    else:
        ya *= 3
    assert_close(y.numpy(), ya.transpose(np.argsort(perm)), rtol=2e-6, atol=1e-6, what="in place")
    out, _ = view(wgpar.zeros(base), a)  # a view as the given output of a copy
    out.copy_(v)
    assert_close(out.numpy(), want_v, rtol=0, atol=0, what="copy into a strided output")
