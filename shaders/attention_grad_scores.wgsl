// The middle of attention's backward as matmuls (wgpar/ops/attention.py, _matmul_backward on a GPU): for a
// group of (batch, head) pairs, the scores S = Q K^T and dP = dO V^T, [rows = n Tq, cols = Tk] float32,
// become in place P = exp(scale S - lse) (the forward's probabilities, from its logsumexp) and
// scale dS = scale P (dP - delta), delta = rowsum(dO * O): the gradient of the unscaled scores, which
// dQ = dS K, dK = dS^T Q take; dV = P^T dO takes P. Keys past a row's limit (causal: key j > query
// i = row % Tq) get P = dS = 0 over the whole row, so the causal products may read any of them. A NaN
// logsumexp (a row that saw NaN or +inf) makes the row's P and dS NaN, as in the fused kernels.
// One workgroup per row. Bindings (s, dp: f32 read-write; lse, delta: f32) and Params are declared in
// wgpar/ops/attention.py.

const LOG2E: f32 = 1.4426950408889634;

fn exp2_nan(x: f32) -> f32 {  // exp2 that keeps a NaN (not every GPU's exp2 does)
  return select(exp2(x), x, (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= p.rows) { return; }
  let bs = p.off_s + row * p.cols;
  let bd = p.off_dp + row * p.cols;
  var lim = p.cols;
  if (p.causal != 0u) { lim = min(lim, row % p.tq + 1u); }
  let l2 = lse[p.off_l + row] * LOG2E;
  let dl = delta[p.off_d + row];
  let s2 = p.scale * LOG2E;
  for (var c = lid; c < p.cols; c = c + WG) {
    var pv = 0.0;
    var dsv = 0.0;
    if (c < lim) {
      pv = exp2_nan(s[bs + c] * s2 - l2);
      dsv = pv * (dp[bd + c] - dl) * p.scale;
    }
    s[bs + c] = pv;
    dp[bd + c] = dsv;
  }
}
