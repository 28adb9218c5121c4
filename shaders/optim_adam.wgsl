// One Adam / AdamW step for one parameter, PyTorch's torch.optim.Adam (single-tensor
// path, decoupled_weight_decay for AdamW) fused into one pass over the parameter and
// its moments. Bias corrections are folded into neg_step_size and bc2_sqrt on the
// host. Bindings (param, grad, exp_avg, exp_avg_sq and for AMSGrad max_exp_avg_sq) and Params
// are declared in wgpar/optim/adam.py: fresh (state just allocated, read it as zeros),
// weight_decay (Adam's L2 term, 0 for AdamW), decay (AdamW's 1 - lr * weight_decay, 1 for Adam).
// The host fills P (param and state storage type), DENOM_SQ (AMSGrad's running maximum) and
// STEP (optim_step.wgsl: the entry point, which calls update with the element's gradient g; lerp_).

{{STEP}}

fn update(i: u32, w0: f32, g: f32) {
  let fresh = p.fresh != 0u;
  let w = w0 * p.decay;  // param.mul_(1 - lr * weight_decay)
  let m = lerp_(select(f32(exp_avg[i]), 0.0, fresh), g, p.one_minus_beta1);
  let v = select(f32(exp_avg_sq[i]), 0.0, fresh) * p.beta2 + p.one_minus_beta2 * g * g;
  exp_avg[i] = {{P}}(m);
  exp_avg_sq[i] = {{P}}(v);
  let mq = f32({{P}}(m));  // what PyTorch reads back from a float16 state
  let vq = f32({{P}}(v));
{{DENOM_SQ}}
  let denom = sqrt(vd) / p.bc2_sqrt + p.eps;
  param[p.off_p + i] = {{P}}(w + p.neg_step_size * mq / denom);  // param.addcdiv_(exp_avg, denom, value=-step_size)
}
