// Per-channel partial sums for batch norm over contiguous [N, C, inner] tensors a and b (M = N *
// inner elements a channel): one workgroup per chunk of p.chunk elements of one channel, its sums
// written to part[p.off_p + (ROWS * ch + r) * groups + chunk]; batch_norm_apply.wgsl combines a
// channel's chunks.
// MODE 0 (the statistics of a, ROWS 3): the chunk's own mean m_k first, then the sums of a - m_k and
//   (a - m_k)^2 (the chunk read twice, the second time from cache): r = 0: m_k, 1: sum a - m_k,
//   2: sum (a - m_k)^2. Workgroup 0 also runs {{COUNT}} (num_batches_tracked += 1, or nothing).
// MODE 1 (the gradient's sums, ROWS 2): with m = {{MEAN}}, the forward's mean: r = 0: sum b,
//   1: sum b (a - m). b is read as {{VB}}.
// Bindings (part: f32, a, b, st, nbt; those unused left out) and Params are declared in
// wgpar/ops/batch_norm.py.

const MODE: u32 = {{MODE}};

var<workgroup> r1: array<f32, WG>;
var<workgroup> r2: array<f32, WG>;
// The mean goes through workgroup memory so it is rounded to f32 before use: kept in a register, a GPU
// compiler may fuse its computation into a - m (an FMA: an unrounded mean, which the m_k stored for the
// combining would then miss by up to half an ulp: seen on an H100, 2e-4 error at mean 1000).
var<workgroup> wm: f32;

fn add_up(lid: u32, s1: f32, s2: f32) {
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
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let flat = wid.x + wid.y * nwg.x;
  let live = flat < p.c * p.groups;
  let ch = flat / p.groups;
  let chunk = flat % p.groups;
  let start = chunk * p.chunk;
  let end = select(start, min(start + p.chunk, p.count), live);
  if (MODE == 0u) {
    var s = 0.0;
    for (var j = start + lid; j < end; j = j + WG) {
      let n = j / p.inner;
      s = s + f32(a[p.off_a + (n * p.c + ch) * p.inner + (j - n * p.inner)]);
    }
    add_up(lid, s, 0.0);
    if (lid == 0u) {
      wm = r1[0] / f32(max(end - start, 1u));
      if (flat == 0u) {
        {{COUNT}}
      }
    }
  } else if (live && lid == 0u) {
    wm = {{MEAN}};
  }
  workgroupBarrier();
  let m = wm;
  var s1 = 0.0;
  var s2 = 0.0;
  for (var j = start + lid; j < end; j = j + WG) {
    let n = j / p.inner;
    let at = (n * p.c + ch) * p.inner + (j - n * p.inner);
    let d = f32(a[p.off_a + at]) - m;
    if (MODE == 0u) {
      s1 = s1 + d;
      s2 = s2 + d * d;
    } else {
      let vb = {{VB}};
      s1 = s1 + vb;
      s2 = s2 + vb * d;
    }
  }
  add_up(lid, s1, s2);
  if (live && lid == 0u) {
    let base = p.off_p + (2u + 1u - MODE) * ch * p.groups + chunk;
    if (MODE == 0u) {
      part[base] = m;
      part[base + p.groups] = r1[0];
      part[base + 2u * p.groups] = r2[0];
    } else {
      part[base] = r1[0];
      part[base + p.groups] = r2[0];
    }
  }
}
