// Input gradient of a convolution with few input channels per group (CG <= 4: a 3-channel stem), as a
// gather with no GEMM tile to pad: one thread sums, for all CG channels of its group, 8 input rows of one
// column of one stride phase (rh, rw) over the group's output channels and only the taps that reach that
// phase (rh + ph - ki dh divisible by sh: every steph-th tap from the first). The thread's rows are dsh
// apart (dsh = steph dh / sh, the output rows between two such taps), so one tap later they read the
// output rows of the previous row: 8 + nki - 1 loads of gy per (output channel, column tap) instead of
// 8 nki, each a column that consecutive threads read side by side (coalesced), and each weight read (the
// same for every thread of a phase and group) serves 8 rows. Bindings (gx, wt, gy: arrays of T) and
// Params are declared in wgpar/ops/conv.py; CG is an override constant.

const ROWS = 8u;

// The first tap ki < k that reaches input rows r (mod s), or -1. The taps that reach r are the ki with
// ki d = r + pad (mod s): every step-th (step = s / gcd(s, d)), so the first is below step. Unsigned
// throughout (r + pad + (s - 1) ki d = r + pad - ki d mod s): an NVIDIA GPU through Vulkan gave
// (-1) % 3 == 0 for i32 operands, as if the remainder were taken of the bits as u32 (lavapipe: -1).
fn first_tap(r: u32, pad: u32, k: u32, d: u32, s: u32, step: u32) -> i32 {
  for (var ki = 0u; ki < min(k, step); ki = ki + 1u) {
    if ((r + pad + (s - 1u) * ki * d) % s == 0u) { return i32(ki); }
  }
  return -1;
}

// (a - b) / s for a - b divisible by s, possibly negative, without a signed division (see first_tap).
fn exact_div(a: u32, b: u32, s: u32) -> i32 {
  return select(-i32((b - a) / s), i32((a - b) / s), a >= b);
}

// gy at output row oy of column ``col`` (the column's offset in its plane), 0 outside the output.
fn gy_at(col: u32, oy: i32) -> f32 {
  let r = bitcast<u32>(oy);  // a negative row wraps past oh: one comparison and one clamp
  return select(0.0, f32(gy[col + min(r, p.oh - 1u) * p.ow]), r < p.oh);
}

