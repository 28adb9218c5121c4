// GradScaler's unscale with its inf / NaN check (torch's _amp_foreach_non_finite_check_and_unscale_),
// in place over one contiguous gradient: g = g * inv_scale, and found[0] becomes 1 if any entry of the
// gradient as it came in is NaN or infinite (tested on its bits: see float_fns.wgsl). The flag stays
// on the device. INV is p.inv_scale (the host's scale) or inv_scale() of the device's scale sc[0]
// (GradScaler on the device: the reciprocal with one Newton step, as a correctly rounded one).
// Bindings (g: array of G, found: atomic flags) and Params are declared with the kernel in Python
// (wgpar/amp/grad_scaler.py).

{{FNS}}
{{INV_FN}}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.numel) { return; }
  let v = f32(g[p.off + i]);
  if (isnan_(v) || isinf_(v)) { atomicOr(&found[0], 1u); }
  g[p.off + i] = {{G}}(v * {{INV}});
}
