// out[o, j, k] = x[o, idx[j], k] for a contiguous x viewed as [outer, n, inner]:
// index_select and embedding lookup. Negative indices count from the end;
// the host has already checked the range, the clamp only keeps reads in bounds.
// Bindings (out, x, idx) and Params are declared in wgpar/ops/index.py.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  let total = p.outer * p.count * p.inner;
  if (i >= total) { return; }
  let k = i % p.inner;
  let j = (i / p.inner) % p.count;
  let o = i / (p.inner * p.count);
  var r = idx[p.off_i + j];
  if (r < 0) { r = r + i32(p.n); }
  let row = u32(clamp(r, 0, i32(p.n) - 1));
  out[i] = x[p.off_x + (o * p.n + row) * p.inner + k];
}
