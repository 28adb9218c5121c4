// Last pass of clip_grad_norm_: multiply gradients in place by the clip coefficient that
// optim_norm_final.wgsl left on the device at coef[off_c]. A dispatch takes several gradients, one
// binding each (g0, g1, ...: wgpar/runtime/slots.py); SLOTS (generated there) scales the
// workgroup's elements of its gradient. Bindings and Params are declared with the kernel in Python
// (wgpar/ops/norm.py).

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let w = wid.x + wid.y * nwg.x;
  let c = coef[p.off_c];
  {{SLOTS}}
}
