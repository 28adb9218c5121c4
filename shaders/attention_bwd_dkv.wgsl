// Fused attention backward, second kernel: dK and dV for BK keys per workgroup, walking query tiles of
// BQ (attention_bwd_dq.wgsl computes dQ and delta first). With the probabilities recomputed from the
// logsumexp, P^T = exp(scale * K Q^T - lse) (keys as rows here):
//   dV = P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - delta),  dK = scale * dS^T Q.
// [q_lo, q_hi) are the queries of this dispatch (chunks of a long sequence add up with FLAGS bit 0).
// Thread layouts and padding as attention_fwd.wgsl, with keys in the rows and queries in the columns.
// Bindings and Params are declared with the kernel in Python (wgpar/ops/attention.py, _DKV).

const BK: u32 = {{BK}}u;  // keys per workgroup = 16 * RK
const BQ: u32 = {{BQ}}u;  // queries per tile = 16 * CQ
const RK: u32 = {{RK}}u;
const CQ: u32 = {{CQ}}u;
const DV: u32 = {{DV}}u;
const DP: u32 = {{DP}}u;
const CV: u32 = {{CV}}u;  // dK / dV vec4 columns per thread (layout as attention_fwd.wgsl's output phase)
const NC: u32 = {{NC}}u;
const NR: u32 = {{NR}}u;
const RR: u32 = {{RR}}u;
const BP: u32 = {{BP}}u;  // BQ + 1

var<workgroup> Ks: array<vec4<f32>, {{KS}}>;   // BK * DP, pre-multiplied by scale
var<workgroup> Vs: array<vec4<f32>, {{KS}}>;
var<workgroup> Qs: array<vec4<f32>, {{QS}}>;   // BQ * DP
var<workgroup> Gs: array<vec4<f32>, {{QS}}>;   // dO rows
var<workgroup> Ps: array<f32, {{PS}}>;         // BK * BP
var<workgroup> dSs: array<f32, {{PS}}>;
var<workgroup> lse_s: array<f32, {{BQ}}>;
var<workgroup> dl_s: array<f32, {{BQ}}>;

{{FNS}}

