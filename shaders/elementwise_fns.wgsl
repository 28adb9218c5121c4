// Scalar helper functions shared by the elementwise kernels (elementwise.wgsl, elementwise_block.wgsl).

// NumPy's power: negative bases with integral exponents are defined.
fn fpow(a: f32, b: f32) -> f32 {
  if (b == 0.0) { return 1.0; }
  if (b == 2.0) { return a * a; }
  if (b == floor(b)) {
    let r = pow(abs(a), b);
    let odd = (abs(b) % 2.0) == 1.0;
    return select(r, -r, odd && a < 0.0);
  }
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

fn gelu_(x: f32) -> f32 { return 0.5 * x * (1.0 + erf_(x * 0.7071067811865476)); }
// GELU's derivative, for its backward.
fn gelu_grad_(x: f32) -> f32 {
  return 0.5 * (1.0 + erf_(x * 0.7071067811865476)) + x * 0.3989422804014327 * exp(-0.5 * x * x);
}
fn sigmoid_(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }
// Some drivers compute tanh as a ratio of exponentials that overflows to NaN.
fn tanh_(x: f32) -> f32 { return tanh(clamp(x, -20.0, 20.0)); }

// Python's floor division and modulo: the quotient rounds toward -inf, the remainder takes the
// divisor's sign. (WGSL's integer / and % truncate toward zero.)
fn floordiv_f32(a: f32, b: f32) -> f32 { return floor(a / b); }
fn mod_f32(a: f32, b: f32) -> f32 { return a - floor(a / b) * b; }
fn floordiv_i32(a: i32, b: i32) -> i32 {
  let q = a / b;
  return select(q, q - 1, (a % b != 0) && ((a < 0) != (b < 0)));
}
fn mod_i32(a: i32, b: i32) -> i32 {
  let r = a % b;
  return select(r, r + b, (r != 0) && ((r < 0) != (b < 0)));
}
