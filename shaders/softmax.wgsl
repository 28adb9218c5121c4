// softmax / log_softmax over the rows of a contiguous [rows, cols] block, one
// workgroup per row. Pass 1 keeps a running (max, sum of exp(x - max)) per thread,
// rescaling the sum when the max grows, and the workgroup merges the pairs; pass 2
// reads the row again (from cache) and writes. LOG picks log_softmax
// (x - max - log(sum)), which stays finite where softmax underflows. With W = 4
// (cols and offsets multiples of 4) X is vec4<T> and each step moves 4 elements.
// A row holding a NaN or +inf, or only -inf, comes out all NaN, as in PyTorch (inf - inf):
// that is decided by a flag, not left to exp(NaN), which some drivers return as a number.
// Bindings (y, x: arrays of X) and Params (offsets in elements) are declared in wgpar/ops/reduce.py.

{{MERGE}}

{{FNS}}
// A NaN or +inf entry makes the whole row NaN.
fn bad1(x: f32) -> bool { return isnan_(x) || bitcast<u32>(x) == 0x7f800000u; }
fn bad4(v: vec4<f32>) -> bool { return bad1(v.x) || bad1(v.y) || bad1(v.z) || bad1(v.w); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let row = wid.x + wid.y * nwg.x;
  let live = row < p.rows;
  let bx = (p.off_x + row * p.cols) / W;
  let by = (p.off_y + row * p.cols) / W;
  let n = p.cols / W;
  let neg_inf = bitcast<f32>(0xff800000u);  // a running max that saw nothing
  var m = neg_inf;
  var s = 0.0;
  var bad = false;
  if (live) {
    for (var c = lid; c < n; c = c + WG) {
      let v = {{F}}(x[bx + c]);
      if ({{BAD}}) { bad = true; continue; }
      let mx = {{HMAX}};
      if (mx > m) { s = s * exp(m - mx); m = mx; }
      if (m > neg_inf) { s = s + {{HSUM}}; }
    }
  }
  merge_stats(lid, WG, m, s, bad);
  let row_max = rm[0];
  let total = rs[0];
  let nan_row = rbad[0] != 0u || !(row_max > neg_inf);  // NaN / +inf seen, or only -inf
  if (live && nan_row) {
    let qnan = nan_like(row_max);
    for (var c = lid; c < n; c = c + WG) { y[by + c] = {{X}}({{F}}(qnan)); }
  } else if (live) {
    let lse = log(total);
    let inv = 1.0 / total;
    for (var c = lid; c < n; c = c + WG) {
      let z = {{F}}(x[bx + c]) - row_max;
      y[by + c] = {{X}}(select(exp(z) * inv, z - lse, {{LOG}}));
    }
  }
}
