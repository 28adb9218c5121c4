// Backward of index_select: out[o, r, k] = sum over j with idx[j] == r of g[o, j, k].
// WGSL has no float atomics, so the host sorts the index into CSR form
// (csr[0..n] row starts, csr[n+1..] positions j) and each thread owns one output.
// Bindings (out, g, csr) and Params are declared in wgpar/ops/index.py; T is the element type.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.outer * p.n * p.inner) { return; }
  let k = i % p.inner;
  let r = (i / p.inner) % p.n;
  let o = i / (p.inner * p.n);
  var acc = 0.0;
  for (var e = csr[r]; e < csr[r + 1u]; e = e + 1) {
    let j = u32(csr[p.n + 1u + u32(e)]);
    acc = acc + f32(g[p.off_g + (o * p.count + j) * p.inner + k]);
  }
  out[i] = {{T}}(acc);
}
