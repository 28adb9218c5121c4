// First pass of clip_grad_norm_: each workgroup folds one chunk of one gradient into a partial (sum
// of |g|^ord, or max |g| for the inf-norm) at partial[base + w], w the workgroup's index in the
// dispatch. A dispatch takes several gradients, one binding each (g0, g1, ...: wgpar/runtime/slots.py);
// gradient s holds p.n<s> elements from p.o<s>, in chunks of p.c<s>. SLOTS (generated there) folds the
// workgroup's chunk into acc. The host fills TERM (|g| -> its contribution, from a) and JOIN (how two
// contributions combine, x and y). Bindings and Params are declared with the kernel in Python
// (wgpar/ops/norm.py).

var<workgroup> red: array<f32, WG>;

{{FNS}}

fn join(x: f32, y: f32) -> f32 { return {{JOIN}}; }
fn term(a: f32) -> f32 { return {{TERM}}; }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let w = wid.x + wid.y * nwg.x;
  var acc = 0.0;
  var live = false;  // (workgroups past the last chunk write nothing)
  {{SLOTS}}
  red[lid] = acc;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (lid < s) { red[lid] = join(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  if (lid == 0u && live) { partial[p.base + w] = red[0]; }
}
