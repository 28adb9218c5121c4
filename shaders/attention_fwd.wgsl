// Fused attention forward, flash-attention style: O = softmax(scale * Q K^T [+ causal mask]) V for one
// (batch, head) per workgroup row of the grid and BR query rows per workgroup, without a [T, T] score
// matrix anywhere but a BR x BC tile in workgroup memory. Keys are walked in tiles of BC; each row
// keeps a running max m and sum l of exp(s - m) (the online softmax), rescaling its output
// accumulator when m grows. Writes O (normalised) and the row's logsumexp m + log(l), which the
// backward kernels use to recompute the probabilities. wgpar/ops/attention.py fills the sizes.
//
// 256 threads. Score phase: thread (ty, tx) = (tid / 16, tid % 16) computes rows ty + 16a (a < RM) x
// keys tx + 16j (j < CN) of the tile. Output phase: thread (tr, tc) = (tid / NC, tid % NC) owns rows
// tr + NR a (a < RR) x vec4 columns tc + NC b (b < CV) of the BR x D output, so each probability and
// each V vec4 it loads serves CV, or RR, multiply-adds (register blocking). Q (pre-multiplied by
// scale), K and V tiles sit in workgroup memory as f32 vec4 rows padded by one vec4 (the 16 threads
// reading 16 different keys hit different banks), the probabilities as rows padded by one word; K and
// V share one buffer (V is loaded once the scores are taken). Inputs may be f16 (read as f32,
// accumulated in f32). A row holding a NaN or +inf score comes out all NaN (PyTorch's softmax does the
// same), decided by a flag: no inf arithmetic is left to a driver that assumes none; "nothing seen
// yet" is the finite NEG, and masked entries get probability exactly 0 by a select.
// Offsets and strides (batch, head, row) in vec4 units; [k_lo, k_hi) the keys of this dispatch (a chunk
// of Tk when one invocation would loop too long); bh0 the first batch * head of this dispatch.
// Bindings and Params are declared with the kernel in Python (wgpar/ops/attention.py, _FWD).

const BR: u32 = {{BR}}u;  // query rows per workgroup = 16 * RM
const BC: u32 = {{BC}}u;  // keys per tile = 16 * CN
const RM: u32 = {{RM}}u;
const CN: u32 = {{CN}}u;
const DV: u32 = {{DV}}u;  // head_dim / 4
const DP: u32 = {{DP}}u;  // DV + 1 (padded row)
const CV: u32 = {{CV}}u;  // output vec4 columns per thread
const NC: u32 = {{NC}}u;  // DV / CV threads across the output columns
const NR: u32 = {{NR}}u;  // 256 / NC threads down the rows
const RR: u32 = {{RR}}u;  // output rows per thread (BR / NR, or 1 when BR < NR: threads tr >= BR idle)
const BP: u32 = {{BP}}u;  // BC + 1: a probability row, padded
const NEG: f32 = -3.4028235e38;

var<workgroup> Qs: array<vec4<f32>, {{QS}}>;   // BR * DP
var<workgroup> KVs: array<vec4<f32>, {{KS}}>;  // BC * DP
var<workgroup> Ps: array<f32, {{PS}}>;         // BR * BP probabilities of the tile
var<workgroup> red_m: array<f32, {{RS}}>;      // BR * 16 per-thread row maxima
var<workgroup> red_l: array<f32, {{RS}}>;      // BR * 16 per-thread row sums
var<workgroup> m_s: array<f32, {{M2}}>;        // 2 * BR: row max before / after this tile (by parity)
var<workgroup> l_s: array<f32, {{BR}}>;
var<workgroup> bad_s: array<u32, {{BR}}>;

