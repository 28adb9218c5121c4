// Scalar helper functions shared by the elementwise kernels (elementwise.wgsl, elementwise_block.wgsl),
// pasted after float_fns.wgsl. An op's expression (wgpar/ops/registry.py) writes `name_{T}(...)`
// and {T} becomes the compute type, so `relu_{T}(x0)` calls relu_f32 or relu_i32.
//
// Edge values follow PyTorch and never the driver: NaN propagates through maximum / minimum /
// clamp / relu / tanh (float_fns.wgsl says why it is tested by its bits), comparisons with a NaN
// are false (but !=), and signed integer / and % never run on negative operands (below).

// -- comparisons: IEEE results for NaN operands, whatever the compiler assumes -----------------
fn unordered_(a: f32, b: f32) -> bool { return isnan_(a) || isnan_(b); }
fn eq_f32(a: f32, b: f32) -> bool { return a == b && !unordered_(a, b); }
fn ne_f32(a: f32, b: f32) -> bool { return !eq_f32(a, b); }
fn lt_f32(a: f32, b: f32) -> bool { return a < b && !unordered_(a, b); }
fn le_f32(a: f32, b: f32) -> bool { return a <= b && !unordered_(a, b); }
fn gt_f32(a: f32, b: f32) -> bool { return a > b && !unordered_(a, b); }
fn ge_f32(a: f32, b: f32) -> bool { return a >= b && !unordered_(a, b); }
// Equal, or both NaN: the entries a max / min reduction picked (its backward).
fn same_f32(a: f32, b: f32) -> bool { return eq_f32(a, b) || (isnan_(a) && isnan_(b)); }
fn nz_f32(a: f32) -> bool { return !(a == 0.0) || isnan_(a); }  // truthiness: NaN is true
fn eq_i32(a: i32, b: i32) -> bool { return a == b; }
fn ne_i32(a: i32, b: i32) -> bool { return a != b; }
fn lt_i32(a: i32, b: i32) -> bool { return a < b; }
fn le_i32(a: i32, b: i32) -> bool { return a <= b; }
fn gt_i32(a: i32, b: i32) -> bool { return a > b; }
fn ge_i32(a: i32, b: i32) -> bool { return a >= b; }
fn same_i32(a: i32, b: i32) -> bool { return a == b; }
fn nz_i32(a: i32) -> bool { return a != 0; }

// -- max, min, clamp, relu, sign, neg, abs -----------------------------------------------------
fn maximum_f32(a: f32, b: f32) -> f32 { return max_nan(a, b); }
fn minimum_f32(a: f32, b: f32) -> f32 { return min_nan(a, b); }
fn maximum_i32(a: i32, b: i32) -> i32 { return max(a, b); }
fn minimum_i32(a: i32, b: i32) -> i32 { return min(a, b); }
fn relu_f32(x: f32) -> f32 { return select(max(x, 0.0), x, isnan_(x)); }
fn relu_i32(x: i32) -> i32 { return max(x, 0); }
// PyTorch's relu backward zeroes the gradient where x <= 0, so a NaN input passes it through.
fn relu_bwd_f32(x: f32, g: f32) -> f32 { return select(0.0, g, x > 0.0 || isnan_(x)); }
fn relu_bwd_i32(x: i32, g: i32) -> i32 { return select(0, g, x > 0); }
// torch.sign(nan) is 0 (NumPy says nan; wgpar follows PyTorch).
fn sign_f32(x: f32) -> f32 { return select(0.0, sign(x), !(x == 0.0) && !isnan_(x)); }
fn sign_i32(x: i32) -> i32 { return select(0, select(-1, 1, x > 0), x != 0); }
fn neg_f32(x: f32) -> f32 { return -x; }
fn abs_f32(x: f32) -> f32 { return abs(x); }
// On the bits in u32, so the most negative int32 wraps to itself (as in NumPy and PyTorch)
// rather than meeting a driver's signed negate or abs.
fn neg_i32(x: i32) -> i32 { return bitcast<i32>(0u - bitcast<u32>(x)); }
fn abs_i32(x: i32) -> i32 { return select(x, neg_i32(x), x < 0); }

