// Shared by softmax.wgsl and attention_softmax.wgsl, pasted in as their MERGE fill: the merge of every
// thread's running softmax statistics over one row, whose threads are a span of the workgroup.

var<workgroup> rm: array<f32, WG>;
var<workgroup> rs: array<f32, WG>;
var<workgroup> rbad: array<u32, WG>;

// Thread lid's running max m, sum s of exp(x - m) (0 while m is -inf) and NaN flag, merged over each
// aligned span of `span` threads (a power of two: the whole workgroup, or a row's threads) into the span's
// first slot: rm[lid - lid % span], rs[...], rbad[...] (call from uniform control flow: it holds barriers).
fn merge_stats(lid: u32, span: u32, m: f32, s: f32, bad: bool) {
  let neg_inf = bitcast<f32>(0xff800000u);
  rm[lid] = m;
  rs[lid] = s;
  rbad[lid] = select(0u, 1u, bad);
  workgroupBarrier();
  for (var k = span / 2u; k > 0u; k = k >> 1u) {
    if (lid % span < k) {
      let m1 = rm[lid];
      let m2 = rm[lid + k];
      let mm = max(m1, m2);
      if (mm > neg_inf) { rs[lid] = rs[lid] * exp(m1 - mm) + rs[lid + k] * exp(m2 - mm); }
      rm[lid] = mm;
      rbad[lid] = rbad[lid] | rbad[lid + k];
    }
    workgroupBarrier();
  }
}