{{FNS}}

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
  for (var e = tid; e < BR * DV; e = e + 256u) {
    let r = e / DV;
    let c = e % DV;
    var val = vec4<f32>(0.0);
    if (i0 + r < p.Tq) { val = vec4<f32>(q[qb + (i0 + r) * p.q_st + c]) * p.scale; }
    Qs[r * DP + c] = val;
  }
  if (tid < BR) {
    m_s[tid] = NEG;
    m_s[BR + tid] = NEG;
    l_s[tid] = 0.0;
    bad_s[tid] = 0u;
  }
  let tr = tid / NC;
  let tc = tid % NC;
  var acc = array<array<vec4<f32>, CV>, RR>();
  var k_end = p.k_hi;
  if (p.causal != 0u) { k_end = min(k_end, i0 + BR); }  // row i sees keys j <= i
  var par = 0u;
  for (var j0 = p.k_lo; j0 < k_end; j0 = j0 + BC) {
    workgroupBarrier();  // the last tile's readers of KVs / Ps / m_s are done
    for (var e = tid; e < BC * DV; e = e + 256u) {
      let r = e / DV;
      let c = e % DV;
      var val = vec4<f32>(0.0);
      if (j0 + r < k_end) { val = vec4<f32>(k[kb + (j0 + r) * p.k_st + c]); }
      KVs[r * DP + c] = val;
    }
    workgroupBarrier();
    var s = array<array<f32, CN>, RM>();
    for (var d = 0u; d < DV; d = d + 1u) {
      var kv = array<vec4<f32>, CN>();
      for (var j = 0u; j < CN; j = j + 1u) { kv[j] = KVs[(tx + 16u * j) * DP + d]; }
      for (var a = 0u; a < RM; a = a + 1u) {
        let qv = Qs[(ty + 16u * a) * DP + d];
        for (var j = 0u; j < CN; j = j + 1u) { s[a][j] = s[a][j] + dot(qv, kv[j]); }
      }
    }
    var okbits = array<u32, RM>();
    for (var a = 0u; a < RM; a = a + 1u) {
      let r = ty + 16u * a;
      var mx = NEG;
      var bits = 0u;
      for (var j = 0u; j < CN; j = j + 1u) {
        let col = j0 + tx + 16u * j;
        let x = s[a][j];
        let ok = col < k_end && (p.causal == 0u || col <= i0 + r);
        let bad = ok && (isnan_(x) || bitcast<u32>(x) == 0x7f800000u);
        if (bad) { bad_s[r] = 1u; }
        if (ok && !bad) {
          bits = bits | (1u << j);
          mx = max(mx, x);
        }
      }
      okbits[a] = bits;
      red_m[r * 16u + tx] = mx;
    }
    workgroupBarrier();
    for (var e = tid; e < BC * DV; e = e + 256u) {  // V into the K buffer: every score is taken
      let r = e / DV;
      let c = e % DV;
      var val = vec4<f32>(0.0);
      if (j0 + r < k_end) { val = vec4<f32>(v[vb + (j0 + r) * p.v_st + c]); }
      KVs[r * DP + c] = val;
    }
    if (tid < BR) {  // the rows' new max, from the 16 threads' partial maxima
      var mt = m_s[par * BR + tid];
      for (var t = 0u; t < 16u; t = t + 1u) { mt = max(mt, red_m[tid * 16u + t]); }
      m_s[(1u - par) * BR + tid] = mt;
    }
    workgroupBarrier();
    for (var a = 0u; a < RM; a = a + 1u) {
      let r = ty + 16u * a;
      let mt = m_s[(1u - par) * BR + r];
      var sum = 0.0;
      for (var j = 0u; j < CN; j = j + 1u) {
        let pv = select(0.0, exp(s[a][j] - mt), ((okbits[a] >> j) & 1u) != 0u);
        Ps[r * BP + tx + 16u * j] = pv;
        sum = sum + pv;
      }
      red_l[r * 16u + tx] = sum;
    }
    workgroupBarrier();
    if (tid < BR) {
      let alpha = exp(m_s[par * BR + tid] - m_s[(1u - par) * BR + tid]);
      var sum = 0.0;
      for (var t = 0u; t < 16u; t = t + 1u) { sum = sum + red_l[tid * 16u + t]; }
      l_s[tid] = l_s[tid] * alpha + sum;
    }
    if (tr < BR) {
      for (var a = 0u; a < RR; a = a + 1u) {
        let r = tr + NR * a;
        let alpha = exp(m_s[par * BR + r] - m_s[(1u - par) * BR + r]);
        for (var cb = 0u; cb < CV; cb = cb + 1u) { acc[a][cb] = acc[a][cb] * alpha; }
      }
      for (var j = 0u; j < BC; j = j + 1u) {
        var vv = array<vec4<f32>, CV>();
        for (var cb = 0u; cb < CV; cb = cb + 1u) { vv[cb] = KVs[j * DP + tc + NC * cb]; }
        for (var a = 0u; a < RR; a = a + 1u) {
          let pv = Ps[(tr + NR * a) * BP + j];
          for (var cb = 0u; cb < CV; cb = cb + 1u) { acc[a][cb] = acc[a][cb] + pv * vv[cb]; }
        }
      }
    }
    par = 1u - par;
  }
  workgroupBarrier();
  let ob = p.o_off + b * p.o_sb + h * p.o_sh;
  if (tr < BR) {
    for (var a = 0u; a < RR; a = a + 1u) {
      let r = tr + NR * a;
      if (i0 + r < p.Tq) {
        let l = l_s[r];
        for (var cb = 0u; cb < CV; cb = cb + 1u) {
          var out = vec4<f32>(0.0);  // a row that sees no key here (a later chunk's keys): weight 0 in the merge
          if (l > 0.0) { out = acc[a][cb] / l; }
          if (bad_s[r] != 0u) { out = vec4<f32>(nan_like(l)); }
          o[ob + (i0 + r) * p.o_st + tc + NC * cb] = vec4<{{TO}}>(out);
        }
      }
    }
  }
  if (tid < BR && i0 + tid < p.Tq) {
    let l = l_s[tid];
    var val = NEG;
    if (l > 0.0) { val = m_s[par * BR + tid] + log(l); }
    if (bad_s[tid] != 0u) { val = nan_like(l); }
    lse[p.l_off + bh * p.Tq + i0 + tid] = val;
  }
}
