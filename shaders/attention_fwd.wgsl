// Fused attention forward, flash-attention 2 style: O = softmax(scale * Q K^T [+ causal mask]) V for one
// (batch, head) per workgroup row of the grid and ROWS query rows per workgroup, without a [T, T]
// score matrix anywhere. Keys are walked in tiles of BC through workgroup memory; each thread owns one
// query row (ONNX Runtime's WebGPU flash attention: rows per thread), so the online softmax (running max
// m and sum l) lives in its registers and needs no reduction across threads: two barriers per tile.
// Every thread of a warp reads the same K / V vec4 (a broadcast), and each vec4 feeds 4 multiply-adds.
// CS threads may share a row (each owns DVC of its DV output vec4 columns and recomputes the row's
// scores), for head dims whose accumulators would not fit one thread's registers.
// Scores are in log2 units (Q pre-multiplied by scale * log2(e)) so the softmax uses exp2. Writes O
// (normalised) and the row's natural logsumexp, which the backward kernels recompute P from.
// A row holding a NaN or +inf score comes out all NaN (PyTorch's softmax does the same), decided by a
// flag: no inf arithmetic is left to a driver that assumes none; "nothing seen yet" is the finite NEG,
// and masked entries get probability exactly 0 by a select. Inputs may be f16 (read as f32).
// wgpar/ops/attention.py fills the sizes and the inner blocks (SCORES, MAX, PV: loops, or
// unrolled straight-line code on GPUs) and declares the bindings and Params: offsets and strides
// (batch, head, row) in vec4 units; [k_lo, k_hi) the keys of this dispatch (a chunk of Tk when one
// invocation would loop too long); bh0 the first batch * head of this dispatch.

const ROWS: u32 = {{ROWS}}u;  // query rows per workgroup
const BC: u32 = {{BC}}u;      // keys per tile
const CS: u32 = {{CS}}u;      // threads per row
const NT: u32 = {{NT}}u;      // ROWS * CS threads
const DV: u32 = {{DV}}u;      // head_dim / 4
const DP: u32 = {{DP}}u;      // DV + 1: a padded Q row (threads reading their own rows hit different banks)
const DVC: u32 = {{DVC}}u;    // DV / CS output vec4 columns per thread
const NEG: f32 = -3.4028235e38;
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;

var<workgroup> Qs: array<vec4<f32>, {{QS}}>;  // ROWS * DP
var<workgroup> Ks: array<vec4<f32>, {{KS}}>;  // BC * DV
var<workgroup> Vs: array<vec4<f32>, {{KS}}>;

{{FNS}}

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
  let r = tid % ROWS;
  let c0 = (tid / ROWS) * DVC;
  let bh = p.bh0 + wid.y;
  let b = bh / p.H;
  let h = bh % p.H;
  let i0 = (nwg.x - 1u - wid.x) * ROWS;  // the last (under a causal mask the longest) blocks first
  let i = i0 + r;
  let qb = p.q_off + b * p.q_sb + h * p.q_sh;
  let kb = p.k_off + b * p.k_sb + h * p.k_sh;
  let vb = p.v_off + b * p.v_sb + h * p.v_sh;
  let qscale = p.scale * LOG2E;
  for (var e = tid; e < ROWS * DV; e = e + NT) {
    let rr = e / DV;
    let cc = e % DV;
    var val = vec4<f32>(0.0);
    if (i0 + rr < p.Tq) { val = vec4<f32>(q[qb + (i0 + rr) * p.q_st + cc]) * qscale; }
    Qs[rr * DP + cc] = val;
  }
  var acc = array<vec4<f32>, DVC>();
  var m = NEG;
  var l = 0.0;
  var bad = false;
  var k_end = p.k_hi;
  if (p.causal != 0u) { k_end = min(k_end, i0 + ROWS); }  // row i sees keys j <= i
  var lim = k_end;
  if (p.causal != 0u) { lim = min(lim, i + 1u); }
  for (var j0 = p.k_lo; j0 < k_end; j0 = j0 + BC) {
    workgroupBarrier();  // the last tile's readers are done
    for (var e = tid; e < BC * DV; e = e + NT) {
      let rr = e / DV;
      let cc = e % DV;
      var kv = vec4<f32>(0.0);
      var vv = vec4<f32>(0.0);
      if (j0 + rr < k_end) {
        kv = vec4<f32>(k[kb + (j0 + rr) * p.k_st + cc]);
        vv = vec4<f32>(v[vb + (j0 + rr) * p.v_st + cc]);
      }
      Ks[e] = kv;
      Vs[e] = vv;
    }
    workgroupBarrier();
    var s = array<f32, BC>();
    for (var d = 0u; d < DV; d = d + 1u) {
      let qd = Qs[r * DP + d];
{{SCORES}}
    }
    // Masked and NaN / +inf entries become NEG (probability 0 below); a NaN / +inf marks the row bad.
    var mx = m;
{{MAX}}
    let alpha = exp2(m - mx);
    m = mx;
    l = l * alpha;
    for (var x = 0u; x < DVC; x = x + 1u) { acc[x] = acc[x] * alpha; }
{{PV}}
  }
  if (i < p.Tq) {
    let ob = p.o_off + b * p.o_sb + h * p.o_sh + i * p.o_st + c0;
    for (var x = 0u; x < DVC; x = x + 1u) {
      var out = vec4<f32>(0.0);  // a row that sees no key here (a later chunk's keys): weight 0 in the merge
      if (l > 0.0) { out = acc[x] / l; }
      if (bad) { out = vec4<f32>(nan_like(l)); }
      o[ob + x] = vec4<{{TO}}>(out);
    }
    if (c0 == 0u) {
      var val = NEG;
      if (l > 0.0) { val = (m + log2(l)) * LN2; }
      if (bad) { val = nan_like(l); }
      lse[p.l_off + bh * p.Tq + i] = val;
    }
  }
}
