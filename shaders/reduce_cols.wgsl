// Reduction over the middle axis of a contiguous [outer, n, inner] block: one
// thread per output element walks n, so neighbouring threads read neighbouring
// memory (coalesced) and no transpose copy is needed. Declared in wgpar/ops/reduce.py;
// fills as in reduce.wgsl.

{{FNS}}

fn fold(acc: ptr<function, {{C}}>, ai: ptr<function, i32>, v: {{C}}, c: i32) {
  {{COMBINE}}
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.outer * p.inner) { return; }
  let o = i / p.inner;
  let k = i % p.inner;
  let base = p.off + o * p.n * p.inner + k;
  var acc: {{C}} = {{INIT}};
  var ai: i32 = 2147483647;
  for (var c = 0u; c < p.n; c = c + 1u) {
    fold(&acc, &ai, {{C}}(x[base + c * p.inner]), i32(c));
  }
  let acc0 = acc;
  let ai0 = ai;
  out[i] = {{O}}({{FINAL}});
}