// -- float -> int32 cast: saturating, NaN -> 0 (what CUDA does; NumPy and PyTorch on the CPU
// leave it undefined). The clamp keeps i32() in range; its upper end is the largest f32 below 2^31.
fn f2i_(x: f32) -> i32 {
  let t = i32(clamp(x, -2147483648.0, 2147483520.0));
  return select(select(t, 2147483647, x >= 2147483648.0), 0, isnan_(x));
}

// -- transcendental: NaN in, NaN out; domain edges as in C / PyTorch ----------------------------
fn exp_(x: f32) -> f32 { return select(exp(x), x, isnan_(x)); }
fn log_(x: f32) -> f32 {
  if (isnan_(x) || x < 0.0) { return nan_like(x); }
  if (x == 0.0) { return -abs(inf_like(x)); }
  return log(x);
}
fn sqrt_(x: f32) -> f32 { return select(sqrt(x), nan_like(x), isnan_(x) || x < 0.0); }
fn rsqrt_(x: f32) -> f32 {
  if (isnan_(x) || x < 0.0) { return nan_like(x); }
  if (x == 0.0) { return inf_like(x); }  // 1 / sqrt(-0) = -inf
  return inverseSqrt(x);
}

// C99's pow (PyTorch's): every case that WGSL's pow (exp2(b * log2(a))) leaves undefined or
// gets wrong (a <= 0, infinities, NaN) is decided here; integral exponents of negative bases work.
fn fpow(a: f32, b: f32) -> f32 {
  if ((b == 0.0 && !isnan_(b)) || (a == 1.0 && !isnan_(a))) { return 1.0; }
  if (isnan_(a) || isnan_(b)) { return nan_like(a + b); }
  let odd = b == trunc(b) && abs(b) < 16777216.0 && abs(b) % 2.0 == 1.0;  // f32 integers >= 2^24 are even
  let neg = odd && signbit_(a);
  if (a == 0.0 || isinf_(a)) {
    let mag = select(0.0, abs(inf_like(a)), (a == 0.0) == (b < 0.0));  // 0^-y and inf^y are infinite
    return select(mag, -mag, neg);
  }
  if (isinf_(b)) {
    if (abs(a) == 1.0) { return 1.0; }
    return select(0.0, abs(inf_like(b)), (abs(a) > 1.0) == (b > 0.0));
  }
  if (b == 1.0) { return a; }  // pow(max, 1) is exp2(128) = inf through exp2 / log2
  if (b == 2.0) { return a * a; }
  if (b == trunc(b)) {
    let r = pow(abs(a), b);
    return select(r, -r, neg);
  }
  if (a < 0.0) { return nan_like(a); }
  return pow(a, b);
}

// erf with |error| < 1.2e-7 (Numerical Recipes erfc Chebyshev fit): GELU must match PyTorch's exact form.
fn erf_(x: f32) -> f32 {
  let z = abs(x);
  let t = 1.0 / (1.0 + 0.5 * z);
  let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
          t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
          t * (-0.82215223 + t * 0.17087277)))))))));
  return select(r - 1.0, 1.0 - r, x >= 0.0);
}

fn gelu_(x: f32) -> f32 { return select(0.5 * x * (1.0 + erf_(x * 0.7071067811865476)), x, isnan_(x)); }
// GELU's derivative, for its backward.
fn gelu_grad_(x: f32) -> f32 {
  return 0.5 * (1.0 + erf_(x * 0.7071067811865476)) + x * 0.3989422804014327 * exp(-0.5 * x * x);
}
// GELU's tanh approximation (PyTorch's approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
fn gelu_tanh_(x: f32) -> f32 {
  let inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return select(0.5 * x * (1.0 + tanh_(inner)), x, isnan_(x));
}
// Its derivative, written as PyTorch's backward writes it.
fn gelu_tanh_grad_(x: f32) -> f32 {
  let t = tanh_(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * x * x);
}
// log(1 + y), accurate for small y (Kahan: the rounding of 1 + y divides out); WGSL has no log1p.
fn log1p_(y: f32) -> f32 {
  let u = 1.0 + y;
  if (u == 1.0) { return y; }
  return log(u) * (y / (u - 1.0));
}
// log(1 + exp(x)) without overflow; above 20, x itself (PyTorch's threshold).
fn softplus_(x: f32) -> f32 {
  return select(max(x, 0.0) + log1p_(exp(-abs(x))), x, x > 20.0 || isnan_(x));
}
fn sigmoid_(x: f32) -> f32 { return select(1.0 / (1.0 + exp(-x)), x, isnan_(x)); }
// Some drivers compute tanh as a ratio of exponentials that overflows to NaN, hence the clamp
// (tanh(20) is 1 in f32); a NaN must not be clamped away.
fn tanh_(x: f32) -> f32 { return select(tanh(clamp(x, -20.0, 20.0)), x, isnan_(x)); }

