// Elementwise map into a contiguous output whose operands are each a contiguous block of
// memory indexed from the output position i: the whole tensor (i), a repeated trailing block
// (i % md, e.g. a bias [C] over [N, C]), a block repeated per run of dv elements
// ((i / dv) % md, e.g. a row statistic [N, 1] over [N, C]), or a single element. No per-element
// stride loop, and with WIDTH 4 each thread moves 4 elements through vec4 loads and stores.
// The host fills:
//   BINDINGS  storage buffer declarations (bo = output, read_write), vec4 arrays when WIDTH is 4
//   BODY      the loads, the op and the store for output unit i (one element or one vec4)

{{BINDINGS}}

struct Params {
  n: u32, off_o: u32, _p0: u32, _p1: u32,  // n counts units (elements, or vec4s), off_o elements
  off: vec4<u32>,  // per operand: offset of its block, in elements
  dv: vec4<u32>,   // per operand: output units per step of the block index
  md: vec4<u32>,   // per operand: block length (in units where read by unit, else in elements)
  sc: vec4<u32>,   // scalar operands: bit patterns in their compute type
}
@group(0) @binding({{PARAMS}}) var<uniform> p: Params;

{{FNS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= p.n) { return; }
{{BODY}}
}
