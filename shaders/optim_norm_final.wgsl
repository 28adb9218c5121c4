// Second pass of clip_grad_norm_: one workgroup folds the n partials into
// out = [total norm, clip coefficient, folded partials], so the gradients are
// scaled on the device without a readback. coef = min(max_norm / (norm + 1e-6), 1)
// as in PyTorch. The host fills JOIN (as in optim_norm.wgsl) and ROOT (raw -> norm).
// Bindings (out, partial) and Params are declared with the kernel in Python (wgpar/ops/norm.py).

var<workgroup> red: array<f32, WG>;

{{FNS}}

fn join(x: f32, y: f32) -> f32 { return {{JOIN}}; }

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
  var acc = 0.0;
  for (var i = lid; i < p.n; i = i + WG) { acc = join(acc, partial[i]); }
  red[lid] = acc;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
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
