// Fused attention backward, first kernel: dQ for BR query rows per workgroup, walking key tiles of BC
// (flash-attention's backward without atomics: attention_bwd_dkv.wgsl walks queries for dK, dV).
// Probabilities are recomputed from the forward's logsumexp, P = exp(scale * Q K^T - lse), never
// stored beyond a BR x BC tile:
//   dP = dO V^T,  dS = P * (dP - delta),  dQ = scale * dS K,  delta_i = sum_d dO[i, d] * O[i, d].
// With FLAGS bit 1 this dispatch also computes delta from dO and O and writes it for the dK/dV kernel
// (the first key chunk does; later chunks read it); with bit 0 it adds to dq instead of writing
// (key chunks of a long sequence). Thread layouts and padding as attention_fwd.wgsl. A NaN logsumexp
// (a forward row that was NaN) gives NaN probabilities, which reach every gradient they touch.
// Bindings and Params are declared with the kernel in Python (wgpar/ops/attention.py, _DQ).

const BR: u32 = {{BR}}u;
const BC: u32 = {{BC}}u;
const RM: u32 = {{RM}}u;
const CN: u32 = {{CN}}u;
const DV: u32 = {{DV}}u;
const DP: u32 = {{DP}}u;
const CV: u32 = {{CV}}u;  // dQ vec4 columns per thread (layout as attention_fwd.wgsl's output phase)
const NC: u32 = {{NC}}u;
const NR: u32 = {{NR}}u;
const RR: u32 = {{RR}}u;
const BP: u32 = {{BP}}u;  // BC + 1

var<workgroup> Qs: array<vec4<f32>, {{QS}}>;   // BR * DP, pre-multiplied by scale
var<workgroup> Gs: array<vec4<f32>, {{QS}}>;   // dO rows
var<workgroup> Ks: array<vec4<f32>, {{KS}}>;   // BC * DP
var<workgroup> Vs: array<vec4<f32>, {{KS}}>;
var<workgroup> dSs: array<f32, {{PS}}>;        // BR * BP
var<workgroup> lse_s: array<f32, {{BR}}>;
var<workgroup> dl_s: array<f32, {{BR}}>;

{{FNS}}

fn exp_nan(x: f32) -> f32 { return select(exp(x), x, isnan_(x)); }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let ty = tid / 16u;
  let tx = tid % 16u;
  let bh = p.bh0 + wid.y;
  let b = bh / p.H;
  let h = bh % p.H;
  let i0 = wid.x * BR;
  let qb = p.q_off + b * p.q_sb + h * p.q_sh;
  let kb = p.k_off + b * p.k_sb + h * p.k_sh;
  let vb = p.v_off + b * p.v_sb + h * p.v_sh;
  let gb = p.g_off + b * p.g_sb + h * p.g_sh;
  for (var e = tid; e < BR * DV; e = e + 256u) {
    let r = e / DV;
    let c = e % DV;
    var qv = vec4<f32>(0.0);
    var gv = vec4<f32>(0.0);
    if (i0 + r < p.Tq) {
      qv = vec4<f32>(q[qb + (i0 + r) * p.q_st + c]) * p.scale;
      gv = vec4<f32>(dout[gb + (i0 + r) * p.g_st + c]);
    }
    Qs[r * DP + c] = qv;
    Gs[r * DP + c] = gv;
  }
  workgroupBarrier();
  if (tid < BR) {
    var lv = 0.0;
    var dl = 0.0;
    let row = i0 + tid;
    if (row < p.Tq) {
      let li = bh * p.Tq + row;
      lv = lse[p.l_off + li];
      if ((p.flags & 2u) != 0u) {
        let ob = p.o_off + b * p.o_sb + h * p.o_sh + row * p.o_st;
        for (var c = 0u; c < DV; c = c + 1u) { dl = dl + dot(Gs[tid * DP + c], vec4<f32>(o[ob + c])); }
        delta[p.d_off + li] = dl;
      } else {
        dl = delta[p.d_off + li];
      }
    }
    lse_s[tid] = lv;
    dl_s[tid] = dl;
  }
  let tr = tid / NC;
  let tc = tid % NC;
  var acc = array<array<vec4<f32>, CV>, RR>();
  var k_end = p.k_hi;
  if (p.causal != 0u) { k_end = min(k_end, i0 + BR); }
  for (var j0 = p.k_lo; j0 < k_end; j0 = j0 + BC) {
    workgroupBarrier();
    for (var e = tid; e < BC * DV; e = e + 256u) {
      let r = e / DV;
      let c = e % DV;
      var kv = vec4<f32>(0.0);
      var vv = vec4<f32>(0.0);
      if (j0 + r < k_end) {
        kv = vec4<f32>(k[kb + (j0 + r) * p.k_st + c]);
        vv = vec4<f32>(v[vb + (j0 + r) * p.v_st + c]);
      }
      Ks[r * DP + c] = kv;
      Vs[r * DP + c] = vv;
    }
    workgroupBarrier();
    var s = array<array<f32, CN>, RM>();
    var dp = array<array<f32, CN>, RM>();
    for (var d = 0u; d < DV; d = d + 1u) {
      var kv = array<vec4<f32>, CN>();
      var vv = array<vec4<f32>, CN>();
      for (var j = 0u; j < CN; j = j + 1u) {
        kv[j] = Ks[(tx + 16u * j) * DP + d];
        vv[j] = Vs[(tx + 16u * j) * DP + d];
      }
      for (var a = 0u; a < RM; a = a + 1u) {
        let qv = Qs[(ty + 16u * a) * DP + d];
        let gv = Gs[(ty + 16u * a) * DP + d];
        for (var j = 0u; j < CN; j = j + 1u) {
          s[a][j] = s[a][j] + dot(qv, kv[j]);
          dp[a][j] = dp[a][j] + dot(gv, vv[j]);
        }
      }
    }
    for (var a = 0u; a < RM; a = a + 1u) {
      let r = ty + 16u * a;
      for (var j = 0u; j < CN; j = j + 1u) {
        let col = j0 + tx + 16u * j;
        let ok = i0 + r < p.Tq && col < k_end && (p.causal == 0u || col <= i0 + r);
        let pv = select(0.0, exp_nan(s[a][j] - lse_s[r]), ok);
        dSs[r * BP + tx + 16u * j] = pv * (dp[a][j] - dl_s[r]);
      }
    }
    workgroupBarrier();
    if (tr < BR) {
      for (var j = 0u; j < BC; j = j + 1u) {
        var kk = array<vec4<f32>, CV>();
        for (var cb = 0u; cb < CV; cb = cb + 1u) { kk[cb] = Ks[j * DP + tc + NC * cb]; }
        for (var a = 0u; a < RR; a = a + 1u) {
          let ds = dSs[(tr + NR * a) * BP + j];
          for (var cb = 0u; cb < CV; cb = cb + 1u) { acc[a][cb] = acc[a][cb] + ds * kk[cb]; }
        }
      }
    }
  }
  let rb = p.r_off + b * p.r_sb + h * p.r_sh;
  if (tr < BR) {
    for (var a = 0u; a < RR; a = a + 1u) {
      let r = tr + NR * a;
      if (i0 + r < p.Tq) {
        for (var cb = 0u; cb < CV; cb = cb + 1u) {
          let at = rb + (i0 + r) * p.r_st + tc + NC * cb;
          var g = acc[a][cb] * p.scale;
          if ((p.flags & 1u) != 0u) { g = g + vec4<f32>(dq[at]); }
          dq[at] = vec4<{{TG}}>(g);
        }
      }
    }
  }
}