// -- Python's floor division and modulo: the quotient rounds toward -inf, the remainder takes the
// divisor's sign. Integers run on magnitudes in u32 with the signs fixed by selects: WGSL's
// signed / and % (OpSDiv / OpSRem behind Naga's guards for zero and INT_MIN / -1) gave wrong
// results on a real GPU. The host raises on a zero divisor before launching; mapping it to 1
// here only keeps the kernel defined. INT_MIN // -1 wraps to INT_MIN, as in PyTorch.
fn mag_(x: i32) -> u32 { let u = bitcast<u32>(x); return select(u, 0u - u, x < 0); }
fn floordiv_i32(a: i32, b: i32) -> i32 {
  let ua = mag_(a);
  let ub = max(mag_(b), 1u);
  let q = ua / ub;
  let r = ua - q * ub;
  let up = q + select(0u, 1u, r != 0u);  // |floor| when the signs differ
  return bitcast<i32>(select(q, 0u - up, (a < 0) != (b < 0)));
}
fn mod_i32(a: i32, b: i32) -> i32 {
  let ub = max(mag_(b), 1u);
  let r = mag_(a) % ub;
  let m = select(r, ub - r, r != 0u && ((a < 0) != (b < 0)));
  return bitcast<i32>(select(m, 0u - m, b < 0));
}
// Floats: NumPy's and PyTorch's divmod (the quotient from fmod: a // b * b + a % b == a).
// fmod by long division: subtract the largest b * 2^k that fits, bit by bit of the quotient.
// Every step is exact (d >= r / 2, Sterbenz), so the remainder is exact for any magnitudes;
// at most ~280 steps (max % tiny), a few for usual operands.
fn fmod_(a: f32, b: f32) -> f32 {
  if (isnan_(a) || isnan_(b) || isinf_(a) || b == 0.0) { return nan_like(a + b); }
  if (isinf_(b)) { return a; }
  let ab = abs(b);
  let eb = frexp(ab).exp;
  var r = abs(a);
  for (var i = 0; i < 300 && r >= ab; i = i + 1) {
    var d = ldexp(ab, frexp(r).exp - eb);  // ab moved into r's binade: r / 2 < d < 2 r
    if (d > r) { d = d * 0.5; }
    r = r - d;
  }
  return select(r, -r, signbit_(a));
}
fn mod_f32(a: f32, b: f32) -> f32 {
  let m = fmod_(a, b);
  if (isnan_(m) || isnan_(b)) { return nan_like(m); }
  if (m == 0.0) { return select(0.0, -0.0, signbit_(b)); }  // a zero remainder takes b's sign too
  return select(m, m + b, (b < 0.0) != (m < 0.0));
}
fn floordiv_f32(a: f32, b: f32) -> f32 {
  if (isnan_(a) || isnan_(b)) { return nan_like(a + b); }
  if (b == 0.0) { return div_(a, b); }
  let m = fmod_(a, b);
  if (isnan_(m)) { return m; }
  var d = div_(a - m, b);
  if (!(m == 0.0) && ((b < 0.0) != (m < 0.0))) { d = d - 1.0; }
  if (d == 0.0) { return select(0.0, -0.0, signbit_(a) != signbit_(b)); }
  let f = floor(d);
  return select(f, f + 1.0, d - f > 0.5);
}

