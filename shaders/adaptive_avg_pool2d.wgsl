// Adaptive average pooling of contiguous [N * C planes, H, W] to [oh, ow], torch's windows: output
// row i averages input rows floor(i H / oh) .. ceil((i + 1) H / oh) - 1 (columns likewise).
// BACKWARD=false: one thread per output element averages its window of x. BACKWARD=true: x is the
// output's gradient and each thread takes VEC (1 or 4) consecutive input elements of a row, summing
// g / window size over the windows holding them: output rows floor(h oh / H) .. ceil((h + 1) oh / H) - 1
// (columns alike; no atomics, a fixed order).
// Bindings (out, x: arrays of T) and Params are declared in wgpar/ops/pool.py.

const BACKWARD: bool = {{BACKWARD}};
const VEC: u32 = {{VEC}};

fn lo(i: u32, n: u32, m: u32) -> u32 { return (i * n) / m; }
fn hi(i: u32, n: u32, m: u32) -> u32 { return ((i + 1u) * n + m - 1u) / m; }

{{STORE}}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  if (!BACKWARD) {
    var acc = 0.0;
    let ow = i % p.ow;
    let oh = (i / p.ow) % p.oh;
    let base = p.off_x + (i / (p.ow * p.oh)) * p.h * p.w;
    let h0 = lo(oh, p.h, p.oh);
    let h1 = hi(oh, p.h, p.oh);
    let w0 = lo(ow, p.w, p.ow);
    let w1 = hi(ow, p.w, p.ow);
    for (var h = h0; h < h1; h = h + 1u) {
      for (var w = w0; w < w1; w = w + 1u) {
        acc = acc + f32(x[base + h * p.w + w]);
      }
    }
    out[i] = {{T}}(acc / f32((h1 - h0) * (w1 - w0)));
    return;
  }
  let per_row = (p.w + VEC - 1u) / VEC;
  let row = i / per_row;  // plane * H + h: one division each
  let w0 = (i - row * per_row) * VEC;
  let plane = row / p.h;
  let h = row - plane * p.h;
  let out0 = p.off_x + plane * p.oh * p.ow;
  let oh1 = min(hi(h, p.oh, p.h), p.oh);
  let ow0 = lo(w0, p.ow, p.w);
  let ow1 = min(hi(min(w0 + VEC, p.w) - 1u, p.ow, p.w), p.ow);
  let lanes = vec4<i32>(0, 1, 2, 3);
  var sums = vec4<f32>(0.0);
  for (var oh = lo(h, p.oh, p.h); oh < oh1; oh = oh + 1u) {
    let rows = f32(hi(oh, p.h, p.oh) - lo(oh, p.h, p.oh));
    for (var ow = ow0; ow < ow1; ow = ow + 1u) {
      let c0 = lo(ow, p.w, p.ow);
      let c1 = hi(ow, p.w, p.ow);
      let v = f32(x[out0 + oh * p.ow + ow]) / (rows * f32(c1 - c0));
      let inside = lanes >= vec4<i32>(i32(c0) - i32(w0)) & lanes < vec4<i32>(i32(c1) - i32(w0));
      sums = sums + select(vec4<f32>(0.0), vec4<f32>(v), inside);
    }
  }
  let at = row * p.w + w0;
  store_row(at, w0, sums);
}
