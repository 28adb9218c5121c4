// Two sums per channel of contiguous [N, C, inner] tensors a and b, over N and inner (M = N *
// inner elements), for batch norm: the batch statistics (sum of a, then of (a - mean)^2 and
// a - mean) and the gradient's (sum of b, of b * (a - mean)). One workgroup sums one chunk of one
// channel into part[(c * 2 + s) * groups + chunk]; a caller with several chunks per channel adds
// them up. {{TERM1}} and {{TERM2}} are expressions over va, vb and m (the channel's mean: 0, a
// float32 [C] read at p.off_m, or mean_of(ch), filled in below: the sum of the parts of an earlier pass
// over the count).
// Bindings (part: f32, a, b, mean; b and mean left out where unused) and Params are declared in
// wgpar/ops/batch_norm.py.

{{FNS}}

var<workgroup> r1: array<f32, WG>;
var<workgroup> r2: array<f32, WG>;
// The mean goes through workgroup memory so it is rounded to f32 before use: kept in a register, a GPU
// compiler may contract va - s * minv into one FMA (an unrounded mean, which the finalize pass's
// rounded mean would then miss by up to half an ulp: seen on an H100, 2e-4 error at mean 1000).
var<workgroup> wm: f32;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let flat = wid.x + wid.y * nwg.x;
  let live = flat < p.c * p.groups;
  let ch = flat / p.groups;
  let chunk = flat % p.groups;
  var s1 = 0.0;
  var s2 = 0.0;
  if (live && lid == 0u) { wm = {{MEAN}}; }
  workgroupBarrier();
  if (live) {
    let m = wm;
    let end = min((chunk + 1u) * p.chunk, p.count);
    for (var j = chunk * p.chunk + lid; j < end; j = j + WG) {
      let n = j / p.inner;
      let at = (n * p.c + ch) * p.inner + (j - n * p.inner);
      let va = f32(a[p.off_a + at]);
      let vb = {{VB}};
      s1 = s1 + {{TERM1}};
      s2 = s2 + {{TERM2}};
    }
  }
  r1[lid] = s1;
  r2[lid] = s2;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (lid < s) {
      r1[lid] = r1[lid] + r1[lid + s];
      r2[lid] = r2[lid] + r2[lid + s];
    }
    workgroupBarrier();
  }
  if (live && lid == 0u) {
    part[2u * ch * p.groups + chunk] = r1[0];
    part[(2u * ch + 1u) * p.groups + chunk] = r2[0];
  }
}
