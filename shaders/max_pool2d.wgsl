// 2-d max pooling of contiguous x [N * C planes, H, W], one thread per output element: the
// largest element of the window and its index h * W + w in the plane (int32), as torch's CPU
// kernel picks them: taps in row-major order, a later tap wins only if it is larger or NaN (so a
// NaN always wins, the last NaN of the window), the first tap inside the input when none does.
// WINDOW: the window as constants (KH x KW taps written out, strides SH, SW, dilations DH, DW; they, PAD,
// window_at and tap_inside come with the AT fill).
// Bindings (out: T, idx: i32, x: T) and Params are declared in wgpar/ops/pool.py.

{{FNS}}

{{AT}}

// The window kernel: the same picks as main's loops, taps in the same order.
fn window_forward(gid: vec3<u32>, nwg: vec3<u32>) {
  let at = window_at(gid, nwg);
  if (!at.ok) { return; }
  var m = bitcast<f32>(0xff800000u);
  var mi = -1;
  for (var ki = 0u; ki < KH; ki = ki + 1u) {  // @unroll
    let h = at.h0 + i32(ki * DH);
    for (var kj = 0u; kj < KW; kj = kj + 1u) {  // @unroll
      let w = at.w0 + i32(kj * DW);
      if (tap_inside(h, w)) {
        let tap = h * i32(p.w) + w;
        let v = f32(x[at.base + u32(tap)]);
        if (mi < 0 || isnan_(v) || (!isnan_(m) && v > m)) {
          m = v;
          mi = tap;
        }
      }
    }
  }
  out[at.o] = {{T}}(m);
  idx[at.o] = mi;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  if (WINDOW) {
    window_forward(gid, nwg);
    return;
  }
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let ow = i % p.ow;
  let oh = (i / p.ow) % p.oh;
  let plane = i / (p.ow * p.oh);
  let base = p.off_x + plane * p.h * p.w;
  let h0 = i32(oh * p.sh) - i32(p.ph);
  let w0 = i32(ow * p.sw) - i32(p.pw);
  var m = bitcast<f32>(0xff800000u);
  var mi = -1;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let h = h0 + i32(ki * p.dh);
    if (h < 0 || h >= i32(p.h)) { continue; }
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let w = w0 + i32(kj * p.dw);
      if (w < 0 || w >= i32(p.w)) { continue; }
      let at = h * i32(p.w) + w;
      let v = f32(x[base + u32(at)]);
      if (mi < 0) { mi = at; }
      if (isnan_(v) || (!isnan_(m) && v > m)) {
        m = v;
        mi = at;
      }
    }
  }
  out[i] = {{T}}(m);
  idx[i] = mi;
}
