// Implicit-GEMM convolution forward, the helpers of matmul_fast.wgsl (ops/conv.py): per group
// z, y[O/G, B oh ow] = w[O/G, K] @ patches[K, B oh ow] with K = (channel, ki, kj) of the group;
// the patches are read from x where the tile is loaded, never stored. Row m is an output channel
// of the group, column n an (image, oy, ox). Parameters and bindings are declared in
// wgpar/ops/conv.py; T is the output's element type.

fn a_prep(m: u32, z: u32) -> u32 {
  return p.off_w + (z * p.M + min(m, p.M - 1u)) * p.K;
}

// Four k's of one weight row.
fn a_load(base: u32, k: u32) -> vec4<f32> {
  let kk = vec4<u32>(k, k + 1u, k + 2u, k + 3u);
  let i = base + min(kk, vec4<u32>(p.K - 1u));
  return select(vec4<f32>(0.0), vec4<f32>(f32(wt[i.x]), f32(wt[i.y]), f32(wt[i.z]), f32(wt[i.w])),
                kk < vec4<u32>(p.K));
}

// The first input row / column of the windows of columns n..n+3 and their image's channel-0 plane.
struct Cols { off: vec4<u32>, ih: vec4<i32>, iw: vec4<i32> }

fn b_prep(n: u32, z: u32) -> Cols {
  let nn = vec4<u32>(n, n + 1u, n + 2u, n + 3u);
  let l = p.oh * p.ow;
  let pos = nn % l;
  let far = vec4<i32>(-0x40000000);  // past N: a row no window reaches
  let ih = select(far, vec4<i32>((pos / p.ow) * p.sh) - i32(p.ph), nn < vec4<u32>(p.N));
  return Cols(p.off_x + ((nn / l) * p.c + z * p.cg) * p.h * p.w, ih, vec4<i32>((pos % p.ow) * p.sw) - i32(p.pw));
}

// Tap k of the four columns (zero in the padding and past K).
fn b_load(q: Cols, k: u32) -> vec4<f32> {
  let taps = p.kh * p.kw;
  let r = k % taps;
  let ih = q.ih + i32((r / p.kw) * p.dh);
  let iw = q.iw + i32((r % p.kw) * p.dw);
  let ok = (ih >= vec4<i32>(0)) & (ih < vec4<i32>(i32(p.h))) & (iw >= vec4<i32>(0)) & (iw < vec4<i32>(i32(p.w)))
           & vec4<bool>(k < p.K);
  let i = q.off + (k / taps) * p.h * p.w + vec4<u32>(clamp(ih, vec4<i32>(0), vec4<i32>(i32(p.h) - 1))) * p.w
          + vec4<u32>(clamp(iw, vec4<i32>(0), vec4<i32>(i32(p.w) - 1)));
  return select(vec4<f32>(0.0), vec4<f32>(f32(x[i.x]), f32(x[i.y]), f32(x[i.z]), f32(x[i.w])), ok);
}

fn y_store(n: u32, ch: u32, v: f32) {
  if (n < p.N) {
    let l = p.oh * p.ow;
    y[p.off_y + ((n / l) * p.o + ch) * l + n % l] = {{T}}(v);
  }
}

fn c_store(m: u32, n: u32, z: u32, v: vec4<f32>) {
  if (m >= p.M) { return; }
  let ch = z * p.M + m;
  var b = 0.0;
  if (p.has_bias != 0u) { b = f32(bias[p.off_b + ch]); }
  y_store(n, ch, v.x + b);
  y_store(n + 1u, ch, v.y + b);
  y_store(n + 2u, ch, v.z + b);
  y_store(n + 3u, ch, v.w + b);
}
