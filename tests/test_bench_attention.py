"""benchmarks/bench_attention.py's rows: the checked error of wgpar's fused attention against the float64
reference, in float32 and in float16 (whose reference sees the float16-rounded inputs)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_attention


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 4e-3)])
def test_rows_name_their_dtype_and_match_the_reference(tmp_path, dtype, tol):
    out, md = tmp_path / "rows.json", tmp_path / "B.md"
    assert bench_attention.main(["--shapes", "1x2x37x16", "--causal", "1,0", "--dtype", dtype, "--no-torch",
                                 "--seconds", "0.001", "--json", str(out), "--md", str(md)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["causal"], r["dtype"]) for r in rows] == [(True, dtype), (False, dtype)]
    for r in rows:
        assert "error" not in r, r
        assert r["max_rel_err"] < tol, r
        assert r["fwd"]["ms"] > 0 and r["fwd+bwd"]["ms"] > 0
    section = md.read_text()
    assert f"<!-- bench:attention-{dtype}:" in section and f"## Attention, {dtype}" in section
    for r in rows:
        assert f"| 1x2x37x16 | {'yes' if r['causal'] else 'no'} | " in section
        assert f"| {r['max_rel_err']:.1e} | {r['fwd']['ms']:.3f} | - | - | {r['fwd+bwd']['ms']:.3f} |" in section
