// Fused attention backward, dQ with register tiles: the contract of attention_bwd_dq.wgsl (dQ and,
// with FLAGS bit 1, delta; FLAGS bit 0 adds to dq for key chunks; causal tiles skipped; a NaN
// logsumexp gives NaN probabilities), the structure of attention_fwd_rt.wgsl: each thread holds
// RM = 4 query rows, so one shared K / V vec4 feeds 4 rows' dot products instead of one.
// A workgroup takes ROWS query rows of one (batch, head) in row groups of 4; TK adjacent threads (one
// subgroup's lanes) share a row group. Per tile of BC keys:
//   S, dP:  lane kg computes the 4 rows x keys kg, kg + TK, ... (BCT of them): 8 + 2 BCT vec4 loads
//           per d for 8 BCT dot products; P = exp2(S - lse log2 e) from the saved logsumexp;
//   dS:     P * (dP - delta), written to workgroup memory as one vec4 (the group's 4 rows) per key;
//   dS x K: lane kg owns dQ vec4 columns kg, kg + TK, ... (CN of them) of its 4 rows: per key one
//           dS vec4 and CN K vec4 loads for 4 CN vec4 multiply-adds.
// No reduction crosses lanes in the loop (the softmax is already normalised by the logsumexp); delta's
// partial dot products meet once by subgroup shuffles. The next K / V tile is fetched into registers
// while this one is computed. Rows are padded by one vec4 (lanes reading different rows hit different
// banks). wgpar/ops/attention.py fills the sizes and the unrolled blocks and declares bindings and Params.

{{COMMON}}

var<workgroup> Qs: array<array<vec4<f32>, DP>, ROWS>;  // pre-multiplied by scale * log2(e)
var<workgroup> Gs: array<array<vec4<f32>, DP>, ROWS>;  // dO rows
var<workgroup> Ks: array<array<vec4<f32>, DP>, BC>;
var<workgroup> Vs: array<array<vec4<f32>, DP>, BC>;
var<workgroup> Ss: array<array<vec4<f32>, PR>, BC>;  // dS

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
  let g = tid / TK;   // row group: rows 4g .. 4g + 3 of the block
  let kg = tid % TK;  // lane within the group: keys kg + TK * jj, dQ columns kg + TK * x
  let bh = p.bh0 + wid.y;
  let b = bh / p.H;
  let h = bh % p.H;
  let i0 = (nwg.x - 1u - wid.x) * ROWS;  // the last (under a causal mask the longest) blocks first
  let ib = i0 + 4u * g;
  let qb = p.q_off + b * p.q_sb + h * p.q_sh;
  let kb = p.k_off + b * p.k_sb + h * p.k_sh;
  let vb = p.v_off + b * p.v_sb + h * p.v_sh;
  let gb = p.g_off + b * p.g_sb + h * p.g_sh;
  let qscale = p.scale * LOG2E;
{{LOAD_OWN}}
  workgroupBarrier();
  var lse2 = vec4<f32>(0.0);  // the group's 4 rows' logsumexps, log2 units
  var dl = vec4<f32>(0.0);    // and their delta = rowsum(dO * O)
{{ROW_STATS}}
  var acc = array<vec4<f32>, {{NACC}}>();  // [row][x]
{{KEY_LIMITS}}
{{STAGE_INIT}}
  for (var j0 = p.k_lo; j0 < k_end; j0 = j0 + BC) {
    workgroupBarrier();  // the last tile's readers are done
{{PUT}}
    workgroupBarrier();
    jn = j0 + BC;
{{FETCH}}
    var s = array<vec4<f32>, {{BCT}}>();   // [jj]: the 4 rows' scores for key kg + TK * jj
    var dp = array<vec4<f32>, {{BCT}}>();  // and dP
    for (var d = 0u; d < DV; d = d + 1u) {  // {{UNROLL}}
      let q0 = Qs[4u * g][d];
      let q1 = Qs[4u * g + 1u][d];
      let q2 = Qs[4u * g + 2u][d];
      let q3 = Qs[4u * g + 3u][d];
      let g0 = Gs[4u * g][d];
      let g1 = Gs[4u * g + 1u][d];
      let g2 = Gs[4u * g + 2u][d];
      let g3 = Gs[4u * g + 3u][d];
{{SCORES}}
    }
{{DS}}
    workgroupBarrier();  // dS complete
    for (var j = 0u; j < BC; j = j + 1u) {  // {{UNROLL}}
      let ds = Ss[j][g];
{{DQ}}
    }
  }
{{STORE}}
}
