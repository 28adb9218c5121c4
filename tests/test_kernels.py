"""Kernel interfaces declared once: the generated WGSL header, the parameter packing, override
constants passed to the pipeline, and WGPAR_DUMP_WGSL."""

from __future__ import annotations

import dataclasses
import struct
import sys

import numpy as np
import pytest

import wgpar
from wgpar.nn import functional as F
from wgpar.runtime import config
from wgpar.runtime.kernels import Kernel, Params

from .helpers import assert_close


def test_params_layout_aligns_vectors_and_pads_to_16_bytes():
    p = Params("n: u32, scale: f32, off: vec4<u32>, k: i32, dims: array<vec4<i32>, 2>, last: u32")
    # n, scale, 2 pad words, off (4), k, 3 pad words, dims (8), last, 3 pad words
    assert p.size == 4 * (2 + 2 + 4 + 1 + 3 + 8 + 1 + 3)
    text = p.wgsl()
    assert text.index("scale: f32") < text.index("_pad2: u32") < text.index("off: vec4<u32>")
    assert "_pad9: u32" in text and "dims: array<vec4<i32>, 2>" in text and text.rstrip().endswith("}")
    raw = p.pack(n=7, scale=0.5, off=[1, 2, 3, 4], k=-3, dims=list(range(-4, 4)), last=9)
    words = struct.unpack(f"<{p.size // 4}I", raw)
    assert words[0] == 7 and struct.unpack("<f", raw[4:8])[0] == 0.5 and words[2:4] == (0, 0)
    assert words[4:8] == (1, 2, 3, 4) and words[8] == (-3) & 0xFFFFFFFF
    assert struct.unpack("<8i", raw[48:80]) == tuple(range(-4, 4)) and words[20] == 9


def test_params_pack_edge_values_and_errors():
    p = Params("a: u32, b: f32")
    raw = p.pack(a=-1, b=1e39)  # a negative int wraps to its bits; beyond f32's range rounds to inf
    assert struct.unpack("<I", raw[:4])[0] == 0xFFFFFFFF and struct.unpack("<f", raw[4:8])[0] == float("inf")
    assert struct.unpack("<f", p.pack(a=np.int64(3), b=np.float32(0.25))[4:8])[0] == 0.25
    with pytest.raises(TypeError, match="no value for 'b'"):
        p.pack(a=1)
    with pytest.raises(TypeError, match="unknown"):
        p.pack(a=1, b=2.0, c=3)
    with pytest.raises(ValueError, match="takes 4 words"):
        Params("v: vec4<u32>").pack(v=[1, 2])
    with pytest.raises(ValueError, match="slot"):
        Params("big: array<vec4<u32>, 17>")
    with pytest.raises(ValueError, match="parameter type"):
        Params("x: vec3<f32>")


def test_header_declares_bindings_params_overrides_and_f16_only_when_used():
    k = Kernel("optim_scale", "g0: w, coef: r", "n0: u32, o0: u32, w0: u32, off_c: u32")
    src = k.spec(("f32", "f32"), SLOTS="").source()
    assert src.startswith("@group(0) @binding(0) var<storage, read_write> g0: array<f32>;")
    assert "@group(0) @binding(1) var<storage, read> coef: array<f32>;" in src
    assert "@group(0) @binding(2) var<uniform> p: Params;" in src and "override WG: u32;" in src
    assert "enable f16" not in src
    assert k.spec(("f16", "f32"), SLOTS="").source().startswith("enable f16;\n")
    # a comment that mentions f16 does not enable it (the matmul_fast file's header does)
    fast = Kernel("matmul_fast", "c: w, a: r, b: r", "M: u32", constants=())
    fills = dict(DECL="", LOAD="", LOOP="", WRITE="", HELPERS="", TILE="", SKIP="", KSTART="0u", SHARED="")
    assert "f16" in fast.spec(("vec4<f32>",) * 3, **fills).source()
    assert not fast.spec(("vec4<f32>",) * 3, **fills).source().startswith("enable")
    with pytest.raises(ValueError, match="element types"):
        k.spec(("f32",))
    assert k.spec(("f32",), without=("coef",)).buffers == (("g0", "w", "f32"),)


