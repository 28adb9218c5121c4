// Depthwise convolution forward (groups = input channels, one input channel per group): output
// channel o reads input channel o / mult. One thread computes four neighbouring outputs of a row,
// so each weight is loaded once for four products. Bindings (y, wt, x, bias: arrays of T) and
// Params are declared in wgpar/ops/conv.py.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let quads = (p.ow + 3u) / 4u;
  let ox0 = (i % quads) * 4u;
  let oy = (i / quads) % p.oh;
  let oc = (i / (quads * p.oh)) % p.o;
  let img = i / (quads * p.oh * p.o);
  let xb = p.off_x + (img * p.c + oc / p.mult) * p.h * p.w;
  let wb = p.off_w + oc * p.kh * p.kw;
  let iw0 = vec4<i32>(vec4<u32>(ox0, ox0 + 1u, ox0 + 2u, ox0 + 3u) * p.sw) - i32(p.pw);
  var acc = vec4<f32>(0.0);
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let ih = i32(oy * p.sh + ki * p.dh) - i32(p.ph);
    if (ih < 0 || ih >= i32(p.h)) { continue; }
    let row = xb + u32(ih) * p.w;
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let iw = iw0 + i32(kj * p.dw);
      let ok = (iw >= vec4<i32>(0)) & (iw < vec4<i32>(i32(p.w)));
      let j = row + vec4<u32>(clamp(iw, vec4<i32>(0), vec4<i32>(i32(p.w) - 1)));
      let v = select(vec4<f32>(0.0), vec4<f32>(f32(x[j.x]), f32(x[j.y]), f32(x[j.z]), f32(x[j.w])), ok);
      acc = fma(vec4<f32>(f32(wt[wb + ki * p.kw + kj])), v, acc);
    }
  }
  if (p.has_bias != 0u) { acc = acc + f32(bias[p.off_b + oc]); }
  let yb = p.off_y + ((img * p.o + oc) * p.oh + oy) * p.ow + ox0;
  y[yb] = {{T}}(acc.x);
  if (ox0 + 1u < p.ow) { y[yb + 1u] = {{T}}(acc.y); }
  if (ox0 + 2u < p.ow) { y[yb + 2u] = {{T}}(acc.z); }
  if (ox0 + 3u < p.ow) { y[yb + 3u] = {{T}}(acc.w); }
}
