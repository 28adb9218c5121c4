// The input gradient of 2-d max pooling: each thread takes VEC consecutive input elements of a row
// (plane, h, w0 ..) and sums the gradients of the outputs whose recorded index (max_pool2d.wgsl) is
// one of them, in output order (no atomics: a fixed order, torch's). It visits only the outputs whose
// window span (kh - 1) * dh + 1 holds the elements; with dilation some of those skip them, which
// the index test handles. TAPS (spans too long for the loop limit): one element per thread, a loop
// over the kernel taps. Bindings (out, g: arrays of T, idx: i32) and Params are in wgpar/ops/pool.py.

const VEC: u32 = {{VEC}};
const TAPS: bool = {{TAPS}};

{{STORE}}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let per_row = (p.w + VEC - 1u) / VEC;
  let row = i / per_row;  // plane * H + h: one division each, not one per element or tap
  let w0 = (i - row * per_row) * VEC;
  let plane = row / p.h;
  let h = row - plane * p.h;
  let out0 = plane * p.oh * p.ow;
  let me = i32(h * p.w + w0);
  let at = row * p.w + w0;
  if (TAPS) {
    var sum = 0.0;
    for (var ki = 0u; ki < p.kh; ki = ki + 1u) {
      let th = i32(h + p.ph) - i32(ki * p.dh);
      if (th < 0 || u32(th) % p.sh != 0u || u32(th) / p.sh >= p.oh) { continue; }
      let oh = u32(th) / p.sh;
      for (var kj = 0u; kj < p.kw; kj = kj + 1u) {
        let tw = i32(w0 + p.pw) - i32(kj * p.dw);
        if (tw < 0 || u32(tw) % p.sw != 0u || u32(tw) / p.sw >= p.ow) { continue; }
        let o = out0 + oh * p.ow + u32(tw) / p.sw;
        if (idx[p.off_idx + o] == me) { sum = sum + f32(g[p.off_g + o]); }
      }
    }
    out[at] = {{T}}(sum);
    return;
  }
  // Output oh spans input rows oh * sh - ph .. + eh - 1: those holding h are
  // ceil((h + ph - eh + 1) / sh) .. floor((h + ph) / sh), clipped to the output (columns alike).
  let eh = (p.kh - 1u) * p.dh + 1u;
  let ew = (p.kw - 1u) * p.dw + 1u;
  let th = h + p.ph;
  let tw = w0 + p.pw;
  let oh0 = select(0u, (th + p.sh - eh) / p.sh, th >= eh);
  let oh1 = min(th / p.sh + 1u, p.oh);
  let ow0 = select(0u, (tw + p.sw - ew) / p.sw, tw >= ew);
  let ow1 = min((min(w0 + VEC, p.w) - 1u + p.pw) / p.sw + 1u, p.ow);
  let lanes = vec4<i32>(0, 1, 2, 3);
  var acc = vec4<f32>(0.0);
  for (var oh = oh0; oh < oh1; oh = oh + 1u) {
    let r = out0 + oh * p.ow;
    for (var ow = ow0; ow < ow1; ow = ow + 1u) {
      let k = idx[p.off_idx + r + ow] - me;  // which of this thread's elements the output picked
      if (u32(k) < VEC) {  // (g read only then)
        acc = acc + select(vec4<f32>(0.0), vec4<f32>(f32(g[p.off_g + r + ow])), lanes == vec4<i32>(k));
      }
    }
  }
  store_row(at, w0, acc);
}
