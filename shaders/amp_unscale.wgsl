// GradScaler's unscale with its inf / NaN check (torch's _amp_foreach_non_finite_check_and_unscale_),
// in place over up to six contiguous gradients a dispatch (one binding each, g0, g1, ...:
// wgpar/runtime/slots.py): g = g * inv_scale, and found[0] becomes 1 if any entry of a gradient as it
// came in is NaN or infinite (tested on its bits: see float_fns.wgsl). The flag stays on the device.
// INV is p.inv_scale (the host's scale) or inv_scale() of the device's scale sc[0] (GradScaler on the
// device: the reciprocal with one Newton step, as a correctly rounded one). Gradient s has p.n<s>
// elements from element p.o<s> and takes the workgroups up to p.w<s> (a running count): SLOTS picks a
// workgroup's gradient and unscales its elements. Bindings, Params and SLOTS are made with the kernel
// in Python (wgpar/amp/grad_scaler.py).

{{FNS}}
{{INV_FN}}

fn unscaled(v: f32) -> f32 {
  if (isnan_(v) || isinf_(v)) { atomicOr(&found[0], 1u); }
  return v * {{INV}};
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let w = wid.x + wid.y * nwg.x;
{{SLOTS}}
}