// -- rounding (PyTorch's round is half to even, as WGSL's): NaN and infinities pass through, and
// an integer is its own rounding. The gradient is zero everywhere, as PyTorch's (zero_).
fn round_f32(x: f32) -> f32 { return select(round(x), x, isnan_(x) || isinf_(x)); }
fn floor_f32(x: f32) -> f32 { return select(floor(x), x, isnan_(x) || isinf_(x)); }
fn ceil_f32(x: f32) -> f32 { return select(ceil(x), x, isnan_(x) || isinf_(x)); }
fn trunc_f32(x: f32) -> f32 { return select(trunc(x), x, isnan_(x) || isinf_(x)); }
fn round_i32(x: i32) -> i32 { return x; }
fn floor_i32(x: i32) -> i32 { return x; }
fn ceil_i32(x: i32) -> i32 { return x; }
fn trunc_i32(x: i32) -> i32 { return x; }
fn zero_(g: f32) -> f32 { return 0.0; }

// -- classification (bool results; an integer is always finite) ---------------------------------
fn isnan_f32(x: f32) -> bool { return isnan_(x); }
fn isinf_f32(x: f32) -> bool { return isinf_(x); }
fn isfinite_f32(x: f32) -> bool { return !isnan_(x) && !isinf_(x); }
fn isnan_i32(x: i32) -> bool { return false; }
fn isinf_i32(x: i32) -> bool { return false; }
fn isfinite_i32(x: i32) -> bool { return true; }

// -- more transcendental functions: NaN in, NaN out; outside the domain NaN (WGSL leaves asin(2)
// undefined), poles and overflow as in C. --------------------------------------------------------
fn atan_(x: f32) -> f32 {
  if (isinf_(x)) { return select(1.5707963267948966, -1.5707963267948966, x < 0.0); }
  return select(atan(x), x, isnan_(x));
}
// asin and acos through atan (lavapipe's asin(0.5) was off by 2e-4); (1 - x) is exact near |x| = 1.
fn asin_(x: f32) -> f32 {
  if (isnan_(x) || abs(x) > 1.0) { return nan_like(x); }
  return atan_(div_(x, sqrt((1.0 - x) * (1.0 + x))));
}
fn acos_(x: f32) -> f32 {
  if (isnan_(x) || abs(x) > 1.0) { return nan_like(x); }
  return 2.0 * atan_(sqrt(div_(1.0 - x, 1.0 + x)));
}
// exp(x) - 1, accurate for small x (the rounding of exp(x) divides out, as in log1p_).
fn expm1_(x: f32) -> f32 {
  if (isnan_(x)) { return x; }
  if (x > 88.72284) { return abs(inf_like(x)); }
  if (x < -17.0) { return -1.0; }  // exp(-17) is below half an ulp of 1
  let u = exp(x);
  if (u == 1.0) { return x; }
  let um = u - 1.0;
  return um * (x / log(u));
}
// log(1 + x) over its whole domain (log1p_, which softplus_ calls, takes only x > -1 and finite x).
fn log1p_full_(x: f32) -> f32 {
  if (isnan_(x) || x < -1.0) { return nan_like(x); }
  if (x == -1.0) { return -abs(inf_like(x)); }
  if (isinf_(x)) { return x; }
  return log1p_(x);
}
fn log2_(x: f32) -> f32 {
  if (isnan_(x) || x < 0.0) { return nan_like(x); }
  if (x == 0.0) { return -abs(inf_like(x)); }
  return log2(x);
}
fn log10_(x: f32) -> f32 { return log_(x) * 0.4342944819032518; }
fn exp2_(x: f32) -> f32 {
  if (isnan_(x)) { return x; }
  if (x >= 128.0) { return abs(inf_like(x)); }
  if (x < -150.0) { return 0.0; }
  return exp2(x);
}
// sinh and cosh from expm1_ for |x| < 1 (no cancellation near 0); above 88.7, exp(|x| / 2) squared,
// so values up to f32's maximum do not overflow early.
fn sinh_(x: f32) -> f32 {
  if (isnan_(x) || isinf_(x)) { return x; }
  let a = abs(x);
  var r: f32;
  if (a < 1.0) {
    let e = expm1_(a);
    r = 0.5 * (e + e / (e + 1.0));
  } else if (a < 88.0) {
    let e = exp(a);
    r = 0.5 * (e - 1.0 / e);
  } else {
    let h = exp(0.5 * a);
    r = (0.5 * h) * h;
  }
  return select(r, -r, x < 0.0);
}
fn cosh_(x: f32) -> f32 {
  if (isnan_(x)) { return x; }
  let a = abs(x);
  if (a < 88.0) {
    let e = exp(a);
    return 0.5 * (e + 1.0 / e);
  }
  let h = exp(0.5 * a);
  return (0.5 * h) * h;
}