// Rows ib + (r0 + e) dsh (e < 4) of the phase that exist, from ``v``; ``base`` is the channel's column
// at phase row 0.
fn put4(base: u32, ib: u32, r0: u32, nh: u32, v: vec4<f32>) {
  let step = p.dsh * p.sh * p.w;
  let i0 = ib + r0 * p.dsh;
  if (i0 < nh) { gx[base + i0 * p.sh * p.w] = {{T}}(v.x); }
  if (i0 + p.dsh < nh) { gx[base + i0 * p.sh * p.w + step] = {{T}}(v.y); }
  if (i0 + 2u * p.dsh < nh) { gx[base + i0 * p.sh * p.w + 2u * step] = {{T}}(v.z); }
  if (i0 + 3u * p.dsh < nh) { gx[base + i0 * p.sh * p.w + 3u * step] = {{T}}(v.w); }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let q = i % p.nwm;  // the column within the phase: consecutive threads, consecutive columns
  var t = i / p.nwm;
  let rb = t % p.nblk;
  t = t / p.nblk;
  let rw = t % p.pwc;
  t = t / p.pwc;
  let rh = t % p.phc;
  t = t / p.phc;
  let grp = t % p.groups;
  let img = t / p.groups;
  let nh = (p.h - rh + p.sh - 1u) / p.sh;  // rows rh + sh i of the input, i < nh
  let nw = (p.w - rw + p.sw - 1u) / p.sw;
  let ib = (rb / p.dsh) * ROWS * p.dsh + rb % p.dsh;  // this thread's rows: ib + e dsh, e < 8
  if (q >= nw || ib >= nh) { return; }
  var a0 = vec4<f32>(0.0);  // channel c's rows 0-3 (a) and 4-7 (b)
  var b0 = vec4<f32>(0.0);
  var a1 = vec4<f32>(0.0);
  var b1 = vec4<f32>(0.0);
  var a2 = vec4<f32>(0.0);
  var b2 = vec4<f32>(0.0);
  var a3 = vec4<f32>(0.0);
  var b3 = vec4<f32>(0.0);
  let k0h = first_tap(rh, p.ph, p.kh, p.dh, p.sh, p.steph);
  let k0w = first_tap(rw, p.pw, p.kw, p.dw, p.sw, p.stepw);
  if (k0h >= 0 && k0w >= 0) {  // else no tap reaches the phase: its gradient is 0
    let nki = (p.kh - 1u - u32(k0h)) / p.steph + 1u;
    let nkj = (p.kw - 1u - u32(k0w)) / p.stepw + 1u;
    // output row and column that the first taps read for row ib and column q (the division is exact)
    let oyb = i32(ib) + exact_div(rh + p.ph, u32(k0h) * p.dh, p.sh);
    let oxb = i32(q) + exact_div(rw + p.pw, u32(k0w) * p.dw, p.sw);
    let dsh = i32(p.dsh);
    let kk = p.kh * p.kw;
    for (var m = 0u; m < p.og; m = m + 1u) {
      let oc = grp * p.og + m;
      let gb = p.off_gy + (img * p.o + oc) * p.oh * p.ow;
      let wb = p.off_w + oc * CG * kk + u32(k0h) * p.kw + u32(k0w);
      for (var jw = 0u; jw < nkj; jw = jw + 1u) {
        let ox = oxb - i32(jw * p.dsw);
        if (ox < 0 || ox >= i32(p.ow)) { continue; }
        let col = gb + u32(ox);
        // gy rows oyb + e dsh (e < 8): what rows e read at the first row tap
        var va = vec4<f32>(gy_at(col, oyb), gy_at(col, oyb + dsh), gy_at(col, oyb + 2 * dsh),
                           gy_at(col, oyb + 3 * dsh));
        var vb = vec4<f32>(gy_at(col, oyb + 4 * dsh), gy_at(col, oyb + 5 * dsh), gy_at(col, oyb + 6 * dsh),
                           gy_at(col, oyb + 7 * dsh));
        var wi = wb + jw * p.stepw;
        for (var jh = 0u; jh < nki; jh = jh + 1u) {
          let w0 = vec4<f32>(f32(wt[wi]));
          a0 = fma(w0, va, a0);
          b0 = fma(w0, vb, b0);
          if (CG > 1u) {
            let w1 = vec4<f32>(f32(wt[wi + kk]));
            a1 = fma(w1, va, a1);
            b1 = fma(w1, vb, b1);
          }
          if (CG > 2u) {
            let w2 = vec4<f32>(f32(wt[wi + 2u * kk]));
            a2 = fma(w2, va, a2);
            b2 = fma(w2, vb, b2);
          }
          if (CG > 3u) {
            let w3 = vec4<f32>(f32(wt[wi + 3u * kk]));
            a3 = fma(w3, va, a3);
            b3 = fma(w3, vb, b3);
          }
          // the next row tap reads each row's output row dsh lower: the rows shift by one
          vb = vec4<f32>(va.w, vb.xyz);
          va = vec4<f32>(gy_at(col, oyb - i32(jh + 1u) * dsh), va.xyz);
          wi = wi + p.steph * p.kw;
        }
      }
    }
  }
  let plane = p.h * p.w;
  let base = p.off_gx + (img * p.c + grp * CG) * plane + rh * p.w + rw + q * p.sw;
  put4(base, ib, 0u, nh, a0);
  put4(base, ib, 4u, nh, b0);
  if (CG > 1u) {
    put4(base + plane, ib, 0u, nh, a1);
    put4(base + plane, ib, 4u, nh, b1);
  }
  if (CG > 2u) {
    put4(base + 2u * plane, ib, 0u, nh, a2);
    put4(base + 2u * plane, ib, 4u, nh, b2);
  }
  if (CG > 3u) {
    put4(base + 3u * plane, ib, 0u, nh, a3);
    put4(base + 3u * plane, ib, 4u, nh, b3);
  }
}