@pytest.mark.parametrize("wg", [64, 128])
def test_override_constants_reach_the_pipeline(dev, rng, wg):
    """softmax built with another workgroup size (one row per workgroup) still gives softmax."""
    red = sys.modules["wgpar.ops.reduce"]  # the module (wgpar.ops.reduce is the function)
    x = rng.standard_normal((5, 300)).astype(np.float32)
    t = wgpar.tensor(x)
    out = wgpar.empty(5, 300)
    k = red._SOFTMAX.spec(("f32", "f32"), constants={"WG": wg}, LOG="false", X="f32", F="f32", HMAX="v",
                          HSUM="exp(v - m)", BAD="bad1(v)", FNS=red.load_source("float_fns"),
                          MERGE=red.load_source("softmax_merge"))
    assert dict(k.constants) == {"WG": wg, "W": 1}
    dev.dispatch(k, [out._storage.buffer, t._storage.buffer], red._SOFTMAX.pack(rows=5, cols=300, off_x=0, off_y=0),
                 (5, 1))
    e = np.exp(x - x.max(1, keepdims=True))
    assert_close(out.numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_dump_wgsl_is_read_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("WGPAR_DUMP_WGSL", str(tmp_path))
    assert config.load().dump_wgsl == str(tmp_path)
    monkeypatch.delenv("WGPAR_DUMP_WGSL")
    assert config.load().dump_wgsl is None


def test_dump_wgsl_writes_every_shader_built(monkeypatch, tmp_path):
    devmod = sys.modules["wgpar.runtime.device"]
    monkeypatch.setattr(devmod, "CONFIG", dataclasses.replace(devmod.CONFIG, dump_wgsl=str(tmp_path)))
    d = wgpar.runtime.open_device(11)  # its own device: every kernel below is built (and dumped) there first
    x = wgpar.tensor(np.ones((4, 8), np.float32), device=d)
    (x * 2 + 1).sum(1).numpy()
    F.cross_entropy(x, [0, 1, 2, 3]).item()
    files = {p.name.split("-")[0]: p.read_text() for p in tmp_path.glob("*.wgsl")}
    assert {"elementwise_block", "reduce", "cross_entropy"} <= set(files)
    assert len(list(tmp_path.glob("*.wgsl"))) == len(d._pipelines)  # one file per kernel built
    block = files["elementwise_block"]
    assert block.startswith("// wgpar:elementwise_block[") and "// override constants: WG=256" in block
    assert "struct Params" in block and "@compute @workgroup_size(WG)" in block
    for text in files.values():  # what was dumped is what ran: it compiles as it is
        d._dev.create_shader_module(code=text)


def test_unroll_marked_writes_loops_out():
    """`// @unroll` loops become one block per step (inner ones too, bounds from literals or const chains,
    the loop variable replaced as a whole word only); unmarked loops stay; bad bounds raise."""
    from wgpar.runtime.kernels import unroll_marked

    code = """const BQ: u32 = BC;
const BC: u32 = 3u;
fn f() {
  for (var j = 0u; j < BQ; j = j + 1u) {  // @unroll
    y[j * 4u + j0] = 1u;  // { a brace in a comment
    for (var d = 0u; d < 2u; d = d + 1u) {  // @unroll
      z[j][d] = dd + d;
    }
  }
  for (var k = 0u; k < 9u; k = k + 1u) { w[k] = 0u; }
}"""
    out = unroll_marked(code)
    assert "for (var j" not in out and "for (var d" not in out and "for (var k = 0u; k < 9u" in out
    assert [line.strip() for line in out.splitlines() if "z[" in line] == [
        f"z[{j}u][{d}u] = dd + {d}u;" for j in range(3) for d in range(2)]
    assert [line.strip() for line in out.splitlines() if "y[" in line] == [
        f"y[{j}u * 4u + j0] = 1u;  // {{ a brace in a comment" for j in range(3)]
    assert unroll_marked("no loops") == "no loops"
    with pytest.raises(ValueError, match="no integer literal"):
        unroll_marked("for (var i = 0u; i < N; i = i + 1u) {  // @unroll\n}")
    with pytest.raises(ValueError, match="closing brace"):
        unroll_marked("for (var i = 0u; i < 2u; i = i + 1u) {  // @unroll\n x[i] = 0;")
    with pytest.raises(ValueError, match="continue or break"):
        unroll_marked("for (var i = 0u; i < 2u; i = i + 1u) {  // @unroll\n if (x[i] == 0) { continue; }\n}")
