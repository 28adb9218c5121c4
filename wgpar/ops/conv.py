"""2-d convolution and its gradients: depthwise and direct kernels, implicit GEMM, a plain matmul for 1x1, im2col.

Which path runs (docs/design.md, "Convolution"):

- depthwise (one input channel per group, any channel multiplier): shaders/conv_dw_*.wgsl, four
  outputs per thread; the input gradient is a gather, the weight gradient a per-workgroup tree
  reduction into partial sums over parts of the positions, summed after.
- the input gradient of at most 4 input channels per group (a 3-channel stem): shaders/conv_direct_dgrad.wgsl,
  a gather per 8 rows of a stride phase's column over the taps that reach that phase.
- 1x1, stride 1, no padding, channels and positions in whole vec4s: the tuned matmul, per image
  [O, C] @ [C, H W], no gather.
- otherwise implicit GEMM: the tuned tiled matmul (shaders/matmul_fast.wgsl) with its tile loads
  replaced by gathers (shaders/conv_gemm_*.wgsl): per group, the forward is weight [O/G, K] @
  patches [K, B oh ow] (K = C/G kh kw), the weight gradient gy [O/G, B oh ow] @ patches^T split
  along the positions into partial sums, the input gradient one product per stride phase over the
  taps that reach it. The patches are read from the input where a tile is loaded: no workspace.
- im2col + matmul and col2im in chunks of images (``WORKSPACE_BYTES``) where a product's K would
  pass the kernel's loop limit (``_MAX_K``) or the dtype has no kernel.

``PATHS`` counts the kernels each call took (tests check that a shape takes its path).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections import Counter
from collections.abc import Iterator

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor
from .arith import inplace
from .elementwise import cast, contiguous, copy_, fill, run_map
from .matmul import CONV_TILINGS, Tiling, _generate, gemm_tiling, grid_tiles, matmul, matmul_rows
from .reduce import column_sums, reduce
from .shape import narrow, permute, reshape, transpose
from .window import Window

_WINDOW = "c: u32, h: u32, w: u32, kh: u32, kw: u32, sh: u32, sw: u32, ph: u32, pw: u32, dh: u32, dw: u32, " \
          "oh: u32, ow: u32"
_IM2COL = Kernel("conv_im2col", "cols: w, x: r", f"total: u32, cols: u32, off_x: u32, {_WINDOW}")
_COL2IM = Kernel("conv_col2im", "gx: w, gcols: r", f"total: u32, cols: u32, off_gx: u32, {_WINDOW}")
_GEMM = "M: u32, N: u32, K: u32, z0: u32, m0: u32, n0: u32"
_FWD = Kernel("matmul_fast", "y: w, wt: r, x: r, bias: r",
              f"{_GEMM}, cg: u32, o: u32, off_y: u32, off_w: u32, off_x: u32, off_b: u32, has_bias: u32, {_WINDOW}",
              constants=())
_WGRAD = Kernel("matmul_fast", "gw: w, gy: r, x: r",
                f"{_GEMM}, groups: u32, nq: u32, cg: u32, o: u32, off_gy: u32, off_x: u32, {_WINDOW}", constants=())
_DGRAD = Kernel("matmul_fast", "gx: w, wt: r, gy: r",
                f"{_GEMM}, og: u32, o: u32, off_gx: u32, off_w: u32, off_gy: u32, rh: u32, rw: u32, nh: u32, nw: u32, "
                f"ki0h: u32, ki0w: u32, steph: u32, stepw: u32, nki: u32, nkj: u32, offh: i32, offw: i32, dsh: i32, "
                f"dsw: i32, {_WINDOW}", constants=())
_DW_FWD = Kernel("conv_dw_fwd", "y: w, wt: r, x: r, bias: r",
                 f"total: u32, o: u32, mult: u32, off_y: u32, off_w: u32, off_x: u32, off_b: u32, has_bias: u32, "
                 f"{_WINDOW}")
_DW_DGRAD = Kernel("conv_dw_dgrad", "gx: w, wt: r, gy: r",
                   f"total: u32, o: u32, mult: u32, off_gx: u32, off_w: u32, off_gy: u32, {_WINDOW}")
_DW_WGRAD = Kernel("conv_dw_wgrad", "gw: w, gy: r, x: r",
                   f"parts: u32, per: u32, nq: u32, o: u32, mult: u32, off_gy: u32, off_x: u32, {_WINDOW}")
_DIRECT_DGRAD = Kernel("conv_direct_dgrad", "gx: w, wt: r, gy: r",
                       f"total: u32, o: u32, og: u32, groups: u32, nwm: u32, nblk: u32, phc: u32, pwc: u32, "
                       f"steph: u32, stepw: u32, dsh: u32, dsw: u32, off_gx: u32, off_w: u32, off_gy: u32, {_WINDOW}",
                       constants=(("WG", WORKGROUP), ("CG", 4)))
# Most bytes of patches held at once by the im2col path: a larger batch runs in chunks of images.
WORKSPACE_BYTES = 64 << 20
# Longest K of one implicit GEMM (each BK-deep step costs about BK + 2 loop iterations; see
# runtime/kernels.py MAX_LOOP); a longer one takes the im2col path, whose matmul splits K.
_MAX_K = MAX_LOOP
# Most taps of the depthwise weight gradient's per-thread accumulators (registers).
_DW_MAX_TAPS = 64
# Split-K of the weight gradient on a GPU: parts until about this many workgroups, each part at
# least _PART_MIN positions (the partial sums cost parts x the weight's size, kept within the output
# gradient's size).
_WGRAD_WORKGROUPS = 1024
_PART_MIN = 1024
# Tiles for products of few rows (grouped convs, the input gradient of 5-32 channels per group): the
# 64-row tile would compute mostly padding there.
_SHORT_TILES = (Tiling(8, 128, 16, 4, 4, unroll=True), Tiling(16, 128, 16, 4, 8, unroll=True),
                Tiling(32, 128, 16, 4, 8, unroll=True))
# Positions per thread of the depthwise weight gradient on a GPU (a CPU takes as many as the loop allows).
_DW_PER = 8
# Most input channels per group of the direct input gradient: a thread holds 8 rows of each in registers
# (8 CG accumulators, 8 gy values and a weight: about 41 floats at 4; 8 channels would take twice the
# accumulators), and from 5 channels the GEMM's 8-row tiles are mostly filled. Its rows per thread
# (conv_direct_dgrad.wgsl's ROWS).
_DIRECT_MAX_CG = 4
_DIRECT_ROWS = 8

PATHS: Counter[str] = Counter()
_force: str | None = None


@contextlib.contextmanager
def force_path(name: str | None) -> Iterator[None]:
    """Run convolutions by ``name`` ("im2col" or "gemm"; tests, benchmarks) where it can run them; "direct"
    runs the input gradient of few channels per group by the direct kernel (one channel too, the depthwise
    kernel's unforced), and the rest by the GEMM."""
    global _force
    if name not in (None, "im2col", "gemm", "direct"):
        raise ValueError(f"unknown convolution path {name!r}; choose 'im2col', 'gemm' or 'direct'")
    prev, _force = _force, name
    try:
        yield
    finally:
        _force = prev


def _launch(kernel: Kernel, out: Tensor, src: Tensor, total: int, offset: dict, cols: int, win: Window) -> None:
    dev = out.device
    k = kernel.spec((out.dtype.storage, src.dtype.storage), T=out.dtype.storage)
    dev.dispatch(k, [out._storage.buffer, src._storage.buffer],
                 kernel.pack(total=total, cols=cols, **offset, **win.params()),
                 grid(-(-total // WORKGROUP), dev.max_workgroups))


def im2col(x: Tensor, win: Window, n0: int, nb: int) -> Tensor:
    """The patches of images [n0, n0 + nb) of contiguous ``x``: [C * kh * kw, nb * oh * ow].

    Arguments:
        x: the contiguous input [N, C, H, W].
        win: the convolution's window.
        n0, nb: the first image and the number of images.
    """
    cols = nb * win.positions
    out = Tensor.empty((win.c * win.kh * win.kw, cols), x.dtype, x.device)
    _launch(_IM2COL, out, x, out.numel(), {"off_x": x._offset + n0 * win.c * win.h * win.w}, cols, win)
    return out


def col2im_into(gx: Tensor, gcols: Tensor, win: Window, n0: int, nb: int) -> None:
    """Write images [n0, n0 + nb) of ``gx`` (fresh, contiguous [N, C, H, W]) from the patches'
    gradient ``gcols`` [C * kh * kw, nb * oh * ow] (contiguous).

    Arguments:
        gx: the input gradient being filled.
        gcols: the gradient of this chunk's patches.
        win: the convolution's window.
        n0, nb: the first image and the number of images.
    """
    plane = win.c * win.h * win.w
    _launch(_COL2IM, gx, gcols, nb * plane, {"off_gx": gx._offset + n0 * plane}, nb * win.positions, win)


def chunks(win: Window, x: Tensor) -> list[tuple[int, int]]:
    """(first image, images) of each chunk whose patches fit ``WORKSPACE_BYTES`` (at least one image)."""
    per_image = win.c * win.kh * win.kw * win.positions * x.dtype.itemsize
    if per_image > x.device.max_binding:
        raise ValueError(f"conv2d: the patches of one image of shape {(win.c, win.h, win.w)} with a {win.kh}x{win.kw} "
                         f"kernel take {per_image} bytes, more than {x.device}'s {x.device.max_binding}-byte "
                         "storage binding limit")
    per = max(1, WORKSPACE_BYTES // per_image)
    return [(n0, min(per, win.n - n0)) for n0 in range(0, win.n, per)]


def _gemm_dtype(t: Tensor) -> bool:
    return t.dtype is _dt.float32 or (t.dtype is _dt.float16 and t.device.has_f16)


def _as(dtype: _dt.DType, *ts: Tensor | None) -> tuple:
    """``ts`` in ``dtype`` (None stays None): the im2col path's products take one dtype, where the kernels
    read each operand in its own."""
    return tuple(t if t is None or t.dtype is dtype else cast(t, dtype) for t in ts)


def _depthwise(win: Window, weight: Tensor, groups: int) -> bool:
    """One input channel per group, loops and accumulators within the kernels' limits."""
    mult = weight.shape[0] // groups
    return (weight.shape[1] == 1 and groups == win.c and _force is None and _gemm_dtype(weight)
            and win.kh * win.kw <= _DW_MAX_TAPS and 4 * mult * win.kh * win.kw <= MAX_LOOP)


def _pointwise(win: Window, weight: Tensor, groups: int) -> bool:
    """A 1x1 convolution that is a plain matmul with vec4 operands."""
    return ((win.kh, win.kw, win.sh, win.sw, win.ph, win.pw) == (1, 1, 1, 1, 0, 0) and groups == 1
            and win.c % 4 == 0 and win.positions % 4 == 0 and win.oh == win.h and win.ow == win.w and _force is None)


def _direct_steps(win: Window) -> tuple[int, int, int, int]:
    """(steph, stepw, dsh, dsw): taps between two that reach one stride phase, and output rows (columns)
    between what they read."""
    gh, gw = math.gcd(win.sh, win.dh), math.gcd(win.sw, win.dw)
    return win.sh // gh, win.sw // gw, win.dh // gh, win.dw // gw


def _direct(win: Window, weight: Tensor, groups: int) -> bool:
    """The direct input gradient: few input channels per group, loops within the limit."""
    og, cg = weight.shape[0] // groups, weight.shape[1]
    if cg > _DIRECT_MAX_CG or not _gemm_dtype(weight) or _force not in (None, "direct"):
        return False
    steph, stepw, _, _ = _direct_steps(win)
    # iterations per thread: og (column taps (row taps + 1) + 1), a phase's taps at most ceil(k / step),
    # and the searches for the first taps
    return og * (-(-win.kw // stepw) * (-(-win.kh // steph) + 1) + 1) + steph + stepw <= MAX_LOOP


def _gemm(win: Window, weight: Tensor, groups: int) -> bool:
    og, cg = weight.shape[0] // groups, weight.shape[1]
    return _force != "im2col" and _gemm_dtype(weight) and max(cg, og) * win.kh * win.kw <= _MAX_K


@functools.lru_cache(maxsize=256)
def _gemm_spec(kernel: Kernel, helpers: str, t: Tiling, la: str, types: tuple[str, ...], out: str) -> KernelSpec:
    return _generate(t, la, "n", "", "", "", True, (kernel, load_source(helpers).replace("{{T}}", out), types))


def _run_gemm(kernel: Kernel, helpers: str, la: str, out: Tensor, bufs: list[Tensor], M: int, N: int, K: int, Z: int,
              params: dict, tiling: Tiling | None = None) -> None:
    """Dispatch the implicit GEMM ``kernel`` (helpers ``shaders/<helpers>.wgsl``) over Z products M x N x K
    (``tiling``: its tile, chosen by the caller), splitting a grid past the device's workgroups per dimension."""
    dev = out.device
    t = tiling or next((t for t in _SHORT_TILES if M <= t.bm), None) or gemm_tiling(dev, M, N, Z)
    if t is None:
        raise RuntimeError(f"conv2d: {dev} fits no matmul tile (workgroup limits {dev.limits})")
    k, launches = _gemm_plan(kernel, helpers, la, tuple(b.dtype.storage for b in [out, *bufs]), M, N, K, Z,
                             tuple(params.items()), t, dev.max_workgroups)
    buffers = [b._storage.buffer for b in [out, *bufs]]
    for packed, groups, flops in launches:
        dev.dispatch(k, buffers, packed, groups, flops=flops)


@functools.lru_cache(maxsize=1024)
def _gemm_plan(kernel: Kernel, helpers: str, la: str, types: tuple[str, ...], M: int, N: int, K: int, Z: int,
               params: tuple, t: Tiling, lim: int) -> tuple:
    """_run_gemm's (kernel, launches: (packed parameters, workgroups, FLOPs) each) for tile ``t``, made once
    per product, window, dtypes, offsets and workgroup limit ``lim``: packing the parameters cost a layer's
    call tens of microseconds of host time."""
    return _gemm_spec(kernel, helpers, t, la, types, types[0]), tuple(
        (kernel.pack(M=M, N=N, K=K, z0=z0, m0=m0, n0=n0, **dict(params)), groups,
         2 * groups[2] * min(M - m0, groups[1] * t.bm) * min(N - n0, groups[0] * t.bn) * K)
        for z0, m0, n0, groups in grid_tiles(Z, M, N, t.bm, t.bn, lim))


def _dw_launch(kernel: Kernel, out: Tensor, bufs: list[Tensor], total: int, params: dict,
               constants: dict | None = None, **fills) -> None:
    dev = out.device
    k = kernel.spec(tuple(b.dtype.storage for b in [out, *bufs]), constants=constants, T=out.dtype.storage, **fills)
    dev.dispatch(k, [b._storage.buffer for b in [out, *bufs]], kernel.pack(**params),
                 grid(-(-total // WORKGROUP), dev.max_workgroups))


@functools.lru_cache(maxsize=1024)
def _dw_fwd_plan(win: Window, o: int, groups: int, types: tuple[str, ...], off_y: int, off_w: int, off_x: int,
                 off_b: int, has_bias: int, lim: int) -> tuple:
    """The depthwise forward's (kernel, parameters, workgroups), made once per window, dtypes and offsets
    (``_bias_args``' off_b and has_bias): a layer's host cost per call is then about one dispatch's."""
    total = win.n * o * win.oh * -(-win.ow // 4)
    return (_DW_FWD.spec(types, T=types[0]),
            _DW_FWD.pack(total=total, o=o, mult=o // groups, off_y=off_y, off_w=off_w, off_x=off_x,
                         off_b=off_b, has_bias=has_bias, **win.params()),
            grid(-(-total // WORKGROUP), lim))


def _bias_args(bias: Tensor | None, weight: Tensor) -> tuple[Tensor, dict]:
    """The bias binding (the weight's buffer where there is none: never read) and its parameters."""
    if bias is None:
        return weight, {"off_b": 0, "has_bias": 0}
    bias = contiguous(bias)
    return bias, {"off_b": bias._offset, "has_bias": 1}


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int,
           out_dtype: _dt.DType | None = None) -> Tensor:
    """The convolution [N, O, oh, ow] of ``x`` [N, C, H, W] with ``weight`` [O, C / groups, kh, kw]
    (sizes and dtypes checked by the caller), plus ``bias`` [O].

    Arguments:
        x, weight, bias: the operands, float dtypes (each read in its own, float32 math).
        win: the window (``window.window``).
        groups: input and output channels split into this many independent groups.
        out_dtype: the result's dtype (default x's): float16 out of float32 operands under autocast, the
            casts folded into the kernels' loads and stores.
    """
    o, dt = weight.shape[0], out_dtype or x.dtype
    if win.n == 0:
        return Tensor.empty((0, o, win.oh, win.ow), dt, x.device)
    x, weight = contiguous(x), contiguous(weight)
    if _depthwise(win, weight, groups):
        PATHS["depthwise"] += 1
        y = Tensor.empty((win.n, o, win.oh, win.ow), dt, x.device)
        b, bp = _bias_args(bias, weight)
        k, params, grid_ = _dw_fwd_plan(win, o, groups, (y.dtype.storage, weight.dtype.storage, x.dtype.storage,
                                                         b.dtype.storage), y._offset, weight._offset,
                                        x._offset, bp["off_b"], bp["has_bias"], x.device.max_workgroups)
        x.device.dispatch(k, [y._storage.buffer, weight._storage.buffer, x._storage.buffer, b._storage.buffer],
                          params, grid_)
        return y
    if _pointwise(win, weight, groups):
        PATHS["matmul"] += 1
        w2, x3 = reshape(weight, (o, win.c)), reshape(x, (win.n, win.c, win.positions))
        y = matmul_rows(w2, x3, bias, dt)  # [N, O, H W]
        return reshape(y, (win.n, o, win.oh, win.ow))
    if _gemm(win, weight, groups):
        PATHS["gemm"] += 1
        og, cg = o // groups, win.c // groups
        y = Tensor.empty((win.n, o, win.oh, win.ow), dt, x.device)
        b, bp = _bias_args(bias, weight)
        _run_gemm(_FWD, "conv_gemm_fwd", "n", y, [weight, x, b], og, win.n * win.positions, cg * win.kh * win.kw,
                  groups, dict(cg=cg, o=o, off_y=y._offset, off_w=weight._offset, off_x=x._offset, **bp,
                               **win.params()))
        return y
    PATHS["im2col"] += 1
    return _im2col_conv2d(*_as(dt, x, weight, bias), win, groups)


def _im2col_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int) -> Tensor:
    o = weight.shape[0]
    g, og, kg = groups, o // groups, weight.numel() // o
    w3 = reshape(weight, (g, og, kg))
    bias4 = None if bias is None else reshape(bias, (1, g, og, 1))
    parts = chunks(win, x)
    out = None if len(parts) == 1 else Tensor.empty((win.n, g, og, win.positions), x.dtype, x.device)
    for n0, nb in parts:
        cols = reshape(im2col(x, win, n0, nb), (g, kg, nb * win.positions))
        y = matmul(w3, cols)  # [G, O/G, nb * L]
        y = permute(reshape(y, (g, og, nb, win.positions)), (2, 0, 1, 3))  # a view [nb, G, O/G, L]
        if out is None:
            out = run_map("add", [y, bias4]) if bias4 is not None else contiguous(y)
        else:
            copy_(narrow(out, 0, n0, nb), y)
    if len(parts) > 1 and bias4 is not None:
        inplace("add", out, bias4)
    return reshape(out, (win.n, o, win.oh, win.ow))


def input_grad(g: Tensor, weight: Tensor, win: Window, groups: int, out_dtype: _dt.DType | None = None) -> Tensor:
    """The gradient [N, C, H, W] of conv2d's input for the output gradient ``g`` [N, O, oh, ow] (the
    transposed convolution of ``g``).

    Arguments:
        g: the output's gradient.
        weight: the filters [O, C / groups, kh, kw].
        win, groups: as for ``conv2d``.
        out_dtype: the gradient's dtype (default g's; the input's under autocast).
    """
    o, dt = weight.shape[0], out_dtype or g.dtype
    if win.n == 0:
        return Tensor.empty((win.n, win.c, win.h, win.w), dt, g.device)
    g, weight = contiguous(g), contiguous(weight)
    if _pointwise(win, weight, groups):  # the matmul makes the gradient (no input-sized buffer before it)
        PATHS["matmul"] += 1
        wt = transpose(reshape(weight, (o, win.c)), 0, 1)
        return reshape(matmul_rows(wt, reshape(g, (win.n, o, win.positions)), None, dt),
                       (win.n, win.c, win.h, win.w))
    gx = Tensor.empty((win.n, win.c, win.h, win.w), dt, g.device)
    if _depthwise(win, weight, groups):
        PATHS["depthwise"] += 1
        total = win.n * win.c * win.h * -(-win.w // 4)
        _dw_launch(_DW_DGRAD, gx, [weight, g], total, dict(total=total, o=o, mult=o // groups, off_gx=gx._offset,
                                                           off_w=weight._offset, off_gy=g._offset, **win.params()))
        return gx
    if _direct(win, weight, groups):
        PATHS["direct"] += 1
        _direct_input_grad(gx, g, weight, win, groups)
        return gx
    if _gemm(win, weight, groups):
        PATHS["gemm"] += 1
        _gemm_input_grad(gx, g, weight, win, groups)
        return gx
    PATHS["im2col"] += 1
    g, weight = _as(dt, g, weight)
    gr, og, kg = groups, o // groups, weight.numel() // o
    w3t = transpose(reshape(weight, (gr, og, kg)), -2, -1)
    g4 = reshape(g, (win.n, gr, og, win.positions))
    for n0, nb in chunks(win, gx):
        gy = reshape(contiguous(permute(narrow(g4, 0, n0, nb), (1, 2, 0, 3))), (gr, og, nb * win.positions))
        col2im_into(gx, matmul(w3t, gy), win, n0, nb)
    return gx


def _taps(r: int, pad: int, k: int, d: int, s: int) -> tuple[int, int, int]:
    """(first, step, count) of the taps ki < k that reach input rows r (mod s): r + pad - ki d divisible by s."""
    taps = [ki for ki in range(k) if (r + pad - ki * d) % s == 0]
    return (taps[0] if taps else 0), (taps[1] - taps[0] if len(taps) > 1 else 1), len(taps)


def _gemm_input_grad(gx: Tensor, g: Tensor, weight: Tensor, win: Window, groups: int) -> None:
    """One implicit GEMM per stride phase (rh, rw): the input positions it holds, the taps that reach them."""
    o = weight.shape[0]
    og, cg = o // groups, win.c // groups
    for rh in range(min(win.sh, win.h)):
        ki0h, steph, nki = _taps(rh, win.ph, win.kh, win.dh, win.sh)
        for rw in range(min(win.sw, win.w)):
            ki0w, stepw, nkj = _taps(rw, win.pw, win.kw, win.dw, win.sw)
            nh, nw = len(range(rh, win.h, win.sh)), len(range(rw, win.w, win.sw))
            _run_gemm(_DGRAD, "conv_gemm_dgrad", "t", gx, [weight, g], cg, win.n * nh * nw, og * nki * nkj, groups,
                      dict(og=og, o=o, off_gx=gx._offset, off_w=weight._offset, off_gy=g._offset, rh=rh, rw=rw, nh=nh,
                           nw=nw, ki0h=ki0h, ki0w=ki0w, steph=steph, stepw=stepw, nki=max(nki, 1), nkj=max(nkj, 1),
                           offh=(rh + win.ph - ki0h * win.dh) // win.sh, offw=(rw + win.pw - ki0w * win.dw) // win.sw,
                           dsh=steph * win.dh // win.sh, dsw=stepw * win.dw // win.sw, **win.params()))


def _direct_input_grad(gx: Tensor, g: Tensor, weight: Tensor, win: Window, groups: int) -> None:
    """One dispatch for every stride phase: a thread per 8 rows of a phase's column (rows ``dsh`` apart)."""
    o, cg = weight.shape[0], weight.shape[1]
    steph, stepw, dsh, dsw = _direct_steps(win)
    phc, pwc = min(win.sh, win.h), min(win.sw, win.w)
    nhm, nwm = -(-win.h // win.sh), -(-win.w // win.sw)  # rows and columns of the largest phase
    nblk = dsh * -(-nhm // (_DIRECT_ROWS * dsh))
    total = win.n * groups * phc * pwc * nblk * nwm
    _dw_launch(_DIRECT_DGRAD, gx, [weight, g], total,
               dict(total=total, o=o, og=o // groups, groups=groups, nwm=nwm, nblk=nblk, phc=phc, pwc=pwc, steph=steph,
                    stepw=stepw, dsh=dsh, dsw=dsw, off_gx=gx._offset, off_w=weight._offset, off_gy=g._offset,
                    **win.params()), constants={"CG": cg})


def weight_grad(x: Tensor, g: Tensor, weight: Tensor, win: Window, groups: int) -> Tensor:
    """The gradient of conv2d's weight (``weight``'s shape and dtype) for input ``x`` and output gradient ``g``.

    Arguments:
        x: the forward's input [N, C, H, W].
        g: the output's gradient [N, O, oh, ow].
        weight: the forward's weight (for its shape and dtype).
        win, groups: as for ``conv2d``.
    """
    o = weight.shape[0]
    og, kg = o // groups, weight.numel() // o
    if win.n == 0:
        return fill(weight.shape, 0.0, weight.dtype, weight.device)
    x, g = contiguous(x), contiguous(g)
    dev, nq = x.device, win.n * win.positions
    gpu = dev.adapter_type.lower() != "cpu"
    if _depthwise(win, weight, groups):
        PATHS["depthwise"] += 1
        taps = win.kh * win.kw
        per = _DW_PER if gpu else max(1, min(MAX_LOOP // (2 * (taps + 1)), -(-nq // WORKGROUP)))
        parts = -(-nq // (per * WORKGROUP))
        partial = Tensor.empty((parts, o, taps), _dt.float32, dev)
        k = _DW_WGRAD.spec((partial.dtype.storage, g.dtype.storage, x.dtype.storage), KH=win.kh, KW=win.kw)
        dev.dispatch(k, [partial._storage.buffer, g._storage.buffer, x._storage.buffer],
                     _DW_WGRAD.pack(parts=parts, per=per, nq=nq, o=o, mult=o // groups, off_gy=g._offset,
                                    off_x=x._offset, **win.params()), grid(parts * o, dev.max_workgroups))
    elif _gemm(win, weight, groups):
        PATHS["gemm"] += 1
        parts = -(-nq // _MAX_K)
        t = gemm_tiling(dev, og, kg, groups, weight_grad=True)
        if gpu and t is not None:  # split-K: enough workgroups for a small weight
            tiles = groups * -(-og // t.bm) * -(-kg // t.bn)
            # ... their partial sums no larger than the output gradient they are made from (a workspace
            # within the layer's own activations: 3x3 dilation 2 on an H100 took 24 parts, 1.54x torch's peak)
            cap = g.numel() // (groups * og * kg)
            parts = max(parts, min(-(-_WGRAD_WORKGROUPS // tiles), nq // _PART_MIN, cap))
        kp = -(-nq // parts)
        kp = -(-kp // 16) * 16  # positions per part, whole BK steps
        parts = -(-nq // kp)
        partial = Tensor.empty((parts, groups, og, kg), _dt.float32, dev)
        # A 128-row tile runs as counted above; other products choose again for parts x groups (short tiles
        # for few filters), as before the 128-row tiles.
        _run_gemm(_WGRAD, "conv_gemm_wgrad", "n", partial, [g, x], og, kg, kp, parts * groups,
                  dict(groups=groups, nq=nq, cg=win.c // groups, o=o, off_gy=g._offset, off_x=x._offset,
                       **win.params()), t if t is not None and t.name in CONV_TILINGS else None)
    else:
        PATHS["im2col"] += 1
        return _im2col_weight_grad(*_as(weight.dtype, x, g), weight, win, groups)
    gw = reshape(reduce("sum", partial, 0) if parts > 1 else partial, weight.shape)
    return gw if weight.dtype is _dt.float32 else cast(gw, weight.dtype)


def _im2col_weight_grad(x: Tensor, g: Tensor, weight: Tensor, win: Window, groups: int) -> Tensor:
    o = weight.shape[0]
    gr, og, kg = groups, o // groups, weight.numel() // o
    g4 = reshape(g, (win.n, gr, og, win.positions))
    gw = None
    for n0, nb in chunks(win, x):
        cols_n = nb * win.positions
        gy = reshape(contiguous(permute(narrow(g4, 0, n0, nb), (1, 2, 0, 3))), (gr, og, cols_n))
        part = matmul(gy, transpose(reshape(im2col(x, win, n0, nb), (gr, kg, cols_n)), -2, -1))
        gw = part if gw is None else inplace("add", gw, part)
    return reshape(gw, weight.shape)


def conv2d_backward(x: Tensor, weight: Tensor, g: Tensor, win: Window, groups: int, need_x: bool, need_w: bool,
                    bias_dtype: _dt.DType | None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(input, weight, bias) gradients of ``conv2d`` for the output gradient ``g``, each in its operand's dtype
    (under autocast g is float16 and the operands may be float32); None where not needed.

    Arguments:
        x, weight: the forward's operands.
        g: the output's gradient [N, O, oh, ow].
        win, groups: as for ``conv2d``.
        need_x, need_w: which gradients to compute.
        bias_dtype: the bias's dtype where its gradient is needed, else None.
    """
    gx = input_grad(g, weight, win, groups, x.dtype) if need_x else None
    gw = weight_grad(x, g, weight, win, groups) if need_w else None
    return gx, gw, None if bias_dtype is None else bias_grad(g, bias_dtype)


def bias_grad(g: Tensor, dtype: _dt.DType) -> Tensor:
    """The gradient of a convolution's bias (``dtype``) for the output gradient ``g`` [N, O, h, w]."""
    n, o = g.shape[:2]
    if n == 0:
        return fill((o,), 0.0, dtype, g.device)
    # over positions (contiguous rows), then images: reducing (0, 2) at once copies g to bring them last;
    # the per-image sums in float32 (a float16 g under autocast), the result in the bias's dtype
    part = column_sums(contiguous(g), n * o, g.numel() // (n * o), 1, _dt.float32)
    return reshape(column_sums(part, 1, n, o, dtype), (o,))


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int,
                     out_dtype: _dt.DType | None = None) -> Tensor:
    """The transposed convolution [N, C, H, W] of ``x`` [N, O, oh, ow] with ``weight`` [O, C / groups, kh, kw]
    (sizes and dtypes checked by the caller), plus ``bias`` [C]: the adjoint of ``conv2d`` over ``win`` (whose
    input is this output), so exactly conv2d's input gradient for the output gradient ``x``.

    Arguments:
        x, weight, bias: the operands, float dtypes.
        win: the window of the convolution this is the adjoint of (``win.oh, win.ow`` = x's spatial size).
        groups: channels split into this many independent groups.
        out_dtype: as for ``conv2d``.
    """
    out = input_grad(x, weight, win, groups, out_dtype)
    if bias is not None and win.n:
        inplace("add", out, reshape(bias, (1, win.c, 1, 1)))
    return out
