// Shared by the pooling input gradients (max_pool2d_bwd, avg_pool2d, adaptive_avg_pool2d), pasted in as
// their STORE fill: a thread's VEC consecutive elements of one input row, from column w0 at index at,
// stored into out where they lie inside the row.
fn store_row(at: u32, w0: u32, v: vec4<f32>) {
  out[at] = {{T}}(v.x);
  if (VEC > 1u) {
    if (w0 + 1u < p.w) { out[at + 1u] = {{T}}(v.y); }
    if (w0 + 2u < p.w) { out[at + 2u] = {{T}}(v.z); }
    if (w0 + 3u < p.w) { out[at + 3u] = {{T}}(v.w); }
  }
}
