// Fused LayerNorm forward over the rows of a contiguous [rows, cols] block:
// y = (x - mean) * rstd * w + b, and each row's mean and rstd = 1 / sqrt(var + eps) for the backward
// (layer_norm_bwd.wgsl). A workgroup of 256 threads takes 256 / TPR rows, TPR threads per row (a power
// of two the host picks from cols: short rows need no 256-wide reduction tree), each thread striding
// over its row. Two passes for the variance (mean first). A NaN or inf in a row makes that row NaN
// through the arithmetic alone (no max or comparison is involved).
// Bindings and Params are declared with the kernel in Python (wgpar/ops/layer_norm.py).

const TPR: u32 = {{TPR}}u;
var<workgroup> red: array<f32, 256>;

// The sum of `a` over each row's TPR lanes; every thread of the workgroup calls it (barriers).
fn row_sum(tid: u32, lane: u32, a: f32) -> f32 {
  red[tid] = a;
  workgroupBarrier();
  for (var s = TPR / 2u; s > 0u; s = s >> 1u) {
    if (lane < s) { red[tid] = red[tid] + red[tid + s]; }
    workgroupBarrier();
  }
  let r = red[tid - lane];
  workgroupBarrier();
  return r;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
  let lane = tid % TPR;
  let row = (wid.x + wid.y * nwg.x) * (256u / TPR) + tid / TPR;
  let live = row < p.rows;
  let n = select(0u, p.cols, live);
  let bx = p.off_x + row * p.cols;
  let inv_n = 1.0 / f32(p.cols);
  var s = 0.0;
  for (var c = lane; c < n; c = c + TPR) { s = s + f32(x[bx + c]); }
  let mean = row_sum(tid, lane, s) * inv_n;
  var v = 0.0;
  for (var c = lane; c < n; c = c + TPR) {
    let d = f32(x[bx + c]) - mean;
    v = v + d * d;
  }
  let rstd = inverseSqrt(row_sum(tid, lane, v) * inv_n + p.eps);
  for (var c = lane; c < n; c = c + TPR) {
    var o = (f32(x[bx + c]) - mean) * rstd;
    if ((p.flags & 1u) != 0u) { o = o * f32(w[p.off_w + c]); }
    if ((p.flags & 2u) != 0u) { o = o + f32(b[p.off_b + c]); }
    y[row * p.cols + c] = {{T}}(o);
  }
  if (live && lane == 0u) {
    stats[row] = mean;
    stats[p.rows + row] = rstd;
  }
}
