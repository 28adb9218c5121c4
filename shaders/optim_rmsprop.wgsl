// One RMSprop step for one parameter, PyTorch's torch.optim.RMSprop (single-tensor path)
// fused into one pass over the parameter and its state. Bindings (param, grad, square_avg,
// and grad_avg when centered, buf with momentum) and Params are declared in
// wgpar/optim/rmsprop.py: fresh has one bit per state tensor just allocated (1 square_avg,
// 2 grad_avg, 4 buf), read as zeros, so a group that turns on momentum or centering later
// starts that state as torch would. The host fills P (param and state storage type),
// CENTER (the centred variance), UPDATE (with or without the momentum buffer) and STEP
// (optim_step.wgsl: the entry point, which calls update with the element's gradient g; lerp_).

{{STEP}}

fn update(i: u32, w: f32, g: f32) {
  // square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
  let sq = select(f32(square_avg[i]), 0.0, (p.fresh & 1u) != 0u) * p.alpha + p.one_minus_alpha * g * g;
  square_avg[i] = {{P}}(sq);
  var ms = f32({{P}}(sq));  // what PyTorch reads back from a float16 state
{{CENTER}}
  let avg = sqrt(ms) + p.eps;
{{UPDATE}}
}
