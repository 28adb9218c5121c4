// im2col for a 2-d convolution of contiguous x [N, C, H, W]: cols[k, j] = the input element that
// kernel tap k = (channel, ki, kj) meets at output position j = (image, oh, ow) of this batch
// chunk, 0 in the padding. Row k of group g is row g * (C / G) * kh * kw + k: the rows of all
// groups in order, so cols is [G, Kg, cols] and one batched matmul with the weight [G, Og, Kg]
// gives the output. One thread per element of cols. Bindings (cols, x: arrays of T) and Params
// are declared in wgpar/ops/conv.py.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= p.total) { return; }
  let j = i % p.cols;
  let k = i / p.cols;
  let kj = k % p.kw;
  let ki = (k / p.kw) % p.kh;
  let ch = k / (p.kw * p.kh);
  let ow = j % p.ow;
  let oh = (j / p.ow) % p.oh;
  let n = j / (p.ow * p.oh);
  let h = i32(oh * p.sh + ki * p.dh) - i32(p.ph);
  let w = i32(ow * p.sw + kj * p.dw) - i32(p.pw);
  var v = {{T}}(0);
  if (h >= 0 && h < i32(p.h) && w >= 0 && w < i32(p.w)) {
    v = x[p.off_x + ((n * p.c + ch) * p.h + u32(h)) * p.w + u32(w)];
  }
  cols[i] = v;
}
