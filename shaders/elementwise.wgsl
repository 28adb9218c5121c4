// Elementwise map over up to three operands (tensors or scalars) with NumPy
// broadcasting expressed as strides (0 along broadcast dims). The host fills:
//   BINDINGS  storage buffer declarations (bo = output, read_write)
//   INDEX     how element i maps to each operand's offset (contiguous or strided)
//   LOADS     let x0..x2 = operand values converted to their compute type
//   STORE/EXPR the op, converted to the output's storage type

{{BINDINGS}}

struct Params {
  numel: u32, ndim: u32, off_o: u32, off0: u32,
  off1: u32, off2: u32, _pad0: u32, _pad1: u32,
  sc: vec4<u32>,  // scalar operands: bit patterns in their compute type
  shape: array<vec4<u32>, 2>,
  str_o: array<vec4<i32>, 2>,
  str0: array<vec4<i32>, 2>,
  str1: array<vec4<i32>, 2>,
  str2: array<vec4<i32>, 2>,
}
@group(0) @binding({{PARAMS}}) var<uniform> p: Params;

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

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= p.numel) { return; }
{{INDEX}}
{{LOADS}}
  bo[io] = {{STORE}}({{EXPR}});
}
