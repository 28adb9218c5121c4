// Implicit-GEMM convolution input gradient, the helpers of matmul_fast.wgsl (ops/conv.py), for
// one stride phase (rh, rw): the input positions h = rh + sh i, w = rw + sw j, which only the taps
// ki = ki0h + steph a (kj alike) reach, from output row i + offh - dsh a. Per group z,
// gx[C/G, B nh nw] = w^T[C/G, (o, a, b)] @ gy gathered[(o, a, b), B nh nw]: no tap falls outside
// the stride lattice, and a phase no tap reaches has K = 0 (zeros are stored). Row m is an input
// channel of the group, column n an (image, i, j) of the phase. Parameters and bindings are declared
// in wgpar/ops/conv.py; T is the output's element type.

// The weight offsets of input channels m..m+3 of group z, at output channel 0 and tap (0, 0).
fn a_prep(m: u32, z: u32) -> vec4<u32> {
  let mm = min(vec4<u32>(m, m + 1u, m + 2u, m + 3u), vec4<u32>(p.M - 1u));
  return p.off_w + (z * p.og * p.M + mm) * p.kh * p.kw;
}

// The weights of gemm-k = (o, a, b) for the four input channels.
fn a_load(base: vec4<u32>, k: u32) -> vec4<f32> {
  let kk = min(k, max(p.K, 1u) - 1u);
  let per = p.nki * p.nkj;
  let r = kk % per;
  let i = base + (kk / per) * p.M * p.kh * p.kw + (p.ki0h + (r / p.nkj) * p.steph) * p.kw + p.ki0w
          + (r % p.nkj) * p.stepw;
  return select(vec4<f32>(0.0), vec4<f32>(f32(wt[i.x]), f32(wt[i.y]), f32(wt[i.z]), f32(wt[i.w])),
                vec4<bool>(k < p.K));
}

// Columns n..n+3: the group's channel-0 plane of their image in gy, their i and j.
struct Cols { off: vec4<u32>, i: vec4<i32>, j: vec4<i32> }

fn b_prep(n: u32, z: u32) -> Cols {
  let nn = vec4<u32>(n, n + 1u, n + 2u, n + 3u);
  let l = p.nh * p.nw;
  let pos = nn % l;
  let far = vec4<i32>(-0x40000000);  // past N: a row no tap reaches
  let i = select(far, vec4<i32>(pos / p.nw), nn < vec4<u32>(p.N));
  return Cols(p.off_gy + ((nn / l) * p.o + z * p.og) * p.oh * p.ow, i, vec4<i32>(pos % p.nw));
}

fn b_load(q: Cols, k: u32) -> vec4<f32> {
  let kk = min(k, max(p.K, 1u) - 1u);
  let per = p.nki * p.nkj;
  let r = kk % per;
  let oy = q.i + p.offh - i32(r / p.nkj) * p.dsh;
  let ox = q.j + p.offw - i32(r % p.nkj) * p.dsw;
  let ok = (oy >= vec4<i32>(0)) & (oy < vec4<i32>(i32(p.oh))) & (ox >= vec4<i32>(0))
           & (ox < vec4<i32>(i32(p.ow))) & vec4<bool>(k < p.K);
  let i = q.off + (kk / per) * p.oh * p.ow + vec4<u32>(clamp(oy, vec4<i32>(0), vec4<i32>(i32(p.oh) - 1))) * p.ow
          + vec4<u32>(clamp(ox, vec4<i32>(0), vec4<i32>(i32(p.ow) - 1)));
  return select(vec4<f32>(0.0), vec4<f32>(f32(gy[i.x]), f32(gy[i.y]), f32(gy[i.z]), f32(gy[i.w])), ok);
}

fn gx_store(n: u32, ch: u32, v: f32) {
  if (n < p.N) {
    let l = p.nh * p.nw;
    let pos = n % l;
    gx[p.off_gx + (((n / l) * p.c + ch) * p.h + p.rh + (pos / p.nw) * p.sh) * p.w + p.rw + (pos % p.nw) * p.sw] =
      {{T}}(v);
  }
}

fn c_store(m: u32, n: u32, z: u32, v: vec4<f32>) {
  if (m >= p.M) { return; }
  let ch = z * p.M + m;
  gx_store(n, ch, v.x);
  gx_store(n + 1u, ch, v.y);
  gx_store(n + 2u, ch, v.z);
  gx_store(n + 3u, ch, v.w);
}
