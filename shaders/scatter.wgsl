// scatter / scatter_add along one dim without float atomics (WGSL has none): one thread per output
// entry (o, r, k) of out viewed as [outer, n, inner]. The host has sorted each line (o, :, k) of the
// index stably (sidx: the sorted values, perm: their positions j, both [outer, count, inner]), so the
// thread binary-searches its line for the run of entries equal to r and reads src at those positions:
// "add" sums the run onto out (in index order, so results repeat bit for bit), "set" writes the last
// one (the largest j wins where indices repeat). The host splits the sorted positions into chunks
// [lo, hi) of at most MAX_LOOP (lavapipe's loop limit), one dispatch each, in order.
// Bindings (out, src, sidx, perm) and Params are declared in wgpar/ops/scatter.py; C (the compute
// type), ZERO, LOAD, STORE and MODE come from the host.

fn at(o: u32, j: u32, k: u32) -> u32 { return (o * p.count + j) * p.inner + k; }

// The first sorted position in [lo, hi) whose value is >= r (> r with strict).
fn bound(o: u32, k: u32, r: i32, strict: bool) -> u32 {
  var a = p.lo;
  var b = p.hi;
  while (a < b) {
    let m = (a + b) / 2u;
    let v = sidx[at(o, m, k)];
    if (v < r || (strict && v == r)) { a = m + 1u; } else { b = m; }
  }
  return a;
}

fn value(o: u32, j: u32, k: u32) -> {{C}} { return {{LOAD}}(src[p.off_src + at(o, u32(perm[at(o, j, k)]), k)]); }

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.outer * p.n * p.inner) { return; }
  let k = i % p.inner;
  let r = (i / p.inner) % p.n;
  let o = i / (p.inner * p.n);
  let s = bound(o, k, i32(r), false);
  let e = bound(o, k, i32(r), true);
  if (s == e) { return; }
  {{MODE}}
}
