// The middle of attention's forward as matmuls (wgpar/ops/attention.py, attention_forward on a GPU): the
// scores S = Q K^T of a group of (batch, head) pairs, [rows = n Tq, cols = Tk] float32, become
// P = softmax(scale S) in place, keys past a row's limit (causal: key j > query i = row % Tq) P = 0, and
// each row's natural logsumexp of its scaled scores goes to lse (the backward recomputes P from it).
// One workgroup per row, softmax.wgsl's two passes: a running (max, sum) per thread merged in the
// workgroup, then the row written. A NaN or +inf among a row's keys makes its P and lse NaN (the
// fused kernels' rule: decided by a flag, not left to exp(NaN)); masked keys never count.
// Bindings (s: f32 read-write, lse: f32) and Params are declared in wgpar/ops/attention.py.

const NEG: f32 = -3.4028235e38;  // the logsumexp of a row that saw nothing (the fused kernels' value)

{{MERGE}}

{{FNS}}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let row = wid.x + wid.y * nwg.x;
  let live = row < p.rows;
  let base = p.off_s + row * p.cols;
  var lim = p.cols;
  if (p.causal != 0u) { lim = min(lim, row % p.tq + 1u); }
  let neg_inf = bitcast<f32>(0xff800000u);
  var m = neg_inf;
  var t = 0.0;
  var bad = false;
  if (live) {
    for (var c = lid; c < lim; c = c + WG) {
      let v = s[base + c] * p.scale;
      if (isnan_(v) || bitcast<u32>(v) == 0x7f800000u) { bad = true; continue; }
      if (v > m) { t = t * exp(m - v); m = v; }
      if (m > neg_inf) { t = t + exp(v - m); }
    }
  }
  merge_stats(lid, m, t, bad);
  if (!live) { return; }
  let row_max = rm[0];
  let total = rs[0];
  let nan_row = rbad[0] != 0u;
  let empty = !(row_max > neg_inf);  // only -inf scores: P = 0 and lse NEG, as the fused kernels give
  let inv = 1.0 / total;
  let qnan = nan_like(row_max);
  for (var c = lid; c < p.cols; c = c + WG) {
    var y = 0.0;
    if (c < lim && !empty) { y = select(exp(s[base + c] * p.scale - row_max) * inv, qnan, nan_row); }
    if (c < lim && nan_row) { y = qnan; }
    s[base + c] = y;
  }
  if (lid == 0u) {
    var val = row_max + log(total);
    if (empty) { val = NEG; }
    if (nan_row) { val = qnan; }
    lse[p.off_l + row] = val;
  }
}
