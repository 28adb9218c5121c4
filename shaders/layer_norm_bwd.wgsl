// Fused LayerNorm backward (layer_norm_fwd.wgsl saved each row's mean and rstd):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w,  xhat = (x - mean) * rstd,
// and, with FLAGS bit 4, dy * xhat (float32), whose column sums the host takes for the weight's
// gradient (the bias's is the column sum of dy). Threads per row and reductions as in the forward.
// Bindings and Params are declared with the kernel in Python (wgpar/ops/layer_norm.py).

const TPR: u32 = {{TPR}}u;
var<workgroup> red: array<f32, 256>;
var<workgroup> red2: array<f32, 256>;

fn row_sums(tid: u32, lane: u32, a: f32, b: f32) -> vec2<f32> {
  red[tid] = a;
  red2[tid] = b;
  workgroupBarrier();
  for (var s = TPR / 2u; s > 0u; s = s >> 1u) {
    if (lane < s) {
      red[tid] = red[tid] + red[tid + s];
      red2[tid] = red2[tid] + red2[tid + s];
    }
    workgroupBarrier();
  }
  let r = vec2<f32>(red[tid - lane], red2[tid - lane]);
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
  let bg = p.off_dy + row * p.cols;
  let has_w = (p.flags & 1u) != 0u;
  var mean = 0.0;
  var rstd = 0.0;
  if (live) {
    mean = stats[row];
    rstd = stats[p.rows + row];
  }
  var sg = 0.0;
  var sgx = 0.0;
  for (var c = lane; c < n; c = c + TPR) {
    var g = f32(dy[bg + c]);
    if (has_w) { g = g * f32(w[p.off_w + c]); }
    sg = sg + g;
    sgx = sgx + g * (f32(x[bx + c]) - mean) * rstd;
  }
  let sums = row_sums(tid, lane, sg, sgx) / f32(p.cols);
  for (var c = lane; c < n; c = c + TPR) {
    let d = f32(dy[bg + c]);
    var g = d;
    if (has_w) { g = g * f32(w[p.off_w + c]); }
    let xh = (f32(x[bx + c]) - mean) * rstd;
    dx[row * p.cols + c] = {{T}}(rstd * (g - sums.x - xh * sums.y));
    if ((p.flags & 4u) != 0u) { gxh[row * p.cols + c] = d * xh; }
  }
}
