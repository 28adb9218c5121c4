// Inclusive scan (running sum or product) within blocks of BLOCK = WG * ITEMS entries of the rows
// of a contiguous [rows, n] x: one workgroup per (row, block). Each thread scans ITEMS entries on its
// own, the workgroup scans the threads' totals (Hillis-Steele, log2(WG) steps), and the block's
// total goes to sums[row, block] for the next level (wgpar/ops/scan.py). No loop grows with n, so
// lavapipe's loop limit never applies. C is the compute type (f32, or u32 for int32: it wraps);
// COMBINE, ID, LOAD and STORE come from the host. Bindings (out, x, sums) and Params are declared
// in wgpar/ops/scan.py.

const ITEMS = 4u;
var<workgroup> part: array<{{C}}, WG>;

fn combine(a: {{C}}, b: {{C}}) -> {{C}} { return {{COMBINE}}; }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let g = wid.x + wid.y * nwg.x;
  let live = g < p.rows * p.nb;  // the grid's overshoot still meets every barrier
  let row = g / p.nb;
  let base = (g % p.nb) * WG * ITEMS + t * ITEMS;
  var v: array<{{C}}, ITEMS>;
  var acc = {{ID}};
  for (var k = 0u; k < ITEMS; k = k + 1u) {
    let j = base + k;
    if (live && j < p.n) { acc = combine(acc, {{LOAD}}(x[p.off_x + row * p.n + j])); }
    v[k] = acc;
  }
  part[t] = acc;
  workgroupBarrier();
  for (var s = 1u; s < WG; s = s * 2u) {
    var other = {{ID}};
    if (t >= s) { other = part[t - s]; }
    workgroupBarrier();
    if (t >= s) { part[t] = combine(other, part[t]); }
    workgroupBarrier();
  }
  var before = {{ID}};
  if (t > 0u) { before = part[t - 1u]; }
  for (var k = 0u; k < ITEMS; k = k + 1u) {
    let j = base + k;
    if (live && j < p.n) { out[row * p.n + j] = {{STORE}}(combine(before, v[k])); }
  }
  if (live && t == WG - 1u) { sums[g] = {{STORE}}(part[t]); }
}
