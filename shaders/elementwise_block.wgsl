// Elementwise map into a contiguous output whose operands are each a contiguous block of
// memory indexed from the output position i: the whole tensor (i), a repeated trailing block
// (i % md, e.g. a bias [C] over [N, C]), a block repeated per run of dv elements
// ((i / dv) % md, e.g. a row statistic [N, 1] over [N, C]), or a single element. No per-element
// stride loop, and with width 4 each thread moves 4 elements through vec4 loads and stores.
// The bindings (bo = output, read_write; vec4 arrays at width 4) and Params (n counts units:
// elements or vec4s; per operand: off, the offset of its block in elements; dv, output units per
// step of the block index; md, the block length; sc, a scalar's bits) are declared in
// wgpar/ops/elementwise.py. The host fills:
//   BODY      the loads, the op and the store for output unit i (one element or one vec4)

{{FNS}}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.n) { return; }
{{BODY}}
}
