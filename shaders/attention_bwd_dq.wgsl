// Fused attention backward, first kernel: dQ for ROWS query rows per workgroup, walking key tiles of BC
// (flash-attention 2's backward without atomics: attention_bwd_dkv.wgsl walks queries for dK, dV).
// Probabilities are recomputed from the forward's logsumexp, P = exp(scale * Q K^T - lse), never
// stored beyond a thread's BC registers:
//   dP = dO V^T,  dS = P * (dP - delta),  dQ = scale * dS K,  delta_i = sum_d dO[i, d] * O[i, d].
// Rows per thread as attention_fwd.wgsl: thread r owns query row i0 + r (its Q and dO rows in padded
// workgroup memory), the K and V tiles are shared and read as broadcasts; CS threads may share a row,
// each accumulating DVC of the DV dQ vec4 columns. Scores in log2 units (exp2).
// With FLAGS bit 1 this dispatch also computes delta from dO and O and writes it for the dK/dV kernel
// (the first key chunk does; later chunks read it); with bit 0 it adds to dq instead of writing
// (key chunks of a long sequence). A NaN logsumexp (a forward row that was NaN) gives NaN
// probabilities, which reach every gradient they touch.
// Bindings and Params are declared with the kernel in Python (wgpar/ops/attention.py).

const ROWS: u32 = {{ROWS}}u;
const BC: u32 = {{BC}}u;
const CS: u32 = {{CS}}u;
const NT: u32 = {{NT}}u;
const DV: u32 = {{DV}}u;
const DP: u32 = {{DP}}u;
const DVC: u32 = {{DVC}}u;
const LOG2E: f32 = 1.4426950408889634;

var<workgroup> Qs: array<vec4<f32>, {{QS}}>;  // ROWS * DP, pre-multiplied by scale * log2(e)
var<workgroup> Gs: array<vec4<f32>, {{QS}}>;  // dO rows
var<workgroup> Ks: array<vec4<f32>, {{KS}}>;  // BC * DV
var<workgroup> Vs: array<vec4<f32>, {{KS}}>;

{{FNS}}

fn exp2_nan(x: f32) -> f32 { return select(exp2(x), x, isnan_(x)); }

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
  let r = tid % ROWS;
  let c0 = (tid / ROWS) * DVC;
  let bh = p.bh0 + wid.y;
  let b = bh / p.H;
  let h = bh % p.H;
  let i0 = (nwg.x - 1u - wid.x) * ROWS;
  let i = i0 + r;
  let qb = p.q_off + b * p.q_sb + h * p.q_sh;
  let kb = p.k_off + b * p.k_sb + h * p.k_sh;
  let vb = p.v_off + b * p.v_sb + h * p.v_sh;
  let gb = p.g_off + b * p.g_sb + h * p.g_sh;
  let qscale = p.scale * LOG2E;
  for (var e = tid; e < ROWS * DV; e = e + NT) {
    let rr = e / DV;
    let cc = e % DV;
    var qv = vec4<f32>(0.0);
    var gv = vec4<f32>(0.0);
    if (i0 + rr < p.Tq) {
      qv = vec4<f32>(q[qb + (i0 + rr) * p.q_st + cc]) * qscale;
      gv = vec4<f32>(dout[gb + (i0 + rr) * p.g_st + cc]);
    }
    Qs[rr * DP + cc] = qv;
    Gs[rr * DP + cc] = gv;
  }
  workgroupBarrier();
  var lse2 = 0.0;
  var dl = 0.0;
  if (i < p.Tq) {
    let li = bh * p.Tq + i;
    lse2 = lse[p.l_off + li] * LOG2E;
    if ((p.flags & 2u) != 0u) {
      let ob = p.o_off + b * p.o_sb + h * p.o_sh + i * p.o_st;
      for (var x = 0u; x < DV; x = x + 1u) { dl = dl + dot(Gs[r * DP + x], vec4<f32>(o[ob + x])); }
      if (c0 == 0u) { delta[p.d_off + li] = dl; }
    } else {
      dl = delta[p.d_off + li];
    }
  }
  var acc = array<vec4<f32>, DVC>();
  var k_end = p.k_hi;
  if (p.causal != 0u) { k_end = min(k_end, i0 + ROWS); }
  var lim = k_end;
  if (p.causal != 0u) { lim = min(lim, i + 1u); }
  for (var j0 = p.k_lo; j0 < k_end; j0 = j0 + BC) {
    workgroupBarrier();
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
    var dp = array<f32, BC>();
    for (var d = 0u; d < DV; d = d + 1u) {
      let qd = Qs[r * DP + d];
      let gd = Gs[r * DP + d];
{{SCORES}}
    }
{{DQ}}
  }
  if (i < p.Tq) {
    let at = p.r_off + b * p.r_sb + h * p.r_sh + i * p.r_st + c0;
    for (var x = 0u; x < DVC; x = x + 1u) {
      var g = acc[x] * p.scale;
      if ((p.flags & 1u) != 0u) { g = g + vec4<f32>(dq[at + x]); }
      dq[at + x] = vec4<{{TG}}>(g);
    }
  }
}
