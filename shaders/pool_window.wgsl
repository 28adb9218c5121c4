// Shared by the pooling forwards' window kernels (avg_pool2d, max_pool2d with WINDOW), pasted in as their
// AT fill after the window's constants (WINDOW, KH, KW, SH, SW, DH, DW, PAD: wgpar/ops/pool.py `_at`).
// window_at: where thread gid's output lies. No index takes an integer division by a size (the general
// kernels' three divisions and run-time loops: 23.1 against 14.7 us for average pooling 2x2 over
// 32x256x28x28 on an H100): a workgroup row x walks p.pp planes' positions (several small planes, so that
// few threads idle), y and z the rows of planes, and the plane and the output row come from float
// reciprocals, exact below 2^22 (wgpar/ops/pool.py `_window_grid` checks). ok is false for threads past the
// output; o is the output's index, base its plane's first input element, (h0, w0) its window's first tap.
struct WindowAt {
  oh: u32,
  ow: u32,
  o: u32,
  base: u32,
  h0: i32,
  w0: i32,
  ok: bool,
}

fn window_at(gid: vec3<u32>, nwg: vec3<u32>) -> WindowAt {
  let local = gid.x;
  let sub = u32((f32(local) + 0.5) * p.inv_positions);
  let plane = (gid.y + gid.z * nwg.y) * p.pp + sub;
  let pos = local - sub * p.positions;
  let oh = u32((f32(pos) + 0.5) * p.inv_ow);
  let ow = pos - oh * p.ow;
  return WindowAt(oh, ow, plane * p.positions + pos, p.off_x + plane * p.h * p.w, i32(oh * SH) - i32(p.ph),
                  i32(ow * SW) - i32(p.pw), sub < p.pp && plane < p.planes);
}

// Whether tap (h, w) lies inside the input: always, unless some window leaves it (PAD).
fn tap_inside(h: i32, w: i32) -> bool {
  return !PAD || (h >= 0 && h < i32(p.h) && w >= 0 && w < i32(p.w));
}
