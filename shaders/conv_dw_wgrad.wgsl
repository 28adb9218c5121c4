// Depthwise convolution weight gradient without float atomics: workgroup (part, o) sums
// gy * x over the part's positions (image, oy, ox) for every tap of output channel o, each
// thread over every WG-th position with KH * KW accumulators, then a tree reduction in workgroup
// memory per tap; part[part, o, tap] takes the workgroup's sum and the caller sums the parts.
// Bindings (gw: f32 partial sums, gy, x: arrays of T) and Params are declared in wgpar/ops/conv.py; KH, KW
// are the kernel size (constant loops keep the accumulators in registers).

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let g = wid.x + wid.y * nwg.x;
  let part = g % p.parts;
  let oc = g / p.parts;  // past O only in the last row of a split grid: a uniform exit
  if (oc >= p.o) { return; }
  let l = p.oh * p.ow;
  var acc: array<f32, {{KH}} * {{KW}}>;
  for (var s = 0u; s < p.per; s = s + 1u) {
    let q = (part * p.per + s) * WG + lid.x;
    if (q >= p.nq) { break; }
    let img = q / l;
    let pos = q % l;
    let gv = f32(gy[p.off_gy + (img * p.o + oc) * l + pos]);
    let xb = p.off_x + (img * p.c + oc / p.mult) * p.h * p.w;
    let ih0 = i32((pos / p.ow) * p.sh) - i32(p.ph);
    let iw0 = i32((pos % p.ow) * p.sw) - i32(p.pw);
    for (var ki = 0u; ki < {{KH}}u; ki = ki + 1u) {
      let ih = ih0 + i32(ki * p.dh);
      if (ih < 0 || ih >= i32(p.h)) { continue; }
      for (var kj = 0u; kj < {{KW}}u; kj = kj + 1u) {
        let iw = iw0 + i32(kj * p.dw);
        if (iw >= 0 && iw < i32(p.w)) {
          acc[ki * {{KW}}u + kj] = fma(gv, f32(x[xb + u32(ih) * p.w + u32(iw)]), acc[ki * {{KW}}u + kj]);
        }
      }
    }
  }
  for (var t = 0u; t < {{KH}}u * {{KW}}u; t = t + 1u) {
    red[lid.x] = acc[t];
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
      if (lid.x < s) { red[lid.x] = red[lid.x] + red[lid.x + s]; }
      workgroupBarrier();
    }
    if (lid.x == 0u) { gw[(part * p.o + oc) * {{KH}}u * {{KW}}u + t] = red[0]; }
    workgroupBarrier();
  }
}
