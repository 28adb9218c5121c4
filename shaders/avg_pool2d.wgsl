// 2-d average pooling of contiguous [N * C planes, H, W] with torch's divisor: the window clipped
// to the padded input (H + ph rows) when padding counts (count_include_pad), clipped to the input
// otherwise, or a fixed divisor (divisor_override, when p.divisor is not 0). BACKWARD=false: one
// thread per output element averages its window of x. BACKWARD=true: x is the output's gradient
// and one thread per input element sums g / divisor over the windows holding it.
// Bindings (out, x: arrays of T) and Params are declared in wgpar/ops/pool.py.

const BACKWARD: bool = {{BACKWARD}};

fn divisor(oh: u32, ow: u32) -> f32 {
  if (p.divisor != 0u) { return f32(p.divisor); }
  let hs = i32(oh * p.sh) - i32(p.ph);
  let ws = i32(ow * p.sw) - i32(p.pw);
  let he = min(hs + i32(p.kh), i32(p.h + p.ph));
  let we = min(ws + i32(p.kw), i32(p.w + p.pw));
  if (p.include_pad != 0u) { return f32((he - hs) * (we - ws)); }
  return f32((min(he, i32(p.h)) - max(hs, 0)) * (min(we, i32(p.w)) - max(ws, 0)));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  var acc = 0.0;
  if (!BACKWARD) {
    let ow = i % p.ow;
    let oh = (i / p.ow) % p.oh;
    let base = p.off_x + (i / (p.ow * p.oh)) * p.h * p.w;
    let hs = i32(oh * p.sh) - i32(p.ph);
    let ws = i32(ow * p.sw) - i32(p.pw);
    for (var h = max(hs, 0); h < min(hs + i32(p.kh), i32(p.h)); h = h + 1) {
      for (var w = max(ws, 0); w < min(ws + i32(p.kw), i32(p.w)); w = w + 1) {
        acc = acc + f32(x[base + u32(h) * p.w + u32(w)]);
      }
    }
    out[i] = {{T}}(acc / divisor(oh, ow));
    return;
  }
  let w = i % p.w;
  let h = (i / p.w) % p.h;
  let out0 = p.off_x + (i / (p.w * p.h)) * p.oh * p.ow;
  for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
    let th = i32(h + p.ph) - i32(ki);
    if (th < 0 || u32(th) % p.sh != 0u || u32(th) / p.sh >= p.oh) { continue; }
    let oh = u32(th) / p.sh;
    for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
      let tw = i32(w + p.pw) - i32(kj);
      if (tw < 0 || u32(tw) % p.sw != 0u || u32(tw) / p.sw >= p.ow) { continue; }
      let ow = u32(tw) / p.sw;
      acc = acc + f32(x[out0 + oh * p.ow + ow]) / divisor(oh, ow);
    }
  }
  out[i] = {{T}}(acc);
}
