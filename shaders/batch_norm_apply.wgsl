// Per-channel affine maps of contiguous [N, C, inner] tensors, one thread per element: batch
// norm's output (x - mean) * scale + bias and its input gradient g * k1 + (x - mean) * k2 + k3.
// {{EXPR}} reads x (X), g (G) and the channel's coefficients (f32 reads of m, k1, k2, k3 at ch);
// the buffers it does not read are left out. Bindings and Params are declared in
// wgpar/ops/batch_norm.py.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let ch = (i / p.inner) % p.c;
  out[i] = {{T}}({{EXPR}});
}
