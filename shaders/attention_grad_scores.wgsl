// The middle of attention's backward as matmuls (wgpar/ops/attention.py, _matmul_backward on a GPU): for a
// group of (batch, head) pairs, the scores S = Q K^T and dP = dO V^T, [rows = n Tq, cols = Tk] float32,
// become in place P = exp(scale S - lse) (the forward's probabilities, from its logsumexp) and
// scale dS = scale P (dP - delta), delta = rowsum(dO * O): the gradient of the unscaled scores, which
// dQ = dS K, dK = dS^T Q take; dV = P^T dO takes P. Keys past a row's limit (causal: key j > query
// i = row % Tq) get P = dS = 0 over the whole row, so the causal products may read any of them (zeroing
// only as far as they read, as the forward's softmax pass does, measured no faster on an H100). A NaN
// logsumexp (a row that saw NaN or +inf) makes the row's P and dS NaN, as in the fused kernels.
// TPR threads per row, WG / TPR rows per workgroup, 4 adjacent columns a thread every 4 TPR (a vec4 where
// the rows are aligned: ld_ / st_, attention.py's _row_access; which declares the bindings (s, dp: read-write;
// lse, delta: f32) and Params).

const LOG2E: f32 = 1.4426950408889634;
const TPR: u32 = {{TPR}};
const STEP: u32 = 4u * TPR;

fn exp2_nan(x: vec4<f32>) -> vec4<f32> {  // exp2 that keeps a NaN (not every GPU's exp2 does)
  return select(exp2(x), x, (bitcast<vec4<u32>>(x) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u));
}

{{ACCESS}}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let row = (wid.x + wid.y * nwg.x) * (WG / TPR) + lid / TPR;
  if (row >= p.rows) { return; }
  let bs = p.off_s + row * p.cols;
  let bd = p.off_dp + row * p.cols;
  var lim = p.cols;
  if (p.causal != 0u) { lim = min(lim, row % p.tq + 1u); }
  let l2 = vec4<f32>(lse[p.off_l + row] * LOG2E);
  let dl = vec4<f32>(delta[p.off_d + row]);
  let s2 = p.scale * LOG2E;
  for (var c = 4u * (lid % TPR); c < p.cols; c = c + STEP) {
    let ok = vec4<u32>(c) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(lim);
    let pv = select(vec4<f32>(0.0), exp2_nan(ld_s(bs, c) * s2 - l2), ok);
    st_s(bs, c, pv);
    st_dp(bd, c, select(vec4<f32>(0.0), pv * (ld_dp(bd, c) - dl) * p.scale, ok));
  }
}
