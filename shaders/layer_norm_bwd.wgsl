// Fused LayerNorm backward (layer_norm_fwd.wgsl saved each row's mean and rstd):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w,  xhat = (x - mean) * rstd,
// and, with FLAGS bit 4, each workgroup's column sums of dy * xhat (the weight's gradient) and dy (the
// bias's) over the rows it took, float32 parts [2, p.groups, cols] that one column reduction finishes
// (as Apex's and PyTorch's fused layer norms do): no dy * xhat tensor. Threads per row and the row
// reductions as in the forward; workgroup wg takes the row blocks (256 / TPR rows) wg, wg + p.groups, ...
// With K > 0 a thread's K columns sum in registers over the blocks and the rows' slots then fold in
// workgroup memory, in a fixed order; K = 0 (rows too wide for registers: TPR is then 256, one row a
// block) a thread adds into its workgroup's part row in memory, at columns no other thread touches.
// Bindings and Params are declared with the kernel in Python (wgpar/ops/layer_norm.py).

const TPR: u32 = {{TPR}}u;
const K: u32 = {{K}}u;
const RPB: u32 = 256u / TPR;
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
  let slot = tid / TPR;
  let wg = wid.x + wid.y * nwg.x;
  let has_w = (p.flags & 1u) != 0u;
  let sums_wb = (p.flags & 4u) != 0u && wg < p.groups;
  var pw: array<f32, {{KR}}>;
  var pb: array<f32, {{KR}}>;
  for (var blk = wg; blk < p.blocks && wg < p.groups; blk = blk + p.groups) {
    let row = blk * RPB + slot;
    let live = row < p.rows;
    let n = select(0u, p.cols, live);
    let bx = p.off_x + row * p.cols;
    let bg = p.off_dy + row * p.cols;
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
    for (var k = 0u; k < {{KN}}; k = k + 1u) {
      let c = lane + k * TPR;
      if (c < n) {
        let d = f32(dy[bg + c]);
        var g = d;
        if (has_w) { g = g * f32(w[p.off_w + c]); }
        let xh = (f32(x[bx + c]) - mean) * rstd;
        dx[row * p.cols + c] = {{T}}(rstd * (g - sums.x - xh * sums.y));
        if (sums_wb && K > 0u) {
          pw[k] = pw[k] + d * xh;
          pb[k] = pb[k] + d;
        } else if (sums_wb) {
          let i = wg * p.cols + c;
          let j = (p.groups + wg) * p.cols + c;
          var a = d * xh;
          var b = d;
          if (blk != wg) {
            a = a + parts[i];
            b = b + parts[j];
          }
          parts[i] = a;
          parts[j] = b;
        }
      }
    }
  }
  if (sums_wb && K > 0u) {
    for (var k = 0u; k < K; k = k + 1u) {
      red[tid] = pw[k];
      red2[tid] = pb[k];
      workgroupBarrier();
      for (var s = RPB / 2u; s > 0u; s = s >> 1u) {
        if (slot < s) {
          red[tid] = red[tid] + red[tid + s * TPR];
          red2[tid] = red2[tid] + red2[tid + s * TPR];
        }
        workgroupBarrier();
      }
      let c = lane + k * TPR;
      if (slot == 0u && c < p.cols) {
        parts[wg * p.cols + c] = red[tid];
        parts[(p.groups + wg) * p.cols + c] = red2[tid];
      }
      workgroupBarrier();
    }
  }
}
