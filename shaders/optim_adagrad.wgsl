// One Adagrad step for one parameter, PyTorch's torch.optim.Adagrad (single-tensor path)
// fused into one pass over the parameter and its sum of squared gradients. Bindings
// (param, grad, state_sum) and Params are declared in wgpar/optim/adagrad.py: fresh (the
// sum was just allocated: it starts at init_acc, initial_accumulator_value), neg_clr
// (-lr / (1 + (step - 1) * lr_decay), computed on the host). The host fills P (the
// parameter's and the state's storage type) and STEP (optim_step.wgsl: the entry point, which
// calls update with the element's gradient g).

{{STEP}}

fn update(i: u32, w: f32, g: f32) {
  let s = select(f32(state_sum[i]), p.init_acc, p.fresh != 0u) + g * g;  // state_sum.addcmul_(grad, grad)
  state_sum[i] = {{P}}(s);
  let denom = sqrt(f32({{P}}(s))) + p.eps;
  param[p.off_p + i] = {{P}}(w + p.neg_clr * (g / denom));  // std = state_sum.sqrt().add_(eps); param.addcdiv_(grad, std, value=-clr)
}
