// Batched C[b] = A[b] @ B[b] with any strides on A and B (so transposed
// operands need no copy). 64x64 output tile per workgroup of 16x16 threads,
// each thread owns a 4x4 block spread 16 apart (conflict-free shared reads),
// K walked in steps of 16 through workgroup memory. Computes in f32. Bindings (c, a, b) and
// Params (m0, n0: the first tile of a split grid; strides in elements) are declared in
// wgpar/ops/matmul.py; TC is c's element type.

var<workgroup> As: array<array<f32, 64>, 16>;
var<workgroup> Bs: array<array<f32, 64>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let z = wid.z + p.z0;
  let row0 = p.m0 + wid.y * 64u;
  let col0 = p.n0 + wid.x * 64u;
  let tid = lid.y * 16u + lid.x;
  let base_a = i32(p.off_a) + i32(z) * p.sa_b;
  let base_b = i32(p.off_b) + i32(z) * p.sb_b;
  var acc: array<array<f32, 4>, 4>;
  for (var k0 = 0u; k0 < p.K; k0 = k0 + 16u) {
    for (var l = 0u; l < 4u; l = l + 1u) {
      let e = tid + l * 256u;
      let am = e / 16u;
      let ak = e % 16u;
      var va = 0.0;
      if (row0 + am < p.M && k0 + ak < p.K) {
        va = f32(a[base_a + i32(row0 + am) * p.sa_m + i32(k0 + ak) * p.sa_k]);
      }
      As[ak][am] = va;
      let bk = e / 64u;
      let bn = e % 64u;
      var vb = 0.0;
      if (k0 + bk < p.K && col0 + bn < p.N) {
        vb = f32(b[base_b + i32(k0 + bk) * p.sb_k + i32(col0 + bn) * p.sb_n]);
      }
      Bs[bk][bn] = vb;
    }
    workgroupBarrier();
    for (var kk = 0u; kk < 16u; kk = kk + 1u) {
      var av: array<f32, 4>;
      var bv: array<f32, 4>;
      for (var i = 0u; i < 4u; i = i + 1u) {
        av[i] = As[kk][lid.y + i * 16u];
        bv[i] = Bs[kk][lid.x + i * 16u];
      }
      for (var i = 0u; i < 4u; i = i + 1u) {
        for (var j = 0u; j < 4u; j = j + 1u) {
          acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
      }
    }
    workgroupBarrier();
  }
  let base_c = p.off_c + z * p.M * p.N;
  for (var i = 0u; i < 4u; i = i + 1u) {
    let m = row0 + lid.y + i * 16u;
    if (m >= p.M) { continue; }
    for (var j = 0u; j < 4u; j = j + 1u) {
      let n = col0 + lid.x + j * 16u;
      if (n < p.N) { c[base_c + m * p.N + n] = {{TC}}(acc[i][j]); }
    }
  }
}
