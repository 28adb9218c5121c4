// Moves along one dim by a per-element index, for x and idx viewed as [outer, n, inner] and
// [outer, count, inner] (contiguous): gather out[o, j, k] = x[o, idx[o, j, k], k] (sort's and
// topk's values), or scatter out[o, idx[o, j, k], k] = x[o, j, k] (their backward: the indices
// of a row are distinct, so no two threads write one element). The host has checked the indices;
// the clamp only keeps accesses in bounds. Bindings (out, x, idx) and Params are declared in
// wgpar/ops/sort.py; the host fills MOVE.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.outer * p.count * p.inner) { return; }
  let k = i % p.inner;
  let o = i / (p.inner * p.count);
  let r = u32(clamp(idx[p.off_i + i], 0, i32(p.n) - 1));
  let at = (o * p.n + r) * p.inner + k;
  {{MOVE}}
}