// -- sin, cos, tan: exact argument reduction, never the driver's (lavapipe's sin(FLT_MAX) is +-1, the
// truth about 0.52). |x| <= pi/4 needs none. Beyond, x = m 2^e (m the 24-bit significand) is reduced
// by Payne-Hanek in u32 arithmetic: x * 2/pi mod 4 needs only the bits of 2/pi from 2^-(e-1) on
// (earlier ones give multiples of 4), so 96 of them times m, kept mod 2^96, hold the quadrant in the
// top 2 bits and 94 bits of fraction: at least 64 survive the closest approach of a float32 to a
// multiple of pi/2. The fraction (in [-1/2, 1/2) of a quadrant) times pi/2 is r in [-pi/4, pi/4],
// where minimax polynomials (musl's __sindf / __cosdf) give sin and cos within an ulp.
struct Trig { q: u32, r: f32 }

// a * b as (high, low) words.
fn mul_wide_(a: u32, b: u32) -> vec2<u32> {
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0;
  let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return vec2<u32>(a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u), (p00 & 0xffffu) | (mid << 16u));
}

// |x| reduced: a finite a >= 0 as q * pi/2 + r, |r| <= pi/4.
fn trig_reduce_(a: f32) -> Trig {
  if (a <= 0.78539816) { return Trig(0u, a); }
  // 2/pi in words from bit 2^-1 on, after a zero word that stands for bits 2^0 .. 2^-31 (windows of
  // small arguments start before the binary point).
  var t = array<u32, 11>(0u, 0xA2F9836Eu, 0x4E441529u, 0xFC2757D1u, 0xF534DDC0u, 0xDB629599u, 0x3C439041u,
                         0xFE5163ABu, 0xDEBBC561u, 0xB7246E3Au, 0x424DD2E0u);
  let bits = bitcast<u32>(a);
  let m = (bits & 0x7fffffu) | 0x800000u;
  let e = i32(bits >> 23u) - 150;  // a = m 2^e, e >= -24 here
  let g0 = u32(e + 30);  // the window's first bit (2^-(e-1)) counted from the table's start
  let q0 = g0 / 32u;
  let s = g0 % 32u;
  var w: array<u32, 3>;
  for (var j = 0u; j < 3u; j = j + 1u) {
    w[j] = (t[q0 + j] << s) | select(0u, t[q0 + j + 1u] >> (32u - s), s != 0u);
  }
  // m * window mod 2^96, as words p2 (high) .. p0.
  let lo = mul_wide_(m, w[2]);
  let mid = mul_wide_(m, w[1]);
  let p0 = lo.y;
  let p1 = lo.x + mid.y;
  let p2 = mid.x + m * w[0] + select(0u, 1u, p1 < lo.x);
  var q = p2 >> 30u;
  var hi = (p2 << 2u) | (p1 >> 30u);  // the fraction's top 64 bits: hi, then lo32
  var lo32 = (p1 << 2u) | (p0 >> 30u);
  let up = hi >= 0x80000000u;  // fraction >= 1/2: the next quadrant, r negative
  if (up) {
    q = q + 1u;
    hi = ~hi + select(0u, 1u, lo32 == 0u);
    lo32 = 0u - lo32;
  }
  var shift = 0;
  if (hi == 0u) { hi = lo32; lo32 = 0u; shift = 32; }
  let z = countLeadingZeros(hi);
  let top = (hi << z) | select(0u, lo32 >> (32u - z), z != 0u);
  let f = ldexp(f32(top), -(32 + shift + i32(z)));
  let r = f * 1.5707963267948966;
  return Trig(q & 3u, select(r, -r, up));
}

fn sin_kernel_(r: f32) -> f32 {
  let z = r * r;
  let p = 0.0083333293858894631756 + z * (-0.000198393348360966317347 + z * 0.0000027183114939898219064);
  return r + r * z * (-0.166666666416265235595 + z * p);
}

