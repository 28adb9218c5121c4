// Elementwise map over up to three operands (tensors or scalars) of any layout, with
// NumPy broadcasting expressed as strides (0 along broadcast dims); contiguous outputs
// whose operands are blocks of memory take elementwise_block.wgsl instead. The host fills:
//   BINDINGS  storage buffer declarations (bo = output, read_write)
//   INDEX     how element i maps to each operand's offset (strides)
//   LOADS     let x0..x2 = operand values converted to their compute type
//   STORE/EXPR the op, converted to the output's storage type

{{BINDINGS}}

struct Params {
  numel: u32, ndim: u32, off_o: u32, off0: u32,
  off1: u32, off2: u32, _pad0: u32, _pad1: u32,
  sc: vec4<u32>,  // scalar operands: bit patterns in their compute type
  shape: array<vec4<u32>, 2>,
  str_o: array<vec4<i32>, 2>,
  str0: array<vec4<i32>, 2>,
  str1: array<vec4<i32>, 2>,
  str2: array<vec4<i32>, 2>,
}
@group(0) @binding({{PARAMS}}) var<uniform> p: Params;

{{FNS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= p.numel) { return; }
{{INDEX}}
{{LOADS}}
  bo[io] = {{STORE}}({{EXPR}});
}
