// Last pass of clip_grad_norm_: multiply one gradient in place by the clip
// coefficient that optim_norm_final.wgsl left on the device at coef[off_c]. Bindings (grad:
// array of G, coef) and Params are declared with the kernel in Python (wgpar/ops/norm.py).

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.numel) { return; }
  grad[p.off_g + i] = {{G}}(f32(grad[p.off_g + i]) * coef[p.off_c]);
}
