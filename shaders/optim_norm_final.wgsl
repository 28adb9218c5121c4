// Second pass of clip_grad_norm_: one workgroup folds the n partials into
// out = [total norm, clip coefficient, folded partials], so the gradients are
// scaled on the device without a readback. coef = min(max_norm / (norm + 1e-6), 1)
// as in PyTorch. The host fills JOIN (as in optim_norm.wgsl) and ROOT (raw -> norm).
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> partial: array<f32>;
struct Params { n: u32, _p0: u32, max_norm: f32, inv_ord: f32 }
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> red: array<f32, 256>;

{{FNS}}

fn join(x: f32, y: f32) -> f32 { return {{JOIN}}; }

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
  var acc = 0.0;
  for (var i = lid; i < p.n; i = i + 256u) { acc = join(acc, partial[i]); }
  red[lid] = acc;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (lid < s) { red[lid] = join(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  if (lid == 0u) {
    let raw = red[0];
    let norm = {{ROOT}};
    out[0] = norm;
    out[1] = min_nan(div_(p.max_norm, norm + 1e-6), 1.0);  // a NaN norm makes the gradients NaN, as in PyTorch
    out[2] = raw;
  }
}
