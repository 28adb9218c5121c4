// The input gradient of 2-d max pooling: one thread per input element (plane, h, w) sums the
// gradients of the outputs whose window holds it and whose recorded index (max_pool2d.wgsl) is
// h * W + w. No atomics: a fixed order of summation. Bindings (gx, g: arrays of T, idx: i32) and
// Params are declared in wgpar/ops/pool.py.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let w = i % p.w;
  let h = (i / p.w) % p.h;
  let plane = i / (p.w * p.h);
  let me = i32(h * p.w + w);
  let out0 = plane * p.oh * p.ow;
  var acc = 0.0;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let th = i32(h + p.ph) - i32(ki * p.dh);
    if (th < 0 || u32(th) % p.sh != 0u || u32(th) / p.sh >= p.oh) { continue; }
    let oh = u32(th) / p.sh;
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let tw = i32(w + p.pw) - i32(kj * p.dw);
      if (tw < 0 || u32(tw) % p.sw != 0u || u32(tw) / p.sw >= p.ow) { continue; }
      let o = out0 + oh * p.ow + u32(tw) / p.sw;
      if (idx[p.off_idx + o] == me) { acc = acc + f32(g[p.off_g + o]); }
    }
  }
  gx[i] = {{T}}(acc);
}
