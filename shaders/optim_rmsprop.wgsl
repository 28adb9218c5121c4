// One RMSprop step for one parameter, PyTorch's torch.optim.RMSprop (single-tensor path)
// fused into one pass over the parameter and its state. Bindings (param, grad, square_avg,
// and grad_avg when centered, buf with momentum) and Params are declared in
// wgpar/optim/rmsprop.py: fresh has one bit per state tensor just allocated (1 square_avg,
// 2 grad_avg, 4 buf), read as zeros, so a group that turns on momentum or centering later
// starts that state as torch would. The host fills P (param and state storage type),
// CENTER (the centred variance) and UPDATE (with or without the momentum buffer).

// torch.lerp's two-sided form, so grad_avg rounds as PyTorch's does.
fn lerp_(a: f32, b: f32, t: f32) -> f32 {
  return select(b - (b - a) * (1.0 - t), a + t * (b - a), t < 0.5);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.numel) { return; }
  let w = f32(param[p.off_p + i]);
  var g = f32(grad[p.off_g + i]);
  if (p.maximize != 0u) { g = -g; }
  if (p.weight_decay != 0.0) { g = g + p.weight_decay * w; }  // grad.add(param, alpha=weight_decay)
  // square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
  let sq = select(f32(square_avg[i]), 0.0, (p.fresh & 1u) != 0u) * p.alpha + p.one_minus_alpha * g * g;
  square_avg[i] = {{P}}(sq);
  var ms = f32({{P}}(sq));  // what PyTorch reads back from a float16 state
{{CENTER}}
  let avg = sqrt(ms) + p.eps;
{{UPDATE}}
}
