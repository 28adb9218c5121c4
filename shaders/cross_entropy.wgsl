// Fused log-softmax + negative log-likelihood over rows of contiguous logits
// [rows, classes] with int32 targets, one workgroup per row. BACKWARD=false
// writes each row's loss (logsumexp - x[target]); BACKWARD=true writes the
// gradient (softmax - onehot) * g / rows, g read from a device buffer so the
// backward needs no readback. Bindings (out: O, x, labels, gout) and Params are declared
// in wgpar/ops/loss.py.

const BACKWARD: bool = {{BACKWARD}};
var<workgroup> red: array<f32, WG>;
var<workgroup> rbad: array<u32, WG>;

{{FNS}}
// A NaN or +inf logit, or only -inf ones, make the row's loss and gradient NaN (PyTorch's
// log_softmax gives NaN there): decided by a flag, not left to exp(NaN) and max(NaN, x).
fn bad1(x: f32) -> bool { return isnan_(x) || bitcast<u32>(x) == 0x7f800000u; }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let row = wid.x + wid.y * nwg.x;
  let live = row < p.rows;
  let bx = p.off_x + row * p.cols;
  let neg_inf = bitcast<f32>(0xff800000u);
  var m = neg_inf;
  var bad = false;
  if (live) {
    for (var c = lid; c < p.cols; c = c + WG) {
      let v = f32(x[bx + c]);
      bad = bad || bad1(v);
      m = select(max(m, v), m, bad1(v));
    }
  }
  red[lid] = m;
  rbad[lid] = select(0u, 1u, bad);
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (lid < s) {
      red[lid] = max(red[lid], red[lid + s]);
      rbad[lid] = rbad[lid] | rbad[lid + s];
    }
    workgroupBarrier();
  }
  let row_max = red[0];
  let nan_row = rbad[0] != 0u || !(row_max > neg_inf);
  workgroupBarrier();
  var acc = 0.0;
  if (live) {
    for (var c = lid; c < p.cols; c = c + WG) { acc = acc + exp(f32(x[bx + c]) - row_max); }
  }
  red[lid] = acc;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
    workgroupBarrier();
  }
  let total = red[0];
  if (!live) { return; }
  let t = u32(labels[p.off_t + row]);
  let qnan = nan_like(row_max);
  if (BACKWARD) {
    let scale = f32(gout[p.off_g]) / f32(p.rows);
    for (var c = lid; c < p.cols; c = c + WG) {
      let sm = exp(f32(x[bx + c]) - row_max) / total;
      out[row * p.cols + c] = {{O}}(select((sm - select(0.0, 1.0, c == t)) * scale, qnan, nan_row));
    }
  } else if (lid == 0u) {
    out[row] = {{O}}(select(log(total) + row_max - f32(x[bx + t]), qnan, nan_row));
  }
}
