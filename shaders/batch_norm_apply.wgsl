// Batch norm's per-channel coefficients and the per-element map they define, in one dispatch over
// contiguous [N, C, inner] tensors: one workgroup per chunk of one channel, as batch_norm_sums.wgsl's.
// The first thread of every workgroup computes its channel's coefficients (each workgroup of a
// channel the same way, in the same order, so they agree), the channel's chunk-0 workgroup also
// writes what outlives the dispatch, then every thread maps its elements: {{BODY}}, over k1, k2, k3,
// m and the element's index at.
// MODE 0 (training forward): from batch_norm_sums.wgsl's statistics parts (part(i), [C, 3, groups]:
//   the chunk's mean m_k, sum x - m_k, sum (x - m_k)^2), the chunks combined about m = sum n_k m_k / M
//   (Chan et al.): shift = mean(x - m) (the float32 mean's rounding error), the biased variance about
//   m + shift, invstd, scale = invstd * weight; y = (x - m) * scale + (bias - shift * scale). Chunk 0
//   writes the st rows (mean, shift, variance, invstd, scale: {{STORE}}) and updates the running
//   statistics in place ({{RUNNING}}: running += (value - running) * factor, the variance unbiased).
// MODE 1 (the running statistics normalise): m and the variance are theirs ({{RMEAN}}, {{RVAR}}: em
//   and ev, bound read-only), shift 0; the same map and st rows (when backward needs them).
// MODE 2 (backward): from the gradient parts ([C, 2, groups]: sum g, sum g (x - m); zero when there
//   are none) and the forward's st rows (stat(r, ch)): the weight and bias gradients ({{GRADS}},
//   chunk 0) and the input gradient gx = g * scale + (x - m) * k2 + k3 (k2 = k3 = 0 unless p.batch:
//   the statistics were x's own, whose dependence on x brings the two corrections).
// Bindings (those unused left out) and Params are declared in wgpar/ops/batch_norm.py.

const MODE: u32 = {{MODE}};

var<workgroup> co: array<f32, 4>;  // k1, k2, k3, m

fn part(i: u32) -> f32 {
  return {{PART}};
}

fn stat(r: u32, ch: u32) -> f32 {
  return {{STAT}};
}

fn chunk_len(g: u32) -> f32 {
  return f32(min((g + 1u) * p.chunk, p.count) - g * p.chunk);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let flat = wid.x + wid.y * nwg.x;
  let live = flat < p.c * p.groups;
  let ch = flat / p.groups;
  let chunk = flat % p.groups;
  let gs = p.groups;
  if (live && lid == 0u) {
    let first = chunk == 0u;
    if (MODE == 2u) {
      var sg = 0.0;
      var sgx = 0.0;
      for (var g = 0u; g < gs; g = g + 1u) {
        sg = sg + part(2u * ch * gs + g);
        sgx = sgx + part((2u * ch + 1u) * gs + g);
      }
      let shift = stat(1u, ch);
      let invstd = stat(3u, ch);
      let scale = stat(4u, ch);
      sgx = sgx - sg * shift;  // sum g (x - m - shift)
      if (first) {
        {{GRADS}}
      }
      var k2 = 0.0;
      var k3 = 0.0;
      if (p.batch != 0u) {
        k2 = scale * invstd * invstd * (sgx * -p.inv);
        k3 = scale * (sg * -p.inv) - shift * k2;
      }
      co[0] = scale;
      co[1] = k2;
      co[2] = k3;
      co[3] = stat(0u, ch);
    } else {
      var m = 0.0;
      var shift = 0.0;
      var v = 0.0;
      if (MODE == 0u) {
        var s = 0.0;
        for (var g = 0u; g < gs; g = g + 1u) { s = s + chunk_len(g) * part(3u * ch * gs + g); }
        m = s * p.inv;
        var d = 0.0;
        var q = 0.0;
        for (var g = 0u; g < gs; g = g + 1u) {
          let e = part(3u * ch * gs + g) - m;
          let nk = chunk_len(g);
          let dk = part((3u * ch + 1u) * gs + g);
          d = d + dk + nk * e;  // sum over the chunk of x - m
          q = q + part((3u * ch + 2u) * gs + g) + e * (2.0 * dk + nk * e);  // of (x - m)^2
        }
        shift = d * p.inv;
        v = max(q * p.inv - shift * shift, 0.0);
      } else {
        m = {{RMEAN}};
        v = {{RVAR}};
      }
      let invstd = 1.0 / sqrt(v + p.eps);
      let scale = invstd * {{WEIGHT}};
      if (first) {
        {{STORE}}
        {{RUNNING}}
      }
      co[0] = 0.0;
      co[1] = scale;
      co[2] = {{BIAS}} - shift * scale;
      co[3] = m;
    }
  }
  workgroupBarrier();
  let k1 = co[0];
  let k2 = co[1];
  let k3 = co[2];
  let m = co[3];
  if (live) {
    let end = min((chunk + 1u) * p.chunk, p.count);
    for (var j = chunk * p.chunk + lid; j < end; j = j + WG) {
      let n = j / p.inner;
      let at = (n * p.c + ch) * p.inner + (j - n * p.inner);
      {{BODY}}
    }
  }
}
