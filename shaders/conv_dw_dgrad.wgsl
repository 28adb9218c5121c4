// Depthwise convolution input gradient as a gather (no atomics: a fixed order of summation): one
// thread sums four neighbouring input elements of a row over the mult output channels of their
// channel and the taps that reach them; a tap reaches input column w from output column
// (w + pw - kj dw) / sw where that divides. Bindings (gx, wt, gy: arrays of T) and Params are
// declared in wgpar/ops/conv.py.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let quads = (p.w + 3u) / 4u;
  let x0 = (i % quads) * 4u;
  let h = (i / quads) % p.h;
  let ch = (i / (quads * p.h)) % p.c;
  let img = i / (quads * p.h * p.c);
  let tw0 = vec4<i32>(vec4<u32>(x0, x0 + 1u, x0 + 2u, x0 + 3u) + p.pw);
  let sw = vec4<i32>(i32(p.sw));
  var acc = vec4<f32>(0.0);
  for (var m = 0u; m < p.mult; m = m + 1u) {
    let oc = ch * p.mult + m;
    let gb = p.off_gy + (img * p.o + oc) * p.oh * p.ow;
    let wb = p.off_w + oc * p.kh * p.kw;
    for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
      let th = i32(h + p.ph) - i32(ki * p.dh);
      if (th < 0 || u32(th) % p.sh != 0u || u32(th) / p.sh >= p.oh) { continue; }
      let row = gb + (u32(th) / p.sh) * p.ow;
      for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
        let tw = tw0 - i32(kj * p.dw);
        let ox = tw / sw;
        let ok = (tw >= vec4<i32>(0)) & (tw % sw == vec4<i32>(0)) & (ox < vec4<i32>(i32(p.ow)));
        let j = row + vec4<u32>(clamp(ox, vec4<i32>(0), vec4<i32>(i32(p.ow) - 1)));
        let v = select(vec4<f32>(0.0), vec4<f32>(f32(gy[j.x]), f32(gy[j.y]), f32(gy[j.z]), f32(gy[j.w])), ok);
        acc = fma(vec4<f32>(f32(wt[wb + ki * p.kw + kj])), v, acc);
      }
    }
  }
  let xb = p.off_gx + ((img * p.c + ch) * p.h + h) * p.w + x0;
  gx[xb] = {{T}}(acc.x);
  if (x0 + 1u < p.w) { gx[xb + 1u] = {{T}}(acc.y); }
  if (x0 + 2u < p.w) { gx[xb + 2u] = {{T}}(acc.z); }
  if (x0 + 3u < p.w) { gx[xb + 3u] = {{T}}(acc.w); }
}
