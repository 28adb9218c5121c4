// Batched C[b] = A[b] @ B[b]. wgpar/ops/matmul.py generates the per-variant
// code and launches this only when every operand is contiguous along a
// dimension that allows vec4 loads (A and B either row-major or transposed:
// the generated LOAD and store code differ). When M % BM == N % BN == K % BK
// == 0 there are no bounds checks; otherwise LOAD clamps its indices and gives
// zeros past K, and WRITE skips outputs past M and N.
//
// Each workgroup computes a BM x BN tile of C with WM x WN threads; a thread
// owns TM x TN outputs: TM/4 groups of 4 rows spaced 4*WM apart and TN/4
// vec4 columns spaced 4*WN apart, so the reads of As / Bs in the inner loop
// are consecutive vec4s across a warp (conflict-free) or broadcasts. As and
// Bs hold one BK-deep slice (two with double buffering) as k-rows of vec4s (SHARED declares them:
// BM / 4 + 1 and BN / 4 + 1 vec4s a row), padded by one vec4 per k-row so the transposing scalar
// stores of a row-major A (or transposed B) spread over banks; on large grids such an operand is loaded
// in 4 x 4 blocks instead, stored as 4 vec4s (ops/matmul.py, _BLOCKS_FROM). The next slice is loaded
// from global memory into registers while the current one is multiplied. Accumulates in f32; A/B/C
// may be f16, bound as vec2<u32> and (un)packed by generated helpers (ops/matmul.py says why).
//
// Bindings (c, a, b: arrays of vec4) and Params (offsets, batch strides and leading dimensions
// in vec4 units; m0, n0 in elements: the first tile of a split grid) are declared in
// wgpar/ops/matmul.py, with the override constants: the tile BM x BN x BK, the WM x WN threads
// and KSTEPS (steps of the inner loop: 1 when it is unrolled). LOOP: the K loop, generated there: with one
// slab, store the prefetched slice, barrier, prefetch the next, multiply, barrier; with two, two slices an
// iteration (multiply one slab while the prefetch goes into the other, one barrier a slice), so that
// every slab index is a constant. HELPERS: the
// functions of an implicit-GEMM convolution (shaders/conv_gemm_*.wgsl), whose loads and stores
// replace the array accesses (ops/conv.py); empty for a plain matmul. TILE: the workgroup's batch entry z
// and its tile's first row and column. SKIP, KSTART and the loop's end: a causal product's shortcuts (ops/matmul.py,
// matmul_causal): a tile whose columns all lie past its rows is not computed, or the K loop stops past
// the tile's last row or starts at its first (A is zero beyond), the longest tile rows first; KSTART is
// 0u, SKIP empty and the loop runs to p.K otherwise.
{{HELPERS}}
{{SHARED}}

@compute @workgroup_size(WN, WM)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let tx = lid.x;
  let ty = lid.y;
  let t = ty * WN + tx;
{{TILE}}
{{SKIP}}
{{DECL}}
  {
    let k0 = {{KSTART}};
{{LOAD}}
  }
{{LOOP}}
{{WRITE}}
}