fn cos_kernel_(r: f32) -> f32 {
  let z = r * r;
  let w = z * z;
  let p = -0.00138867637746099294692 + z * 0.0000243904487962774090654;
  return ((1.0 - 0.499999997251031003120 * z) + w * 0.0416666233237390631894) + (w * z) * p;
}

fn sin_(x: f32) -> f32 {
  if (isnan_(x) || isinf_(x)) { return nan_like(x); }
  let t = trig_reduce_(abs(x));
  let s = select(sin_kernel_(t.r), cos_kernel_(t.r), (t.q & 1u) == 1u);
  return select(s, -s, (t.q >= 2u) != signbit_(x));
}

fn cos_(x: f32) -> f32 {
  if (isnan_(x) || isinf_(x)) { return nan_like(x); }
  let t = trig_reduce_(abs(x));
  let c = select(cos_kernel_(t.r), sin_kernel_(t.r), (t.q & 1u) == 1u);
  return select(c, -c, t.q == 1u || t.q == 2u);
}

fn tan_(x: f32) -> f32 {
  if (isnan_(x) || isinf_(x)) { return nan_like(x); }
  let t = trig_reduce_(abs(x));
  let s = sin_kernel_(t.r);
  let c = cos_kernel_(t.r);
  let v = select(s / c, -c / s, (t.q & 1u) == 1u);
  return select(v, -v, signbit_(x));
}

// -- shifts (int32; bool is refused on the host): PyTorch's rule for amounts outside [0, 32), where
// WGSL would take the amount mod 32: << gives 0, >> the sign (0 or -1). On the bits in u32, so a
// left shift wraps as it does in NumPy and PyTorch.
fn shl_i32(a: i32, b: i32) -> i32 {
  return select(0, bitcast<i32>(bitcast<u32>(a) << u32(b & 31)), b >= 0 && b < 32);
}
fn shr_i32(a: i32, b: i32) -> i32 { return a >> u32(select(31, b, b >= 0 && b < 32)); }

// -- atan2: never the driver's (Vulkan allows atan2 4096 ulp, and leaves zeros and infinities to it).
// atan on [0, 1]: above tan(pi/8), atan(t) = pi/4 + atan((t - 1) / (t + 1)); on |u| <= tan(pi/8) an odd
// polynomial u + u^3 P(u^2) (a least-squares fit, relative error 1.2e-9). pi/4, pi/2 and pi are
// rounded constants plus their rounding error (hi + lo), so the quadrant fixes cost under an ulp.
fn atan01_(t: f32) -> f32 {
  var u = t;
  var base = 0.0;
  var lo = 0.0;
  if (t > 0.41421356) {
    u = (t - 1.0) / (t + 1.0);
    base = 0.78539818525;
    lo = -2.1855695e-8;
  }
  let z = u * u;
  let p = -0.33333316445 + z * (0.19998547435 + z * (-0.14244779944 + z * (0.10602048039 + z * -0.06097184494)));
  return base + (lo + (u + u * z * p));
}
fn atan2_(y: f32, x: f32) -> f32 {
  if (isnan_(y) || isnan_(x)) { return nan_like(y + x); }
  let ay = abs(y);
  let ax = abs(x);
  var r = 0.0;  // both zero: +-0 or +-pi by the signs, as C's atan2
  if (isinf_(y) && isinf_(x)) {
    r = 0.78539816339744831;
  } else if (ay > ax) {
    r = (1.57079637051 - atan01_(div_(ax, ay))) - 4.371139e-8;
  } else if (ax > 0.0) {
    r = atan01_(div_(ay, ax));
  }
  if (signbit_(x)) { r = (3.14159274101 - r) - 8.742278e-8; }
  return select(r, -r, signbit_(y));
}

