// One SGD step for one parameter, PyTorch's torch.optim.SGD (single-tensor path)
// fused into one pass that updates the parameter and its momentum buffer in place.
// Bindings (param: array of P, grad, and with momentum buf) and Params (first: the momentum
// buffer starts as the gradient) are declared in wgpar/optim/sgd.py. The host fills P (the
// parameter's storage type) and the MOMENTUM block (empty without momentum).

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.numel) { return; }
  let w = f32(param[p.off_p + i]);
  var g = f32(grad[p.off_g + i]);
  if (p.maximize != 0u) { g = -g; }
  if (p.weight_decay != 0.0) { g = g + p.weight_decay * w; }  // grad.add(param, alpha=weight_decay)
{{MOMENTUM}}
  param[p.off_p + i] = {{P}}(w + p.neg_lr * g);  // param.add_(grad, alpha=-lr)
}
