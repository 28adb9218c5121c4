// Stream compaction for nonzero and mask indexing: every position i whose mask entry is set writes
// itself to out[pos[i] - 1], pos being the mask's inclusive running count (ops/scan.py), so the
// positions land in order. Bindings (out, mask, pos) and Params are declared in wgpar/ops/mask.py.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  if (mask[p.off_m + i] != 0) { out[pos[i] - 1] = i32(i); }
}
