// Fused attention forward with register tiles (FlashAttention-2's per-thread tiles): the same contract
// as attention_fwd.wgsl (O and the row's natural logsumexp, causal tiles skipped, NaN / +inf rows NaN
// by a flag, -FLT_MAX for "nothing seen", f16 inputs read as f32, [k_lo, k_hi) chunks), but each
// thread holds RM = 4 query rows, so one shared K or V vec4 feeds 4 rows' multiply-adds instead of one
// (attention_fwd.wgsl is bound by workgroup-memory bandwidth).
// A workgroup takes ROWS query rows of one (batch, head) in row groups of 4; TK adjacent threads (one
// subgroup's lanes) share a row group. Per tile of BC keys:
//   scores: thread kg of a group computes the 4 rows x BCT = BC / TK keys kg, kg + TK, ... (RM + BCT
//           vec4 loads per d for 4 * BCT dot products); the row max is reduced over the TK lanes by
//           subgroup shuffles, so every lane holds the same running max m and rescales alike;
//   P:      written to workgroup memory as one vec4 of the group's 4 rows per key;
//   P x V:  thread kg owns output vec4 columns kg, kg + TK, ... (CN of them) of its 4 rows: per key
//           one P vec4 and CN V vec4 loads for 4 * CN vec4 multiply-adds.
// Each lane sums its own keys' probabilities (l); the TK partial sums and NaN flags meet at the end.
// The next K / V tile is fetched into registers while this one is computed.
// Rows (Q, K, P) are padded by one vec4 so lanes reading different rows hit different banks; the workgroup
// arrays are arrays of rows, so a read's row is clamped (naga's bounds checks) once for its constant columns.
// wgpar/ops/attention.py fills the sizes and the unrolled blocks and declares bindings and Params.

{{COMMON}}

var<workgroup> Qs: array<array<vec4<f32>, DP>, ROWS>;
var<workgroup> Ks: array<array<vec4<f32>, DP>, BC>;
var<workgroup> Vs: array<array<vec4<f32>, DV>, BC>;
var<workgroup> Ps: array<array<vec4<f32>, PR>, BC>;

@compute @workgroup_size({{NT}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
  let g = tid / TK;   // row group: rows 4g .. 4g + 3 of the block
  let kg = tid % TK;  // lane within the group: keys kg + TK * jj, output columns kg + TK * x
  let bh = p.bh0 + wid.y;
  let b = bh / p.H;
  let h = bh % p.H;
  let i0 = (nwg.x - 1u - wid.x) * ROWS;  // the last (under a causal mask the longest) blocks first
  let ib = i0 + 4u * g;
  let qb = p.q_off + b * p.q_sb + h * p.q_sh;
  let kb = p.k_off + b * p.k_sb + h * p.k_sh;
  let vb = p.v_off + b * p.v_sb + h * p.v_sh;
  let qscale = p.scale * LOG2E;
{{LOAD_OWN}}
  var acc = array<vec4<f32>, {{NACC}}>();  // [row][x]
  var m = vec4<f32>(NEG);  // per row of the group, equal in all TK lanes
  var l = vec4<f32>(0.0);  // this lane's keys only
  var bad = vec4<bool>(false);
{{KEY_LIMITS}}
  // The next tile's K and V wait in registers (NL vec4s each) while this one is computed: its global
  // loads' latency hides behind the tile's arithmetic instead of stalling between two barriers.
{{STAGE_INIT}}
  for (var j0 = p.k_lo; j0 < k_end; j0 = j0 + BC) {
    workgroupBarrier();  // the last tile's readers are done
{{PUT}}
    workgroupBarrier();
    jn = j0 + BC;
{{FETCH}}
    var s = array<vec4<f32>, {{BCT}}>();  // [jj]: the 4 rows' scores for key kg + TK * jj
    for (var d = 0u; d < DV; d = d + 1u) {  // {{UNROLL}}
      let q0 = Qs[4u * g][d];
      let q1 = Qs[4u * g + 1u][d];
      let q2 = Qs[4u * g + 2u][d];
      let q3 = Qs[4u * g + 3u][d];
{{SCORES}}
    }
    // Masked and NaN / +inf entries become NEG (probability 0 below); a NaN / +inf marks the row bad.
    var mx = m;
{{MAX}}
{{REDUCE_MAX}}
    let alpha = exp2(m - mx);
    m = mx;
    l = l * alpha;
{{RESCALE}}
{{P}}
    workgroupBarrier();  // P complete
    for (var j = 0u; j < BC; j = j + 1u) {  // {{UNROLL}}
      let pj = Ps[j][g];
{{PV}}
    }
  }
{{REDUCE_END}}
{{STORE}}
}