fn exp_nan(x: f32) -> f32 { return select(exp(x), x, isnan_(x)); }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let ty = tid / 16u;
  let tx = tid % 16u;
  let bh = p.bh0 + wid.y;
  let b = bh / p.H;
  let h = bh % p.H;
  let j0 = wid.x * BK;
  let qb = p.q_off + b * p.q_sb + h * p.q_sh;
  let kb = p.k_off + b * p.k_sb + h * p.k_sh;
  let vb = p.v_off + b * p.v_sb + h * p.v_sh;
  let gb = p.g_off + b * p.g_sb + h * p.g_sh;
  for (var e = tid; e < BK * DV; e = e + 256u) {
    let r = e / DV;
    let c = e % DV;
    var kv = vec4<f32>(0.0);
    var vv = vec4<f32>(0.0);
    if (j0 + r < p.Tk) {
      kv = vec4<f32>(k[kb + (j0 + r) * p.k_st + c]) * p.scale;
      vv = vec4<f32>(v[vb + (j0 + r) * p.v_st + c]);
    }
    Ks[r * DP + c] = kv;
    Vs[r * DP + c] = vv;
  }
  let tr = tid / NC;
  let tc = tid % NC;
  var acc_k = array<array<vec4<f32>, CV>, RR>();
  var acc_v = array<array<vec4<f32>, CV>, RR>();
  var start = p.q_lo;
  if (p.causal != 0u) { start = max(start, j0); }  // query i sees key j only if j <= i
  for (var i0 = start; i0 < p.q_hi; i0 = i0 + BQ) {
    workgroupBarrier();
    for (var e = tid; e < BQ * DV; e = e + 256u) {
      let r = e / DV;
      let c = e % DV;
      var qv = vec4<f32>(0.0);
      var gv = vec4<f32>(0.0);
      if (i0 + r < p.q_hi) {
        qv = vec4<f32>(q[qb + (i0 + r) * p.q_st + c]);
        gv = vec4<f32>(dout[gb + (i0 + r) * p.g_st + c]);
      }
      Qs[r * DP + c] = qv;
      Gs[r * DP + c] = gv;
    }
    if (tid < BQ) {
      var lv = 0.0;
      var dl = 0.0;
      if (i0 + tid < p.q_hi) {
        let li = bh * p.Tq + i0 + tid;
        lv = lse[p.l_off + li];
        dl = delta[p.d_off + li];
      }
      lse_s[tid] = lv;
      dl_s[tid] = dl;
    }
    workgroupBarrier();
    var s = array<array<f32, CQ>, RK>();
    var dp = array<array<f32, CQ>, RK>();
    for (var d = 0u; d < DV; d = d + 1u) {
      var qv = array<vec4<f32>, CQ>();
      var gv = array<vec4<f32>, CQ>();
      for (var j = 0u; j < CQ; j = j + 1u) {
        qv[j] = Qs[(tx + 16u * j) * DP + d];
        gv[j] = Gs[(tx + 16u * j) * DP + d];
      }
      for (var a = 0u; a < RK; a = a + 1u) {
        let kv = Ks[(ty + 16u * a) * DP + d];
        let vv = Vs[(ty + 16u * a) * DP + d];
        for (var j = 0u; j < CQ; j = j + 1u) {
          s[a][j] = s[a][j] + dot(kv, qv[j]);
          dp[a][j] = dp[a][j] + dot(vv, gv[j]);
        }
      }
    }
    for (var a = 0u; a < RK; a = a + 1u) {
      let r = ty + 16u * a;
      for (var j = 0u; j < CQ; j = j + 1u) {
        let c = tx + 16u * j;
        let ok = j0 + r < p.Tk && i0 + c < p.q_hi && (p.causal == 0u || j0 + r <= i0 + c);
        let pv = select(0.0, exp_nan(s[a][j] - lse_s[c]), ok);
        Ps[r * BP + c] = pv;
        dSs[r * BP + c] = pv * (dp[a][j] - dl_s[c]);
      }
    }
    workgroupBarrier();
    if (tr < BK) {
      for (var j = 0u; j < BQ; j = j + 1u) {
        var gg = array<vec4<f32>, CV>();
        var qq = array<vec4<f32>, CV>();
        for (var cb = 0u; cb < CV; cb = cb + 1u) {
          gg[cb] = Gs[j * DP + tc + NC * cb];
          qq[cb] = Qs[j * DP + tc + NC * cb];
        }
        for (var a = 0u; a < RR; a = a + 1u) {
          let pv = Ps[(tr + NR * a) * BP + j];
          let ds = dSs[(tr + NR * a) * BP + j];
          for (var cb = 0u; cb < CV; cb = cb + 1u) {
            acc_v[a][cb] = acc_v[a][cb] + pv * gg[cb];
            acc_k[a][cb] = acc_k[a][cb] + ds * qq[cb];
          }
        }
      }
    }
  }
  let kob = p.rk_off + b * p.rk_sb + h * p.rk_sh;
  let vob = p.rv_off + b * p.rv_sb + h * p.rv_sh;
  if (tr < BK) {
    for (var a = 0u; a < RR; a = a + 1u) {
      let r = tr + NR * a;
      if (j0 + r < p.Tk) {
        for (var cb = 0u; cb < CV; cb = cb + 1u) {
          let ak = kob + (j0 + r) * p.rk_st + tc + NC * cb;
          let av = vob + (j0 + r) * p.rv_st + tc + NC * cb;
          var gk = acc_k[a][cb] * p.scale;
          var gv = acc_v[a][cb];
          if ((p.flags & 1u) != 0u) {
            gk = gk + vec4<f32>(dk[ak]);
            gv = gv + vec4<f32>(dv[av]);
          }
          dk[ak] = vec4<{{TG}}>(gk);
          dv[av] = vec4<{{TG}}>(gv);
        }
      }
    }
  }
}
