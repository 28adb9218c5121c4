// Elementwise map over up to three operands (tensors or scalars) of any layout, with
// NumPy broadcasting expressed as strides (0 along broadcast dims); contiguous outputs
// whose operands are blocks of memory take elementwise_block.wgsl instead. The bindings
// (bo = output, read_write; b1.. inputs) and Params are declared in wgpar/ops/elementwise.py.
// A thread writes W consecutive elements of the innermost dimension (W = 4 where its length is a
// multiple of 4: one index decomposition, whose divisions dominate, for four elements; p.numel then
// counts units of W). The host fills:
//   INDEX     where the thread's first element lies in the output and each operand (strides), and
//             the innermost strides (so, s0..s2) that step to the next
//   STEP      io, i0..i2 of element j
//   LOADS     let x0..x2 = operand values converted to their compute type
//   STORE/EXPR the op, converted to the output's storage type

{{FNS}}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.numel) { return; }
{{INDEX}}
  for (var j = 0i; j < {{W}}; j = j + 1i) {
{{STEP}}
{{LOADS}}
    bo[io] = {{STORE}}({{EXPR}});
  }
}
