// Elementwise map over up to three operands (tensors or scalars) of any layout, with
// NumPy broadcasting expressed as strides (0 along broadcast dims); contiguous outputs
// whose operands are blocks of memory take elementwise_block.wgsl instead. The bindings
// (bo = output, read_write; b1.. inputs) and Params are declared in wgpar/ops/elementwise.py.
// The host fills:
//   INDEX     how element i maps to each operand's offset (strides)
//   LOADS     let x0..x2 = operand values converted to their compute type
//   STORE/EXPR the op, converted to the output's storage type

{{FNS}}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.numel) { return; }
{{INDEX}}
{{LOADS}}
  bo[io] = {{STORE}}({{EXPR}});
}
