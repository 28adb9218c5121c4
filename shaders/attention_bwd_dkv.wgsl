// Fused attention backward, second kernel: dK and dV for ROWS keys per workgroup, walking query tiles
// of BQ (attention_bwd_dq.wgsl computes dQ and delta first). With the probabilities recomputed from the
// logsumexp, P^T = exp(scale * K Q^T - lse) (keys as rows here):
//   dV = P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - delta),  dK = scale * dS^T Q.
// Rows per thread as attention_fwd.wgsl, with keys in the rows: thread r owns key j0 + r (its K and V
// rows in padded workgroup memory), the Q and dO tiles are shared and read as broadcasts; CS threads
// share a key (each accumulating DVC of the DV vec4 columns of dK and dV), so the two accumulators fit
// in registers at large head dims. Scores in log2 units (exp2).
// [q_lo, q_hi) are the queries of this dispatch (chunks of a long sequence add up with FLAGS bit 0).
// Bindings and Params are declared with the kernel in Python (wgpar/ops/attention.py).

const ROWS: u32 = {{ROWS}}u;  // keys per workgroup
const BQ: u32 = {{BQ}}u;      // queries per tile
const CS: u32 = {{CS}}u;
const NT: u32 = {{NT}}u;
const DV: u32 = {{DV}}u;
const DP: u32 = {{DP}}u;
const DVC: u32 = {{DVC}}u;
const LOG2E: f32 = 1.4426950408889634;

var<workgroup> Ks: array<vec4<f32>, {{KS}}>;  // ROWS * DP, pre-multiplied by scale * log2(e)
var<workgroup> Vs: array<vec4<f32>, {{KS}}>;
var<workgroup> Qs: array<vec4<f32>, {{QS}}>;  // BQ * DV
var<workgroup> Gs: array<vec4<f32>, {{QS}}>;  // dO rows
var<workgroup> lse_s: array<f32, {{BQ}}>;      // log2 units
var<workgroup> dl_s: array<f32, {{BQ}}>;

{{FNS}}

fn exp2_nan(x: f32) -> f32 { return select(exp2(x), x, isnan_(x)); }

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let r = tid % ROWS;
  let c0 = (tid / ROWS) * DVC;
  let bh = p.bh0 + wid.y;
  let b = bh / p.H;
  let h = bh % p.H;
  let j0 = wid.x * ROWS;  // under a causal mask the first key blocks see the most queries
  let key = j0 + r;
  let qb = p.q_off + b * p.q_sb + h * p.q_sh;
  let kb = p.k_off + b * p.k_sb + h * p.k_sh;
  let vb = p.v_off + b * p.v_sb + h * p.v_sh;
  let gb = p.g_off + b * p.g_sb + h * p.g_sh;
  let kscale = p.scale * LOG2E;
  for (var e = tid; e < ROWS * DV; e = e + NT) {
    let rr = e / DV;
    let cc = e % DV;
    var kv = vec4<f32>(0.0);
    var vv = vec4<f32>(0.0);
    if (j0 + rr < p.Tk) {
      kv = vec4<f32>(k[kb + (j0 + rr) * p.k_st + cc]) * kscale;
      vv = vec4<f32>(v[vb + (j0 + rr) * p.v_st + cc]);
    }
    Ks[rr * DP + cc] = kv;
    Vs[rr * DP + cc] = vv;
  }
  var acc_k = array<vec4<f32>, DVC>();
  var acc_v = array<vec4<f32>, DVC>();
  var start = p.q_lo;
  if (p.causal != 0u) { start = max(start, j0); }  // query i sees key j only if j <= i
  for (var i0 = start; i0 < p.q_hi; i0 = i0 + BQ) {
    workgroupBarrier();
    for (var e = tid; e < BQ * DV; e = e + NT) {
      let rr = e / DV;
      let cc = e % DV;
      var qv = vec4<f32>(0.0);
      var gv = vec4<f32>(0.0);
      if (i0 + rr < p.q_hi) {
        qv = vec4<f32>(q[qb + (i0 + rr) * p.q_st + cc]);
        gv = vec4<f32>(dout[gb + (i0 + rr) * p.g_st + cc]);
      }
      Qs[e] = qv;
      Gs[e] = gv;
    }
    for (var e = tid; e < BQ; e = e + NT) {
      var lv = 0.0;
      var dl = 0.0;
      if (i0 + e < p.q_hi) {
        let li = bh * p.Tq + i0 + e;
        lv = lse[p.l_off + li] * LOG2E;
        dl = delta[p.d_off + li];
      }
      lse_s[e] = lv;
      dl_s[e] = dl;
    }
    workgroupBarrier();
    var s = array<f32, BQ>();
    var dp = array<f32, BQ>();
    for (var d = 0u; d < DV; d = d + 1u) {
      let kd = Ks[r * DP + d];
      let vd = Vs[r * DP + d];
{{SCORES}}
    }
    // Query i0 + jj is seen when it exists and (causal) does not precede the key.
    var lim = p.q_hi - i0;
    var first = 0u;
    if (p.causal != 0u && key > i0) { first = key - i0; }
    if (key >= p.Tk) { lim = 0u; }
{{DKV}}
  }
  if (key < p.Tk) {
    let ak = p.rk_off + b * p.rk_sb + h * p.rk_sh + key * p.rk_st + c0;
    let av = p.rv_off + b * p.rv_sb + h * p.rv_sh + key * p.rv_st + c0;
    for (var x = 0u; x < DVC; x = x + 1u) {
      var gk = acc_k[x] * p.scale;
      var gv = acc_v[x];
      if ((p.flags & 1u) != 0u) {
        gk = gk + vec4<f32>(dk[ak + x]);
        gv = gv + vec4<f32>(dv[av + x]);
      }
      dk[ak + x] = vec4<{{TG}}>(gk);
      dv[av + x] = vec4<{{TG}}>(gv);
    }
  }
}
