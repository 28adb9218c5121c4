// Edge-value helpers for f32, pasted into every kernel that must treat NaN and infinities
// exactly (elementwise ops, reductions, clip_grad_norm_).
//
// WGSL lets compilers assume that no NaN or infinity occurs: `x != x` may be folded to false
// (Mesa does so), and what max / min / clamp return for a NaN operand is left to the driver. So a
// NaN is recognised by its bits, and every op that must propagate one selects it explicitly.
// NaNs and infinities are built at run time from an operand's bits: a NaN or infinite constant
// is a shader-creation error in WGSL.

fn isnan_(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn isinf_(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn signbit_(x: f32) -> bool { return (bitcast<u32>(x) & 0x80000000u) != 0u; }
// A NaN (quiet) carrying x's sign.
fn nan_like(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) | 0x7fc00000u); }
// An infinity with x's sign.
fn inf_like(x: f32) -> f32 { return bitcast<f32>((bitcast<u32>(x) & 0x80000000u) | 0x7f800000u); }
// max / min that return a NaN operand (PyTorch's maximum / minimum, max / min reductions, clamp).
fn max_nan(a: f32, b: f32) -> f32 { return select(select(max(a, b), b, isnan_(b)), a, isnan_(a)); }
fn min_nan(a: f32, b: f32) -> f32 { return select(select(min(a, b), b, isnan_(b)), a, isnan_(a)); }
// True division with IEEE results for zero, infinite and huge divisors. Vulkan bounds a
// division's error only for |b| in [2^-126, 2^126]; a driver that divides as a * (1 / b) gets a
// subnormal 1 / b for a huge b, which may flush to zero (then max / max would be 0).
fn div_(a: f32, b: f32) -> f32 {
  if (isnan_(a) || isnan_(b)) { return nan_like(a + b); }
  if (isinf_(b)) {
    if (isinf_(a)) { return nan_like(a); }
    return select(0.0, -0.0, signbit_(a) != signbit_(b));
  }
  if (b == 0.0) {
    if (a == 0.0) { return nan_like(a); }
    return select(inf_like(a), -inf_like(a), signbit_(b));
  }
  if (abs(b) > 8.5070592e+37) { return (a * 0.25) / (b * 0.25); }  // 2^126
  return a / b;
}
