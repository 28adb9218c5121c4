// Row reduction of a contiguous [rows, cols] block: L lanes (a power of two dividing WG) reduce one
// chunk of one row, so a workgroup takes WG / L chunks (chunks let a few long rows use many
// workgroups; a second pass reduces the per-chunk partials; short rows take fewer lanes, several
// rows a workgroup, rather than one workgroup of mostly idle threads each). Bindings (out, x) and
// Params are declared in wgpar/ops/reduce.py. The host fills C (compute type), O (the output's
// storage type), INIT, COMBINE (folds v at column c into acc/ai), FINAL, and LOOP: one element per
// step, or (cols, offset and chunk multiples of 4; x an array of vec4) one vec4.

var<workgroup> sv: array<{{C}}, WG>;
var<workgroup> si: array<i32, WG>;

{{FNS}}

fn fold(acc: ptr<function, {{C}}>, ai: ptr<function, i32>, v: {{C}}, c: i32) {
  {{COMBINE}}
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let w = (wid.x + wid.y * nwg.x) * (WG / L) + lid / L;  // this lane's chunk
  let lane = lid % L;
  let row = w / p.groups;
  let g = w % p.groups;
  let live = row < p.rows;
  let start = g * p.chunk;
  let end = min(p.cols, start + p.chunk);
  var acc: {{C}} = {{INIT}};
  var ai: i32 = 2147483647;
  if (live) {
{{LOOP}}
  }
  sv[lid] = acc;
  si[lid] = ai;
  workgroupBarrier();
  for (var s = L / 2u; s > 0u; s = s >> 1u) {
    if (lane < s) {
      var a = sv[lid];
      var i = si[lid];
      fold(&a, &i, sv[lid + s], si[lid + s]);
      sv[lid] = a;
      si[lid] = i;
    }
    workgroupBarrier();
  }
  if (lane == 0u && live) {
    let acc0 = sv[lid];
    let ai0 = si[lid];
    out[w] = {{O}}({{FINAL}});
  }
}
