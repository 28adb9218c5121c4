// First pass of clip_grad_norm_: each workgroup folds one chunk of one gradient
// into a partial (sum of |g|^ord, or max |g| for the inf-norm) at partial[base + w].
// The host fills TERM (|g| -> its contribution, from a) and
// JOIN (how two contributions combine, x and y). Bindings (partial, grad) and Params are
// declared with the kernel in Python (wgpar/ops/norm.py).

var<workgroup> red: array<f32, WG>;

{{FNS}}

fn join(x: f32, y: f32) -> f32 { return {{JOIN}}; }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let w = wid.x + wid.y * nwg.x;
  let start = w * p.chunk;
  let end = min(p.numel, start + p.chunk);
  var acc = 0.0;
  for (var i = start + lid; i < end; i = i + WG) {
    let a = abs(f32(grad[p.off_g + i]));
    acc = join(acc, {{TERM}});
  }
  red[lid] = acc;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (lid < s) { red[lid] = join(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  if (lid == 0u && start < p.numel) { partial[p.base + w] = red[0]; }
}
