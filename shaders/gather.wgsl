// out[o, j, k] = x[o, idx[j], k] for a contiguous x viewed as [outer, n, inner]:
// index_select and embedding lookup. Negative indices count from the end;
// the host has already checked the range, the clamp only keeps reads in bounds.
{{F16}}
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<storage, read> idx: array<i32>;
struct Params { outer: u32, n: u32, inner: u32, count: u32, off_x: u32, off_i: u32, _p0: u32, _p1: u32 }
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
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
