// First pass of clip_grad_norm_: each workgroup folds one chunk of one gradient
// into a partial (sum of |g|^ord, or max |g| for the inf-norm) at partial[base + w].
// The host fills G (grad storage type), TERM (|g| -> its contribution, from a) and
// JOIN (how two contributions combine, x and y).
{{F16}}
@group(0) @binding(0) var<storage, read_write> partial: array<f32>;
@group(0) @binding(1) var<storage, read> grad: array<{{G}}>;
struct Params { numel: u32, off_g: u32, base: u32, chunk: u32, ord: f32, _p0: u32, _p1: u32, _p2: u32 }
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> red: array<f32, 256>;

{{FNS}}

fn join(x: f32, y: f32) -> f32 { return {{JOIN}}; }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let w = wid.x + wid.y * nwg.x;
  let start = w * p.chunk;
  let end = min(p.numel, start + p.chunk);
  var acc = 0.0;
  for (var i = start + lid; i < end; i = i + 256u) {
    let a = abs(f32(grad[p.off_g + i]));
    acc = join(acc, {{TERM}});
  }
  red[lid] = acc;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (lid < s) { red[lid] = join(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  if (lid == 0u && start < p.numel) { partial[p.base + w] = red[0]; }
}
