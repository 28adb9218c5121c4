// One step (k, j) of a bitonic sort of each row of a contiguous [rows, n] x, by permuting an index
// array idx [rows, P] (P: n rounded up to a power of two; positions n.. are padding that sorts last).
// The order is total, so the network's result is the stable sort: values first (NaN after every
// number ascending, before every number descending, as PyTorch), then the original position.
// With p.first the step reads idx as the identity (it is not yet written). One thread per pair.
// Bindings (idx, x) and Params are declared in wgpar/ops/sort.py; the host fills T (the compute
// type), NAN (a NaN test of a loaded value), NAN_FIRST (whether a before b when exactly one is NaN)
// and LT ("<" ascending, ">" descending).

{{FNS}}

fn load(r: u32, i: u32) -> u32 {
  if (p.first != 0u) { return i; }
  return u32(idx[r * p.P + i]);
}

// Whether position a (in the row's original order) sorts before position b.
fn before(row: u32, a: u32, b: u32) -> bool {
  if (a >= p.n || b >= p.n) { return b >= p.n && (a < p.n || a < b); }
  let va = {{T}}(x[p.off + row * p.n + a]);
  let vb = {{T}}(x[p.off + row * p.n + b]);
  let an = {{NAN}}(va);
  let bn = {{NAN}}(vb);
  if (an || bn) {
    if (an && bn) { return a < b; }
    return {{NAN_FIRST}};
  }
  if (va {{LT}} vb) { return true; }
  if (vb {{LT}} va) { return false; }
  return a < b;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let t = gid.x + gid.y * nwg.x * WG;
  let pairs = p.P >> 1u;
  if (t >= p.rows * pairs) { return; }
  let row = t / pairs;
  let q = t % pairs;
  let i = (q / p.j) * 2u * p.j + q % p.j;
  let l = i + p.j;
  let a = load(row, i);
  let b = load(row, l);
  let up = (i & p.k) == 0u;
  let swap = select(before(row, a, b), before(row, b, a), up);
  if (swap || p.first != 0u) {
    idx[row * p.P + i] = i32(select(a, b, swap));
    idx[row * p.P + l] = i32(select(b, a, swap));
  }
}
