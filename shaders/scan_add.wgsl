// The second half of a blocked scan: every entry of block b > 0 of a row is combined with the
// scanned total of the blocks before it, s[row, b - 1]. Bindings (out, s) and Params are declared
// in wgpar/ops/scan.py; C, COMBINE, LOAD and STORE as in scan.wgsl.

fn combine(a: {{C}}, b: {{C}}) -> {{C}} { return {{COMBINE}}; }

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.rows * p.n) { return; }
  let row = i / p.n;
  let b = (i % p.n) / p.block;
  if (b == 0u) { return; }
  out[i] = {{STORE}}(combine({{LOAD}}(s[row * p.nb + b - 1u]), {{LOAD}}(out[i])));
}
