// Last pass of clip_grad_norm_: multiply one gradient in place by the clip
// coefficient that optim_norm_final.wgsl left on the device at coef[off_c].
{{F16}}
@group(0) @binding(0) var<storage, read_write> grad: array<{{G}}>;
@group(0) @binding(1) var<storage, read> coef: array<f32>;
struct Params { numel: u32, off_g: u32, off_c: u32, _p0: u32 }
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= p.numel) { return; }
  grad[p.off_g + i] = {{G}}(f32(grad[p.off_g + i]) * coef[p.off_c]);
}
