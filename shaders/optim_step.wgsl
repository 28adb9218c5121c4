// What every fused optimizer step shares (optim_sgd, optim_adam, optim_rmsprop, optim_adagrad),
// pasted into each as its {{STEP}} fill by wgpar/optim/optimizer.py (step_kernel): the entry
// point, one invocation per element of the parameter, which forms the gradient as PyTorch's
// single-tensor path does and hands the element to the file's own update(i, w, g). It reads what
// every step kernel declares: the param, grad and skip bindings and p.numel, p.off_p, p.off_g,
// p.maximize, p.weight_decay. skip[0] != 0 (a guarded step whose gradients had inf / NaN, set on the
// device by GradScaler's unscale) makes the step write nothing.

// torch.lerp's two-sided form, so a running average (Adam's exp_avg, RMSprop's grad_avg) rounds
// as PyTorch's does.
fn lerp_(a: f32, b: f32, t: f32) -> f32 {
  return select(b - (b - a) * (1.0 - t), a + t * (b - a), t < 0.5);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.numel || skip[0] != 0u) { return; }  // GradScaler saw inf / NaN: no write at all
  let w = f32(param[p.off_p + i]);
  var g = f32(grad[p.off_g + i]);
  if (p.maximize != 0u) { g = -g; }
  if (p.weight_decay != 0.0) { g = g + p.weight_decay * w; }  // grad.add(param, alpha=weight_decay)
  update(i, w, g);
}
