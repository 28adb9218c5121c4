// Shared by the register-tiled attention kernels (attention_fwd_rt, attention_bwd_dq_rt,
// attention_bwd_dkv_rt.wgsl), pasted in as their COMMON fill by wgpar/ops/attention.py, which
// also generates their tile loaders (the LOAD_OWN fill: the workgroup's own rows, once; NL / FETCH / PUT: the
// walked tile, prefetched into registers). The sizes are the variant's specialisation constants,
// chosen in one place (attention.py's RT_VARIANTS / RT_DEFAULTS table). Their workgroup arrays are arrays of rows: a read's
// row is clamped (naga's bounds checks) once for all its constant columns, where a flat index clamped every read.

const ROWS: u32 = {{ROWS}}u;  // own rows per workgroup: queries (fwd, dq) or keys (dkv)
const BC: u32 = {{BC}}u;      // walked rows per tile: keys (fwd, dq) or queries (dkv)
const TK: u32 = {{TK}}u;      // threads per row group (a power of two, within one subgroup)
const NT: u32 = {{NT}}u;      // ROWS / 4 * TK threads
const DV: u32 = {{DV}}u;      // head_dim / 4
const DP: u32 = {{DP}}u;      // DV + 1: rows padded by one vec4 (lanes reading different rows, different banks)
const PR: u32 = {{PR}}u;      // ROWS / 4 + 1: one walked row's P / dS row (a vec4 per row group), padded
const NEG: f32 = -3.4028235e38;
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;

{{FNS}}

fn exp2_nan4(x: vec4<f32>) -> vec4<f32> {
  return select(exp2(x), x, (bitcast<vec4<u32>>(x) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u));
}
