// The bitonic steps of wgpar/ops/sort.py that stay within a block of 2 * WG consecutive positions of
// the [rows, P] index array, run in workgroup memory: one workgroup per block, which holds several
// short rows or a part of a long one (P and the block size are powers of two, so a pair never leaves
// its row). For k = p.klo, 2 * p.klo, .. p.khi: the steps j = min(k, block) / 2, .., 1. The first
// call sorts every block (klo 2); after the global steps of a merge with j >= the block size, one
// call finishes the merge (klo = khi = k). The order is sort.wgsl's: (value, NaN last or first,
// original position), padding last. Bindings (idx, x) and Params are declared in wgpar/ops/sort.py;
// fills as sort.wgsl's.

{{FNS}}

var<workgroup> sv: array<{{T}}, 2 * WG>;
var<workgroup> si: array<u32, 2 * WG>;

// Whether position a (value va) sorts before position b (value vb).
fn before(a: u32, va: {{T}}, b: u32, vb: {{T}}) -> bool {
  if (a >= p.n || b >= p.n) { return b >= p.n && (a < p.n || a < b); }
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
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let size = 2u * WG;
  let base = (wid.x + wid.y * nwg.x) * size;
  let total = p.rows * p.P;
  for (var s = 0u; s < 2u; s = s + 1u) {
    let t = lid + s * WG;
    let g = base + t;
    if (g < total) {
      let i = g % p.P;
      var a = i;
      if (p.first == 0u) { a = u32(idx[g]); }
      si[t] = a;
      if (a < p.n) { sv[t] = {{T}}(x[p.off + (g / p.P) * p.n + a]); }
    }
  }
  workgroupBarrier();
  let width = min(p.P, size);
  for (var k = p.klo; k <= p.khi; k = k * 2u) {
    for (var j = min(k, width) / 2u; j > 0u; j = j / 2u) {
      let q = lid;  // one pair per thread: size / 2 == WG pairs
      let i = (q / j) * 2u * j + q % j;
      let l = i + j;
      if (base + l < total) {
        let up = (((base + i) % p.P) & k) == 0u;
        let a = si[i];
        let b = si[l];
        let va = sv[i];
        let vb = sv[l];
        if (select(before(a, va, b, vb), before(b, vb, a, va), up)) {
          si[i] = b;
          si[l] = a;
          sv[i] = vb;
          sv[l] = va;
        }
      }
      workgroupBarrier();
    }
  }
  for (var s = 0u; s < 2u; s = s + 1u) {
    let t = lid + s * WG;
    if (base + t < total) { idx[base + t] = i32(si[t]); }
  }
}
