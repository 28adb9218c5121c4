// One SGD step for one parameter, PyTorch's torch.optim.SGD (single-tensor path)
// fused into one pass that updates the parameter and its momentum buffer in place.
// Bindings (param: array of P, grad, and with momentum buf) and Params (first: the momentum
// buffer starts as the gradient) are declared in wgpar/optim/sgd.py. The host fills P (the
// parameter's storage type), the MOMENTUM block (empty without momentum) and STEP
// (optim_step.wgsl: the entry point, which calls update with the element's gradient g).

{{STEP}}

fn update(i: u32, w: f32, g0: f32) {
  var g = g0;
{{MOMENTUM}}
  param[p.off_p + i] = {{P}}(w + p.neg_lr * g);  // param.add_(grad, alpha=-lr)
}
