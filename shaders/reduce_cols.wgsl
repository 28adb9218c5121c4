// Reduction over the middle axis of a contiguous [outer, n, inner] block, in tiles: a workgroup takes
// TC neighbouring columns (A = vec4<C>: TC vec4s of them, `units` = inner / 4) of one slice of p.rows
// rows, TR row lanes deep. Lane (r, t) folds rows start + r, start + r + TR, ... of its column, four
// loads issued before their folds so they are in flight together; neighbouring lanes read neighbouring
// memory. The TR lanes of a column then fold in workgroup memory, in a fixed order (deterministic).
// With p.slices > 1 the output is the partials [outer, slices, inner], which a second dispatch
// (slices = 1) reduces; wgpar/ops/reduce.py (_col_plan) picks the tiles and slices and declares the
// bindings and Params. Fills as in reduce.wgsl, plus A (the accumulator type).

var<workgroup> sv: array<{{A}}, WG>;
var<workgroup> si: array<i32, WG>;

{{FNS}}

fn fold(acc: ptr<function, {{A}}>, ai: ptr<function, i32>, v: {{A}}, c: i32) {
  {{COMBINE}}
}

fn final_(acc0: {{A}}, ai0: i32) -> {{O}} {
  return {{O}}({{FINAL}});
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let w = wid.x + wid.y * nwg.x;
  let tile = w % p.tiles;
  let s = (w / p.tiles) % p.slices;
  let o = w / (p.tiles * p.slices);
  let t = lid % TC;
  let r = lid / TC;
  let k = tile * TC + t;
  let live = o < p.outer && k < p.units;
  let end = min(p.n, s * p.rows + p.rows);
  var acc: {{A}} = {{A}}({{INIT}});
  var ai: i32 = 2147483647;
  if (live) {
    let base = p.off + o * p.n * p.units + k;
    var c = s * p.rows + r;
    while (c + 3u * TR < end) {
      let v0 = {{A}}(x[base + c * p.units]);
      let v1 = {{A}}(x[base + (c + TR) * p.units]);
      let v2 = {{A}}(x[base + (c + 2u * TR) * p.units]);
      let v3 = {{A}}(x[base + (c + 3u * TR) * p.units]);
      fold(&acc, &ai, v0, i32(c));
      fold(&acc, &ai, v1, i32(c + TR));
      fold(&acc, &ai, v2, i32(c + 2u * TR));
      fold(&acc, &ai, v3, i32(c + 3u * TR));
      c = c + 4u * TR;
    }
    while (c < end) {
      fold(&acc, &ai, {{A}}(x[base + c * p.units]), i32(c));
      c = c + TR;
    }
  }
  sv[lid] = acc;
  si[lid] = ai;
  workgroupBarrier();
  for (var h = TR / 2u; h > 0u; h = h >> 1u) {
    if (r < h) {
      var a = sv[lid];
      var i = si[lid];
      fold(&a, &i, sv[lid + h * TC], si[lid + h * TC]);
      sv[lid] = a;
      si[lid] = i;
    }
    workgroupBarrier();
  }
  if (r == 0u && live) {
    out[(o * p.slices + s) * p.units + k] = final_(sv[lid], si[lid]);
  }
}
