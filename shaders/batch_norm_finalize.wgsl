// Batch norm's per-channel coefficients, one thread per channel, from the partial sums of
// batch_norm_sums.wgsl ([C, 2, groups] each: a channel's parts are summed here, in order, so the
// mean equals the one the second statistics pass computed from the same parts).
// MODE 0 (training forward): pa = parts of sum x, pb = parts of sum (x - m)^2 and sum x - m. Writes
//   st [6, C] rows: mean m, shift (mean of x - m), biased variance, invstd, scale = invstd * weight,
//   offset = bias - shift * scale; updates the running statistics rm, rv (float32) in place when
//   present: running += (value - running) * momentum, the variance unbiased.
// MODE 1 (running statistics): pa = running mean, pb = running variance (float32 [C]); the same rows,
//   shift 0.
// MODE 2 (gradient): pa = parts of sum g and sum g * (x - m), pb = the forward's st. Writes the weight
//   and bias gradients to gw and gb (buffers of their own, through GRADS) and st [2, C] rows: the input
//   gradient's k2 (factor of x - m) and k3 (constant): gx = g * scale + (x - m) * k2 + k3 (with batch
//   statistics; k2 = k3 = 0 without).
// Bindings and Params are declared in wgpar/ops/batch_norm.py; wt, bs, rm, rv, gw, gb are left out when absent.

const MODE: u32 = {{MODE}};

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let ch = gid.x;
  if (ch >= p.c) { return; }
  let c = p.c;
  if (MODE == 2u) {
    var sg = 0.0;
    var sgx = 0.0;
    for (var g = 0u; g < p.g1; g = g + 1u) {
      sg = sg + pa[2u * ch * p.g1 + g];
      sgx = sgx + pa[(2u * ch + 1u) * p.g1 + g];
    }
    let shift = pb[c + ch];
    let invstd = pb[3u * c + ch];
    let scale = pb[4u * c + ch];
    sgx = sgx - sg * shift;  // sum g * (x - m - shift)
    {{GRADS}}
    var k2 = 0.0;
    var k3 = 0.0;
    if (p.batch != 0u) {
      k2 = scale * invstd * invstd * (sgx * -p.inv);
      k3 = scale * (sg * -p.inv) - shift * k2;
    }
    st[ch] = k2;
    st[c + ch] = k3;
    return;
  }
  var m = 0.0;
  var shift = 0.0;
  var v = 0.0;
  if (MODE == 0u) {
    var s = 0.0;
    for (var g = 0u; g < p.g1; g = g + 1u) { s = s + pa[2u * ch * p.g1 + g]; }
    m = s * p.inv;
    var q = 0.0;
    var d = 0.0;
    for (var g = 0u; g < p.g2; g = g + 1u) {
      q = q + pb[2u * ch * p.g2 + g];
      d = d + pb[(2u * ch + 1u) * p.g2 + g];
    }
    shift = d * p.inv;
    v = max(q * p.inv - shift * shift, 0.0);
  } else {
    m = pa[ch];
    v = pb[ch];
  }
  let invstd = 1.0 / sqrt(v + p.eps);
  let scale = invstd * {{WEIGHT}};
  st[ch] = m;
  st[c + ch] = shift;
  st[2u * c + ch] = v;
  st[3u * c + ch] = invstd;
  st[4u * c + ch] = scale;
  st[5u * c + ch] = {{BIAS}} - shift * scale;
  {{RUNNING}}
}
