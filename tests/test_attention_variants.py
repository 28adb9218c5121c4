"""Every register-tiled attention variant of ops/attention.py's RT_VARIANTS table (the configurations
benchmarks/sweep_attention.py times and RT_DEFAULTS may pick) against the float64 reference, forward and
gradients, causal or not, L != S both ways and ragged tiles, on this adapter (lavapipe: TK capped to its
subgroup width, head dim halved so the tiles fit its 32 KiB of workgroup memory)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import wgpar
from wgpar.ops import attention as A

from .test_attention import _check, _problem, _run, _want

NVIDIA_SHARED = 49152  # maxComputeSharedMemorySize of NVIDIA's Vulkan driver (H100, H200)


def _head_dim(name: str) -> int:
    return int(re.match(r"d(\d+)-", name)[1])


def _lanes() -> int:
    lanes = A.subgroup_lanes(wgpar.device(0))
    if lanes < 4:
        pytest.skip("the register-tiled kernels need subgroups")
    return lanes


@pytest.mark.parametrize("name", sorted(A.RT_VARIANTS))
def test_variant_fits_a_gpu(name):
    """Each variant's tiles fit the GPU it is meant for: 48 KiB of workgroup memory, 256 threads, TK
    dividing the columns and the head dim's vec4s."""
    d = _head_dim(name)
    for kind, tile in A.RT_VARIANTS[name].items():
        t = A.parse_tile(tile)
        assert t.rm == 4 and t.cols % t.cs == 0 and (d // 4) % t.cs == 0 and t.cs <= 32, (kind, tile)
        assert A.shared_bytes(kind, t, d // 4) <= NVIDIA_SHARED, (kind, tile, A.shared_bytes(kind, t, d // 4))
        assert t.threads <= A.MAX_THREADS, (kind, tile)


def test_defaults_are_variants_tiles():
    rows = list(A.RT_DEFAULTS.items()) + [(key, row) for key, (_, row) in A.RT_SHORT.items()]
    for (_kind, d), row in rows:
        assert set(row) == set(A.KINDS)
        for kind, tile in row.items():
            t = A.parse_tile(tile)
            assert A.shared_bytes(kind, t, d // 4) <= NVIDIA_SHARED and (d // 4) % t.cs == 0


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", sorted(A.RT_VARIANTS))
def test_variant_matches(name, causal, rng, reference):
    lanes = _lanes()
    d = _head_dim(name)
    dev = wgpar.device(0)
    with A.variant(name, lanes):
        if any(A.pick(kind, dev, d) is None for kind in A.KINDS):
            d //= 2  # the tiles need more workgroup memory than the device has (lavapipe: 32 KiB)
    for shapes in (((2, 2, 70, d), (2, 2, 45, d)), ((1, 2, 37, d), (1, 2, 100, d))):
        arrays = _problem(*shapes, rng)
        with A.variant(name, lanes):
            for kind in A.KINDS:
                want = A.parse_tile(re.sub(r"t(\d+)", lambda m: f"t{min(int(m[1]), lanes)}", A.RT_VARIANTS[name][kind]))
                got = A.pick(kind, dev, d)
                assert got.name == want.name and got.unrolled == (dev.adapter_type != "CPU"), kind
            y, ins = _run(arrays, causal, path="fused")
        _check(y, ins, _want(reference, arrays, causal))


@pytest.mark.parametrize("name", ["d64-base", "d64-diag"])
def test_variant_nan_and_chunks(name, rng, monkeypatch, reference):
    """Key / query chunks (a small loop budget) and a NaN key: the diagonal-only mask keeps both contracts."""
    lanes = _lanes()
    arrays = _problem((1, 2, 90, 32), (1, 2, 90, 32), rng)
    monkeypatch.setattr(A, "MAX_LOOP", 60)
    with A.variant(name, lanes):
        for kind in A.KINDS:
            assert len(A.chunks(kind, A.pick(kind, wgpar.device(0), 32), 8, 90)) >= 2, kind
        y, ins = _run(arrays, True, path="fused")
    _check(y, ins, _want(reference, arrays, True))
    monkeypatch.undo()
    bad = [a.copy() for a in arrays]
    bad[1][0, 1, 71, 3] = np.nan
    with A.variant(name, lanes):
        y, got = _run(bad, True, path="fused")
    out = y.numpy()
    assert np.isnan(out[0, 1, 71:]).all() and not np.isnan(out[0, 1, :71]).any() and not np.isnan(out[0, 0]).any()
    dq = got[0].grad.numpy()
    assert np.isnan(dq[0, 1, 71:]).all() and not np.isnan(dq[0, 0]).any()


def test_short_walks_take_their_tiles(monkeypatch):
    """Where a kernel walks at most RT_SHORT's rows (keys forward and for dQ, queries for dK / dV), pick()
    takes RT_SHORT's tile on that device kind, RT_DEFAULTS' above it: the call's own lengths decide."""
    dev = wgpar.device(0)
    kind_d, (limit, short) = next((key, v) for key, v in A.RT_SHORT.items() if key[1] == 64)
    monkeypatch.setattr(dev, "kind", kind_d[0])
    long = A.RT_DEFAULTS[kind_d]
    for kind in A.KINDS:
        assert A._table_tile(kind, dev, 64, limit) == A.parse_tile(short[kind])
        assert A._table_tile(kind, dev, 64, limit + 1) == A.parse_tile(long[kind])
        assert A._table_tile(kind, dev, 64) == A.parse_tile(long[kind])
    monkeypatch.setenv(A.ENV_VARIANT, "d64-diag")  # a forced variant wins over both
    assert A._table_tile("fwd", dev, 64, 16) == A.parse_tile(A.RT_VARIANTS["d64-diag"]["fwd"])


def test_env_variant_and_table(monkeypatch):
    """WGPAR_ATTN_VARIANT names the variant every GPU kernel takes; RT_DEFAULTS otherwise; unknown names raise."""
    dev = wgpar.device(0)
    monkeypatch.setenv(A.ENV_VARIANT, "d64-diag")
    assert A._table_tile("dq", dev, 64) == A.parse_tile(A.RT_VARIANTS["d64-diag"]["dq"])
    monkeypatch.setenv(A.ENV_VARIANT, "nope")
    with pytest.raises(ValueError, match="WGPAR_ATTN_VARIANT"):
        A._table_tile("fwd", dev, 64)
    monkeypatch.delenv(A.ENV_VARIANT)
    row = A.RT_DEFAULTS.get((dev.kind, 64))
    assert A._table_tile("fwd", dev, 64) == (A.parse_tile(row["fwd"]) if row else None)
    assert A.parse_tile("64x32r4t8d") == A.Tile(64, 32, 8, False, 4, True)
    assert A.parse_tile("64x32r4t8d").name == "64x32r4t8d"
    with pytest.raises(ValueError):
        A.parse_tile("4x32r4t8")
