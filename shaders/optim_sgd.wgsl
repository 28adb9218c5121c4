// One SGD step for one parameter, PyTorch's torch.optim.SGD (single-tensor path)
// fused into one pass that updates the parameter and its momentum buffer in place.
// The host fills the storage types P (param) and G (grad), the momentum buffer's
// binding (BUF_BINDING, empty without momentum) and the MOMENTUM block.
{{F16}}
@group(0) @binding(0) var<storage, read_write> param: array<{{P}}>;
@group(0) @binding(1) var<storage, read> grad: array<{{G}}>;
{{BUF_BINDING}}
struct Params {
  numel: u32, off_p: u32, off_g: u32, first: u32,  // first: the momentum buffer starts as the gradient
  neg_lr: f32, momentum: f32, one_minus_dampening: f32, weight_decay: f32,
  maximize: u32, _p0: u32, _p1: u32, _p2: u32,
}
@group(0) @binding({{PARAMS}}) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= p.numel) { return; }
  let w = f32(param[p.off_p + i]);
  var g = f32(grad[p.off_g + i]);
  if (p.maximize != 0u) { g = -g; }
  if (p.weight_decay != 0.0) { g = g + p.weight_decay * w; }  // grad.add(param, alpha=weight_decay)
{{MOMENTUM}}
  param[p.off_p + i] = {{P}}(w + p.neg_lr * g);  // param.add_(grad, alpha=-lr)
}
