// Fused attention backward, dK and dV with register tiles: the contract of attention_bwd_dkv.wgsl
// ([q_lo, q_hi) query chunks adding up with FLAGS bit 0, causal tiles skipped, a NaN logsumexp giving
// NaN probabilities), the structure of attention_fwd_rt.wgsl with keys as rows: each thread holds
// RM = 4 key rows, so one shared Q / dO vec4 feeds 4 keys' dot products instead of one.
// A workgroup takes ROWS keys of one (batch, head) in row groups of 4; TK adjacent threads (one
// subgroup's lanes) share a group. Per tile of BQ queries:
//   S^T, dP^T: lane kg computes the 4 keys x queries kg, kg + TK, ... (BCT of them);
//              P^T = exp2(S^T - lse log2 e), dS^T = P^T * (dP^T - delta), both written to workgroup
//              memory as one vec4 (the group's 4 keys) per query;
//   dV += P^T dO, dK += dS^T Q: lane kg owns vec4 columns kg, kg + TK, ... (CN of them) of its 4 keys'
//              dK and dV: per query 2 vec4 of P / dS and 2 CN Q / dO loads for 8 CN multiply-adds.
// No reduction crosses lanes. The next Q / dO tile is fetched into registers while this one is computed.
// Rows are padded by one vec4. wgpar/ops/attention.py fills the sizes and blocks, bindings and Params.

{{COMMON}}
const BQ: u32 = BC;  // queries per tile

var<workgroup> Ks: array<array<vec4<f32>, DP>, ROWS>;  // pre-multiplied by scale * log2(e)
var<workgroup> Vs: array<array<vec4<f32>, DP>, ROWS>;
var<workgroup> Qs: array<array<vec4<f32>, DP>, BQ>;
var<workgroup> Gs: array<array<vec4<f32>, DP>, BQ>;  // dO rows
var<workgroup> Ps: array<array<vec4<f32>, PR>, BQ>;  // P^T
var<workgroup> Ss: array<array<vec4<f32>, PR>, BQ>;  // dS^T
var<workgroup> lse_s: array<f32, {{BC}}>;      // log2 units
var<workgroup> dl_s: array<f32, {{BC}}>;

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let g = tid / TK;   // row group: keys 4g .. 4g + 3 of the block
  let kg = tid % TK;  // lane within the group: queries kg + TK * jj, columns kg + TK * x
  let bh = p.bh0 + wid.y;
  let b = bh / p.H;
  let h = bh % p.H;
  let j0 = wid.x * ROWS;  // under a causal mask the first key blocks see the most queries
  let jb = j0 + 4u * g;
  let keys = vec4<u32>(jb, jb + 1u, jb + 2u, jb + 3u);
  let qb = p.q_off + b * p.q_sb + h * p.q_sh;
  let kb = p.k_off + b * p.k_sb + h * p.k_sh;
  let vb = p.v_off + b * p.v_sb + h * p.v_sh;
  let gb = p.g_off + b * p.g_sb + h * p.g_sh;
  let kscale = p.scale * LOG2E;
{{LOAD_OWN}}
  var acc_k = array<vec4<f32>, {{NACC}}>();  // [row][x]
  var acc_v = array<vec4<f32>, {{NACC}}>();
  var start = p.q_lo;
  if (p.causal != 0u) { start = max(start, j0); }  // query i sees key j only if j <= i
  let key_ok = keys < vec4<u32>(p.Tk);
{{STAGE_INIT}}
  for (var i0 = start; i0 < p.q_hi; i0 = i0 + BQ) {
    workgroupBarrier();  // the last tile's readers are done
{{PUT}}
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
    jn = i0 + BQ;
{{FETCH}}
    var s = array<vec4<f32>, {{BCT}}>();   // [jj]: the 4 keys' scores for query kg + TK * jj
    var dp = array<vec4<f32>, {{BCT}}>();  // and dP^T
    for (var d = 0u; d < DV; d = d + 1u) {  // {{UNROLL}}
      let k0 = Ks[4u * g][d];
      let k1 = Ks[4u * g + 1u][d];
      let k2 = Ks[4u * g + 2u][d];
      let k3 = Ks[4u * g + 3u][d];
      let v0 = Vs[4u * g][d];
      let v1 = Vs[4u * g + 1u][d];
      let v2 = Vs[4u * g + 2u][d];
      let v3 = Vs[4u * g + 3u][d];
{{SCORES}}
    }
    // Query i is seen by key j when it exists, the key exists and (causal) j <= i.
{{DS}}
    workgroupBarrier();  // P^T and dS^T complete
    for (var j = 0u; j < BQ; j = j + 1u) {  // {{UNROLL}}
      let pj = Ps[j][g];
      let ds = Ss[j][g];
{{ACC}}
    }
  }
{{STORE}}
}
