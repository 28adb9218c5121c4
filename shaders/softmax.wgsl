// softmax / log_softmax over the rows of a contiguous [rows, cols] block, one
// workgroup per row: max, then sum of exp(x - max), then the write. LOG picks
// log_softmax (x - max - log(sum)), which stays finite where softmax underflows.
{{F16}}
@group(0) @binding(0) var<storage, read_write> y: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
struct Params { rows: u32, cols: u32, off_x: u32, off_y: u32 }
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> red: array<f32, 256>;

fn reduce_max(lid: u32) -> f32 {
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  return red[0];
}

fn reduce_sum(lid: u32) -> f32 {
  for (var s = 128u; s > 0u; s = s >> 1u) {
    if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
    workgroupBarrier();
  }
  return red[0];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let row = wid.x + wid.y * nwg.x;
  let live = row < p.rows;
  let bx = p.off_x + row * p.cols;
  let by = p.off_y + row * p.cols;
  var m = bitcast<f32>(0xff800000u);
  if (live) {
    for (var c = lid; c < p.cols; c = c + 256u) { m = max(m, f32(x[bx + c])); }
  }
  red[lid] = m;
  workgroupBarrier();
  let row_max = reduce_max(lid);
  workgroupBarrier();
  var s = 0.0;
  if (live) {
    for (var c = lid; c < p.cols; c = c + 256u) { s = s + exp(f32(x[bx + c]) - row_max); }
  }
  red[lid] = s;
  workgroupBarrier();
  let total = reduce_sum(lid);
  if (live) {
    let lse = log(total);
    let inv = 1.0 / total;
    for (var c = lid; c < p.cols; c = c + 256u) {
      let z = f32(x[bx + c]) - row_max;
      y[by + c] = {{T}}(select(exp(z) * inv, z - lse, {{LOG}}));
    }
  }
}
