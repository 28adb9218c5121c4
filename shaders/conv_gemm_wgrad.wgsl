// Implicit-GEMM convolution weight gradient, the helpers of matmul_fast.wgsl (ops/conv.py):
// gw[O/G, K] = gy[O/G, B oh ow] @ patches^T, the patches read from x where the tile is loaded.
// The long sum over positions is split into parts of p.K positions: z = part * groups + group,
// and part z's product goes to gw[z] (the caller sums the parts). Row m is an output channel of
// the group, column n a tap (channel, ki, kj), k a position (image, oy, ox) of the part.
// Parameters and bindings are declared in wgpar/ops/conv.py; partial sums are f32.

// (the channel's offset in image 0 of gy, the part's first position)
fn a_prep(m: u32, z: u32) -> vec2<u32> {
  let l = p.oh * p.ow;
  return vec2<u32>(p.off_gy + ((z % p.groups) * p.M + min(m, p.M - 1u)) * l, (z / p.groups) * p.K);
}

// Positions k..k+3 of the part in one output channel's gradient.
fn a_load(r: vec2<u32>, k: u32) -> vec4<f32> {
  let kk = vec4<u32>(k, k + 1u, k + 2u, k + 3u);
  let q = r.y + kk;
  let l = p.oh * p.ow;
  let ok = (kk < vec4<u32>(p.K)) & (q < vec4<u32>(p.nq));
  let i = r.x + min(q / l, vec4<u32>(p.nq / l - 1u)) * p.o * l + q % l;
  return select(vec4<f32>(0.0), vec4<f32>(f32(gy[i.x]), f32(gy[i.y]), f32(gy[i.z]), f32(gy[i.w])), ok);
}

// Taps n..n+3: their channel's plane in image 0 of x, their row / column offset from a window's corner.
struct Taps { off: vec4<u32>, dy: vec4<i32>, dx: vec4<i32>, q0: u32 }

fn b_prep(n: u32, z: u32) -> Taps {
  let taps = p.kh * p.kw;
  let nn = min(vec4<u32>(n, n + 1u, n + 2u, n + 3u), vec4<u32>(p.N - 1u));
  let r = nn % taps;
  return Taps(p.off_x + ((z % p.groups) * p.cg + nn / taps) * p.h * p.w,
              vec4<i32>((r / p.kw) * p.dh) - i32(p.ph), vec4<i32>((r % p.kw) * p.dw) - i32(p.pw), (z / p.groups) * p.K);
}

// Position k of the part under the four taps (zero in the padding and past the part).
fn b_load(t: Taps, k: u32) -> vec4<f32> {
  let q = t.q0 + k;
  let l = p.oh * p.ow;
  let img = min(q / l, p.nq / l - 1u);
  let pos = q % l;
  let ih = t.dy + i32((pos / p.ow) * p.sh);
  let iw = t.dx + i32((pos % p.ow) * p.sw);
  let ok = (ih >= vec4<i32>(0)) & (ih < vec4<i32>(i32(p.h))) & (iw >= vec4<i32>(0)) & (iw < vec4<i32>(i32(p.w)))
           & vec4<bool>(k < p.K && q < p.nq);
  let i = t.off + img * p.c * p.h * p.w + vec4<u32>(clamp(ih, vec4<i32>(0), vec4<i32>(i32(p.h) - 1))) * p.w
          + vec4<u32>(clamp(iw, vec4<i32>(0), vec4<i32>(i32(p.w) - 1)));
  return select(vec4<f32>(0.0), vec4<f32>(f32(x[i.x]), f32(x[i.y]), f32(x[i.z]), f32(x[i.w])), ok);
}

fn c_store(m: u32, n: u32, z: u32, v: vec4<f32>) {
  if (m >= p.M) { return; }
  let row = (z * p.M + m) * p.N;
  if (n < p.N) { gw[row + n] = v.x; }
  if (n + 1u < p.N) { gw[row + n + 1u] = v.y; }
  if (n + 2u < p.N) { gw[row + n + 2u] = v.z; }
  if (n + 3u < p.N) { gw[row + n + 3u] = v.w; }
}
