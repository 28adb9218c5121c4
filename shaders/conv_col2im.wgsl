// col2im, the input gradient of a 2-d convolution: gx[n, c, h, w] sums the rows of gcols
// [C * kh * kw, cols] (im2col's layout) whose tap meets (h, w). One thread per input element
// gathers over its kh * kw taps (no atomics, so the sum's order is fixed); a tap meets an output
// position only where h + ph - ki * dh is a multiple of the stride inside [0, oh * sh).
// Bindings (gx, gcols: arrays of T) and Params are declared in wgpar/ops/conv.py.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let w = i % p.w;
  let h = (i / p.w) % p.h;
  let ch = (i / (p.w * p.h)) % p.c;
  let n = i / (p.w * p.h * p.c);
  var acc = 0.0;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let th = i32(h + p.ph) - i32(ki * p.dh);
    if (th < 0 || u32(th) % p.sh != 0u || u32(th) / p.sh >= p.oh) { continue; }
    let oh = u32(th) / p.sh;
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let tw = i32(w + p.pw) - i32(kj * p.dw);
      if (tw < 0 || u32(tw) % p.sw != 0u || u32(tw) / p.sw >= p.ow) { continue; }
      let ow = u32(tw) / p.sw;
      acc = acc + f32(gcols[((ch * p.kh + ki) * p.kw + kj) * p.cols + (n * p.oh + oh) * p.ow + ow]);
    }
  }
  gx[p.off_gx + i] = {{T}}(acc);
}
