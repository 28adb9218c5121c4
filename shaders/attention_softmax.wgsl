// The middle of attention's forward as matmuls (wgpar/ops/attention.py, attention_forward on a GPU): the
// scores S = Q K^T of a group of (batch, head) pairs, [rows = n Tq, cols = Tk] float32, become
// P = softmax(scale S) in place, keys past a row's limit (causal: key j > query i = row % Tq) P = 0, and
// each row's natural logsumexp of its scaled scores goes to lse (the backward recomputes P from it).
// TPR threads per row, WG / TPR rows per workgroup; a thread takes 4 adjacent columns every 4 TPR (one
// vec4 where the rows are aligned), keeps its first CACHE of them in registers between the two
// passes (the row is read once where it fits) and merges a running (max, sum) with its row's other
// threads through workgroup memory (softmax_merge.wgsl). Past a causal row's limit only the columns
// before p.band's next multiple are zeroed (P V reads no further: matmul_causal's tile rows; p.band = 0
// writes whole rows).
// A NaN or +inf among a row's keys makes its P and lse NaN (the fused kernels' rule: decided by a flag,
// not left to exp(NaN)); masked keys never count.
// Bindings (s: f32 or vec4<f32> read-write, lse: f32) and Params are declared in wgpar/ops/attention.py.

const NEG: f32 = -3.4028235e38;  // the logsumexp of a row that saw nothing (the fused kernels' value)
const TPR: u32 = {{TPR}};
const CACHE: u32 = {{CACHE}};
const STEP: u32 = 4u * TPR;  // columns between a thread's two chunks

{{MERGE}}

{{FNS}}

// ld_s: columns c .. c + 3 of the row starting at element base (c + 3 may pass the row: the caller masks
// them); st_s: y to those of them within the row (attention.py's _row_access).
{{ACCESS}}

fn live_cols(c: u32, lim: u32) -> vec4<bool> {
  return vec4<u32>(c) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(lim);
}

struct Stats { m: f32, t: f32, bad: bool }

// The running max m and sum t of exp(x - m) over x's live columns; a NaN or +inf among them marks bad.
fn add(a: Stats, x: vec4<f32>, ok: vec4<bool>) -> Stats {
  let neg_inf = bitcast<f32>(0xff800000u);
  let u = bitcast<vec4<u32>>(x);
  let odd = ((u & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u)) | (u == vec4<u32>(0x7f800000u));
  let v = select(vec4<f32>(neg_inf), x, ok & !odd);
  var r = a;
  r.bad = r.bad || any(ok & odd);
  let mn = max(r.m, max(max(v.x, v.y), max(v.z, v.w)));
  if (mn > neg_inf) {
    r.t = r.t * exp(r.m - mn) + dot(exp(v - vec4<f32>(mn)), vec4<f32>(1.0));
    r.m = mn;
  }
  return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let lane = lid % TPR;
  let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
  let live = row < p.rows;
  let base = p.off_s + row * p.cols;
  var lim = p.cols;
  if (p.causal != 0u) { lim = min(lim, row % p.tq + 1u); }
  var wend = p.cols;  // the columns written
  if (p.band != 0u) { wend = min(wend, (lim + p.band - 1u) / p.band * p.band); }
  let neg_inf = bitcast<f32>(0xff800000u);
  var acc = Stats(neg_inf, 0.0, false);
  var keep: array<vec4<f32>, CACHE>;
  let c0 = 4u * lane;
  if (live) {
    for (var k = 0u; k < CACHE; k = k + 1u) {  // {{UNROLL}}
      let c = c0 + k * STEP;
      if (c < lim) {
        keep[k] = ld_s(base, c) * p.scale;
        acc = add(acc, keep[k], live_cols(c, lim));
      }
    }
    for (var c = c0 + CACHE * STEP; c < lim; c = c + STEP) {
      acc = add(acc, ld_s(base, c) * p.scale, live_cols(c, lim));
    }
  }
  merge_stats(lid, TPR, acc.m, acc.t, acc.bad);  // the row's TPR threads (every thread reaches its barriers)
  if (!live) { return; }
  let head = lid - lane;
  let row_max = rm[head];
  let total = rs[head];
  let nan_row = rbad[head] != 0u;
  let empty = !(row_max > neg_inf);  // only -inf scores: P = 0 and lse NEG, as the fused kernels give
  let inv = 1.0 / total;
  let qnan = vec4<f32>(nan_like(row_max));
  for (var k = 0u; k < CACHE; k = k + 1u) {  // {{UNROLL}}
    let c = c0 + k * STEP;
    if (c < wend) {
      let ok = live_cols(c, lim);
      let y = select(vec4<f32>(0.0), exp(keep[k] - vec4<f32>(row_max)) * inv, ok & vec4<bool>(!empty));
      st_s(base, c, select(y, qnan, ok & vec4<bool>(nan_row)));
    }
  }
  for (var c = c0 + CACHE * STEP; c < wend; c = c + STEP) {
    let ok = live_cols(c, lim);
    let y = select(vec4<f32>(0.0), exp(ld_s(base, c) * p.scale - vec4<f32>(row_max)) * inv, ok & vec4<bool>(!empty));
    st_s(base, c, select(y, qnan, ok & vec4<bool>(nan_row)));
  }
  if (lane == 0u) {
    var val = row_max + log(total);
    if (empty) { val = NEG; }
    if (nan_row) { val = qnan.x; }
    lse[p.off_l + row] = val;
  }
}
