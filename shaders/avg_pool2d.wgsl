// 2-d average pooling of contiguous [N * C planes, H, W] with torch's divisor: the window clipped
// to the padded input (H + ph rows) when padding counts (count_include_pad), clipped to the input
// otherwise, or a fixed divisor (divisor_override, when p.divisor is not 0). BACKWARD=false: one
// thread per output element averages its window of x (WINDOW: the window as constants, see
// window_forward). BACKWARD=true: x is the output's gradient
// and each thread takes VEC (1 or 4) consecutive input elements of a row, summing g / divisor over
// the windows holding them: only the outputs whose windows reach the elements are visited.
// Bindings (out, x: arrays of T) and Params are declared in wgpar/ops/pool.py.

const BACKWARD: bool = {{BACKWARD}};
const VEC: u32 = {{VEC}};

// The rows (columns) output o's window counts in its divisor: clipped to the padded input, or to the
// input without count_include_pad.
fn extent(o: u32, s: u32, pad: u32, k: u32, n: u32) -> i32 {
  let a = i32(o * s) - i32(pad);
  let b = min(a + i32(k), i32(n + pad));
  if (p.include_pad != 0u) { return b - a; }
  return min(b, i32(n)) - max(a, 0);
}

fn divisor(oh: u32, ow: u32) -> f32 {
  if (p.divisor != 0u) { return f32(p.divisor); }
  return f32(extent(oh, p.sh, p.ph, p.kh, p.h) * extent(ow, p.sw, p.pw, p.kw, p.w));
}

{{STORE}}

{{AT}}

// The forward with the window as constants (KH x KW taps written out, strides SH and SW; they, WINDOW, PAD,
// window_at and tap_inside come with the AT fill). With PAD the divisor is torch's.
fn window_forward(gid: vec3<u32>, nwg: vec3<u32>) {
  let at = window_at(gid, nwg);
  if (!at.ok) { return; }
  var acc = 0.0;
  for (var i = 0u; i < KH; i = i + 1u) {  // @unroll
    let h = at.h0 + i32(i);
    for (var j = 0u; j < KW; j = j + 1u) {  // @unroll
      let w = at.w0 + i32(j);
      if (tap_inside(h, w)) {
        acc = acc + f32(x[at.base + u32(h) * p.w + u32(w)]);
      }
    }
  }
  var d = f32(KH * KW);  // every window inside the input: both of torch's divisors are the window's size
  if (PAD || p.divisor != 0u) { d = divisor(at.oh, at.ow); }
  out[at.o] = {{T}}(acc / d);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  if (WINDOW) {
    window_forward(gid, nwg);
    return;
  }
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  if (!BACKWARD) {
    var acc = 0.0;
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
  let per_row = (p.w + VEC - 1u) / VEC;
  let row = i / per_row;  // plane * H + h: one division each, not one per element or tap
  let w0 = (i - row * per_row) * VEC;
  let plane = row / p.h;
  let h = row - plane * p.h;
  let out0 = p.off_x + plane * p.oh * p.ow;
  // Output oh's window holds rows oh * sh - ph .. + kh - 1: those holding h are
  // ceil((h + ph - kh + 1) / sh) .. floor((h + ph) / sh), clipped to the output (columns alike).
  let th = h + p.ph;
  let tw = w0 + p.pw;
  let oh0 = select(0u, (th + p.sh - p.kh) / p.sh, th >= p.kh);
  let oh1 = min(th / p.sh + 1u, p.oh);
  let ow0 = select(0u, (tw + p.sw - p.kw) / p.sw, tw >= p.kw);
  let ow1 = min((min(w0 + VEC, p.w) - 1u + p.pw) / p.sw + 1u, p.ow);
  let lanes = vec4<i32>(0, 1, 2, 3);
  var sums = vec4<f32>(0.0);
  for (var oh = oh0; oh < oh1; oh = oh + 1u) {
    let rows = extent(oh, p.sh, p.ph, p.kh, p.h);
    let r = out0 + oh * p.ow;
    for (var ow = ow0; ow < ow1; ow = ow + 1u) {
      let d = select(f32(rows * extent(ow, p.sw, p.pw, p.kw, p.w)), f32(p.divisor), p.divisor != 0u);
      let a = i32(ow * p.sw) - i32(tw);  // the window's first column, from w0
      let inside = lanes >= vec4<i32>(a) & lanes < vec4<i32>(a + i32(p.kw));
      sums = sums + select(vec4<f32>(0.0), vec4<f32>(f32(x[r + ow]) / d), inside);
    }
  }
  let at = row * p.w + w0;
  store_row(at, w0, sums);
}
