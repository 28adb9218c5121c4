// Inverted dropout on a contiguous tensor: keep each element with probability
// 1 - p and scale it by 1 / (1 - p). The mask is a hash of (element index,
// seed), so the backward pass regenerates it instead of storing it. Bindings (y, x: arrays
// of T) and Params are declared in wgpar/ops/dropout.py.

// PCG-style integer hash (Jarzynski & Olano, "Hash Functions for GPU Rendering").
fn pcg(v: u32) -> u32 {
  let state = v * 747796405u + 2891336453u;
  let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.numel) { return; }
  let keep = pcg(i ^ pcg(p.seed)) >= p.threshold;
  // a multiply, not a select: a dropped NaN (or inf) still gives NaN, as in PyTorch (x * mask * scale)
  y[i] = {{T}}(f32(x[p.off_x + i]) * select(0.0, p.scale, keep));
}