// -- erf, erfc, erfinv: never through the driver's exp at large arguments (Vulkan allows exp
// 3 + 2|x| ulp, and a compiler may reassociate a float Cody-Waite reduction). exp_neg_(x, w, m) is
// m exp(w - x) for an exact x in [0.25, 105) with at most 24 significant bits, |w| < 2, m in (0, 1]:
// x log2(e) = K + F in fixed point (x's significand times log2(e) 2^31 as a 56-bit product, exact
// but the constant's 2e-10), so only the small v = w - F ln 2 meets float rounding; exp(v) is
// 2^j exp(v - j ln 2) by the Taylor series to r^7 (error 6e-9 on |r| <= 0.35). One ldexp at the
// end, which may flush a subnormal result to 0, as GPUs do.
fn exp_neg_(x: f32, w: f32, m: f32) -> f32 {
  let bits = bitcast<u32>(x);
  let sh = 149u - (bits >> 23u);  // x = mant 2^e: the product's binary point is bit 31 - e = 32 + sh
  let mant = (bits & 0x7fffffu) | 0x800000u;
  let p = mul_wide_(mant, 0xB8AA3B29u);  // log2(e) 2^31, rounded
  var k = i32(p.x >> sh);
  var f = ldexp(f32(p.x & ((1u << sh) - 1u)), -i32(sh)) + ldexp(f32(p.y), -32 - i32(sh));
  if (f > 0.5) { k = k + 1; f = f - 1.0; }
  let v = w - f * 0.6931471805599453;
  let j = round(v * 1.4426950408889634);
  let r = (v - j * 0.693145751953125) - j * 1.4286067653302e-6;
  let q = 1.0 + r * (1.0 + r * (0.5 + r * (0.16666667 + r * (0.041666668 + r * (0.008333334 +
          r * (0.0013888889 + r * 0.0001984127))))));
  return ldexp(m * q, i32(j) - k);
}
// erf(x) / x for |x| <= 0.5: its Taylor series in x^2, to x^14 (relative error 6e-8, the rounding of 2 / sqrt(pi)).
fn erf_small_(x: f32) -> f32 {
  let z = x * x;
  return x * (1.1283791671 + z * (-0.37612638903 + z * (0.11283791671 + z * (-0.02686617064 + z * (0.00522397762 +
         z * (-0.00085483270 + z * (0.00012055332 + z * -0.00001492565)))))));
}
// erfc(z) for z >= 0.5: t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), P the Chebyshev fit of Numerical Recipes'
// erfcc (relative error 1.1e-7). z^2 as hi^2 (hi: z's top 12 bits, squared exactly) plus (z - hi)(z + hi).
fn erfc_pos_(z: f32) -> f32 {
  if (z > 10.1) { return 0.0; }  // erfc(10.06) is below the smallest subnormal float32
  let t = 1.0 / (1.0 + 0.5 * z);
  let p = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 +
          t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
  let hi = bitcast<f32>(bitcast<u32>(z) & 0xfffff000u);
  return exp_neg_(hi * hi, p - (z - hi) * (z + hi), t);
}
fn erf_full_(x: f32) -> f32 {
  if (isnan_(x)) { return x; }
  let a = abs(x);
  if (a <= 0.5) { return erf_small_(x); }
  let r = 1.0 - erfc_pos_(a);  // erfc(0.5) = 0.48: at most a bit lost
  return select(r, -r, x < 0.0);
}
fn erfc_(x: f32) -> f32 {
  if (isnan_(x)) { return x; }
  if (abs(x) <= 0.5) { return 1.0 - erf_small_(x); }
  let r = erfc_pos_(abs(x));
  return select(r, 2.0 - r, x < 0.0);
}
// erfinv: a closed-form start (Winitzki's, relative error 2e-3; a * sqrt(pi) / 2 for tiny a, where
// 1 - a^2 rounds to 1), then three Newton steps on erf(x) = a, written (1 - a) - erfc(x) = 0 from
// a = 0.5 on (1 - a is exact there, so the steps keep their accuracy up to 1).
fn erfinv_(y: f32) -> f32 {
  let a = abs(y);
  if (isnan_(y) || a > 1.0) { return nan_like(y); }
  if (a == 1.0) { return inf_like(y); }
  let w = log((1.0 - a) * (1.0 + a));
  let c = 4.3307467508 + 0.5 * w;  // 2 / (pi 0.147) + ln(1 - a^2) / 2
  var x = select(sqrt(max(sqrt(c * c - w / 0.147) - c, 0.0)), a * 0.88622692545, a < 0.001);
  for (var i = 0; i < 3; i = i + 1) {
    let f = select(erf_full_(x) - a, (1.0 - a) - erfc_(x), a >= 0.5);
    x = x - f / (1.1283791671 * exp(-(x * x)));
  }
  return select(x, -x, signbit_(y));
}
