"""2-d max and average pooling and their input gradients (shaders/max_pool2d*.wgsl, avg_pool2d.wgsl).

Every kernel runs one thread per output element (forward) or per 4 consecutive input elements of a row
(backward, which gathers over the outputs whose windows hold them: no atomics, a fixed order of
summation; 1 element where 4 would loop past MAX_LOOP). Max pooling records each output's index in its
plane (int32), as ``torch.nn.functional.max_pool2d`` with ``return_indices``, and backward routes the
gradient through it. The forwards take their window as constants where it has at most WINDOW_TAPS taps
(the taps written out, no integer division per output: shaders/pool_window.wgsl; H100 GPU time, average
pooling 2x2 over 32x256x28x28 23.1 -> 14.7 us, 3x3 / 2 over 32x64x112x112 89.9 -> 53.7 us: BENCHMARKS.md).
(Four outputs a thread ran no faster in the general average-pooling kernel: 22.4 against 23.0 us.)
"""

from __future__ import annotations

import functools

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, WORKGROUP, Kernel, grid, load_source
from ..tensor import Tensor
from .elementwise import contiguous
from .reduce import row_reduce
from .window import Window

_WINDOW = "c: u32, h: u32, w: u32, kh: u32, kw: u32, sh: u32, sw: u32, ph: u32, pw: u32, dh: u32, dw: u32, " \
          "oh: u32, ow: u32"
_AT = "positions: u32, planes: u32, pp: u32, inv_positions: f32, inv_ow: f32"  # pool_window.wgsl's
_MAX = Kernel("max_pool2d", "out: w, idx: w, x: r", f"total: u32, off_x: u32, {_WINDOW}, {_AT}")
_MAX_BWD = Kernel("max_pool2d_bwd", "out: w, g: r, idx: r", f"total: u32, off_g: u32, off_idx: u32, {_WINDOW}")
_AVG = Kernel("avg_pool2d", "out: w, x: r",
              f"total: u32, off_x: u32, include_pad: u32, divisor: u32, {_WINDOW}, {_AT}")
WINDOW_TAPS = 64  # the most taps a pooling forward writes out (a 8x8 window)
_EXACT = 1 << 22  # pool_window.wgsl's float reciprocals are exact below this


def _window_grid(win: Window, lim: int) -> tuple[dict, dict, tuple[int, int, int]] | None:
    """A window forward's (fills, parameters, workgroups) (shaders/pool_window.wgsl): a workgroup row holds
    ``pp`` planes' positions, about 4 workgroups' worth, and the rows of planes run on y and z. None where the
    window has more than WINDOW_TAPS taps, or a workgroup row's positions would pass the reciprocals' exact
    range or a grid dimension."""
    positions, planes = win.oh * win.ow, win.n * win.c
    if not (0 < win.kh * win.kw <= WINDOW_TAPS and positions and planes):
        return None
    pp = max(1, 4 * WORKGROUP // positions)
    rows = -(-planes // pp)
    if pp * positions + WORKGROUP > _EXACT or pp * positions > lim * WORKGROUP or rows > lim * lim:
        return None
    span_h, span_w = (win.kh - 1) * win.dh + 1, (win.kw - 1) * win.dw + 1
    pad = win.ph or win.pw or (win.oh - 1) * win.sh + span_h > win.h or (win.ow - 1) * win.sw + span_w > win.w
    fills = dict(AT=_at(True, win.kh, win.kw, win.sh, win.sw, win.dh, win.dw, bool(pad)))
    params = dict(positions=positions, planes=planes, pp=pp, inv_positions=1.0 / positions, inv_ow=1.0 / win.ow)
    gy = min(rows, lim)
    return fills, params, (-(-pp * positions // WORKGROUP), gy, -(-rows // gy))


@functools.cache
def _at(window: bool, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pad: bool) -> str:
    """The AT fill: the window's constants, then shaders/pool_window.wgsl."""
    consts = [f"const WINDOW: bool = {str(window).lower()};", f"const PAD: bool = {str(pad).lower()};"]
    sizes = dict(KH=kh, KW=kw, SH=sh, SW=sw, DH=dh, DW=dw)
    consts += [f"const {n}: u32 = {v}u;" for n, v in sizes.items()]
    return "\n".join(consts) + "\n\n" + load_source("pool_window")


# The fills and parameters of a general kernel, which has the window kernel's code but does not run it.
_NO_WINDOW = dict(AT=_at(False, 1, 1, 1, 1, 1, 1, True))
_NO_AT = dict(positions=0, planes=0, pp=0, inv_positions=0.0, inv_ow=0.0)


@functools.cache
def _store(t: str) -> str:
    """The pooling input gradients' shared row store (shaders/pool_row_store.wgsl) for element type ``t``."""
    return load_source("pool_row_store").replace("{{T}}", t)


def _groups(total: int, lim: int) -> tuple[int, int]:
    return grid(-(-total // WORKGROUP), lim)


def _vec(loops) -> int:
    """Input elements per thread of a backward kernel: 4, or 1 where ``loops(4)`` (the most outputs one
    thread visits) passes MAX_LOOP."""
    return 4 if loops(4) <= MAX_LOOP else 1


def _threads(n: int, c: int, h: int, w: int, vec: int) -> int:
    return n * c * h * -(-w // vec)


def _outputs_over(k: int, s: int, vec: int) -> int:
    """The most outputs of stride ``s`` whose windows of extent ``k`` reach ``vec`` consecutive inputs."""
    return (k + vec - 2) // s + 1


def max_pool2d(x: Tensor, win: Window) -> tuple[Tensor, Tensor]:
    """(values, indices) [N, C, oh, ow] of max pooling ``x`` [N, C, H, W]; indices are int32 positions
    h * W + w in each plane. A NaN in a window wins it (torch's rule).

    Arguments:
        x: a float tensor.
        win: the window (``window.window``, with dilation).
    """
    x = contiguous(x)
    shape = (win.n, win.c, win.oh, win.ow)
    out = Tensor.empty(shape, x.dtype, x.device)
    idx = Tensor.empty(shape, _dt.int32, x.device)
    k, params, groups = _max_plan(win, x.dtype.storage, x._offset, x.device.max_workgroups)
    x.device.dispatch(k, [out._storage.buffer, idx._storage.buffer, x._storage.buffer], params, groups)
    return out, idx


@functools.lru_cache(maxsize=1024)
def _max_plan(win: Window, t: str, off_x: int, lim: int) -> tuple:
    """max_pool2d's (kernel, parameters, workgroups), made once per window, dtype and offset: a layer's
    host cost per call is then about one dispatch's."""
    total = win.n * win.c * win.oh * win.ow
    fns = load_source("float_fns")
    at = _window_grid(win, lim)
    if at is not None:
        fills, params, groups = at
        return (_MAX.spec((t, "i32", t), T=t, FNS=fns, **fills),
                _MAX.pack(total=total, off_x=off_x, **params, **win.params()), groups)
    return (_MAX.spec((t, "i32", t), T=t, FNS=fns, **_NO_WINDOW),
            _MAX.pack(total=total, off_x=off_x, **_NO_AT, **win.params()), _groups(total, lim))


def max_pool2d_backward(g: Tensor, idx: Tensor, win: Window) -> Tensor:
    """The input gradient [N, C, H, W] of ``max_pool2d`` for the output gradient ``g``.

    Arguments:
        g: the output's gradient [N, C, oh, ow].
        idx: the indices ``max_pool2d`` returned.
        win: the forward's window.
    """
    g = contiguous(g)
    idx = contiguous(idx)
    gx = Tensor.empty((win.n, win.c, win.h, win.w), g.dtype, g.device)
    eh, ew = (win.kh - 1) * win.dh + 1, (win.kw - 1) * win.dw + 1  # the windows' spans

    def loops(vec):
        return _outputs_over(eh, win.sh, 1) * _outputs_over(ew, win.sw, vec)

    vec = _vec(loops)
    taps = loops(vec) > MAX_LOOP  # long dilated spans: loop over the kh * kw taps instead
    total = _threads(win.n, win.c, win.h, win.w, vec)
    k = _MAX_BWD.spec((g.dtype.storage, g.dtype.storage, "i32"), T=g.dtype.storage, VEC=vec,
                      TAPS="true" if taps else "false", STORE=_store(g.dtype.storage))
    g.device.dispatch(k, [gx._storage.buffer, g._storage.buffer, idx._storage.buffer],
                      _MAX_BWD.pack(total=total, off_g=g._offset, off_idx=idx._offset, **win.params()),
                      _groups(total, g.device.max_workgroups))
    return gx


def avg_pool2d(x: Tensor, win: Window, count_include_pad: bool = True, divisor_override: int | None = None,
               backward: bool = False) -> Tensor:
    """Average pooling of ``x`` [N, C, H, W] (window without dilation), or with ``backward`` the input
    gradient [N, C, H, W] for ``x`` the output's gradient [N, C, oh, ow].

    Arguments:
        x: the input, or the output's gradient.
        win: the window.
        count_include_pad: whether padded positions count in the divisor.
        divisor_override: a fixed divisor instead.
        backward: compute the input gradient.
    """
    x = contiguous(x)
    shape = (win.n, win.c, win.h, win.w) if backward else (win.n, win.c, win.oh, win.ow)
    out = Tensor.empty(shape, x.dtype, x.device)
    k, params, groups = _avg_plan(win, x.dtype.storage, backward, bool(count_include_pad), divisor_override or 0,
                                  x._offset, x.device.max_workgroups)
    x.device.dispatch(k, [out._storage.buffer, x._storage.buffer], params, groups)
    return out


@functools.lru_cache(maxsize=1024)
def _avg_plan(win: Window, t: str, backward: bool, include_pad: bool, divisor: int, off_x: int, lim: int) -> tuple:
    """avg_pool2d's (kernel, parameters, workgroups), made once per distinct call (as ``_max_plan``)."""
    fills = dict(T=t, BACKWARD="true" if backward else "false", STORE=_store(t))
    params = dict(off_x=off_x, include_pad=int(include_pad), divisor=divisor, **win.params())
    at = None if backward else _window_grid(win, lim)
    if at is not None:
        window_fills, window_params, groups = at
        return (_AVG.spec((t, t), VEC=1, **fills, **window_fills), _AVG.pack(total=0, **params, **window_params),
                groups)
    vec = _vec(lambda v: _outputs_over(win.kh, win.sh, 1) * _outputs_over(win.kw, win.sw, v)) if backward else 1
    total = _threads(win.n, win.c, win.h, win.w, vec) if backward else win.n * win.c * win.oh * win.ow
    return (_AVG.spec((t, t), VEC=vec, **fills, **_NO_WINDOW), _AVG.pack(total=total, **params, **_NO_AT),
            _groups(total, lim))


_ADAPTIVE = Kernel("adaptive_avg_pool2d", "out: w, x: r", "total: u32, off_x: u32, h: u32, w: u32, oh: u32, ow: u32")


def adaptive_window(n: int, m: int) -> int:
    """The most input rows one of torch's adaptive windows covers, pooling ``n`` rows to ``m``."""
    return max(-(-(i + 1) * n // m) - (i * n) // m for i in range(m))


@functools.lru_cache(maxsize=1024)
def adaptive_fits(in_hw: tuple[int, int], out_hw: tuple[int, int]) -> bool:
    """Whether the adaptive kernels' loops (a window forward, the windows over an input element backward)
    stay within MAX_LOOP (an output of 1x1 runs as a reduction forward)."""
    (h, w), (oh, ow) = in_hw, out_hw
    fwd = (oh, ow) == (1, 1) or adaptive_window(h, oh) * adaptive_window(w, ow) <= MAX_LOOP
    return fwd and (-(-oh // max(h, 1)) + 1) * (-(-ow // max(w, 1)) + 1) <= MAX_LOOP


def adaptive_avg_pool2d(x: Tensor, out_hw: tuple[int, int], backward: bool = False,
                        in_hw: tuple[int, int] | None = None) -> Tensor:
    """Adaptive average pooling of ``x`` [N, C, H, W] to ``out_hw`` (torch's windows; shaders/adaptive_avg_pool2d.wgsl),
    or with ``backward`` the input gradient [N, C, *in_hw] for ``x`` the output's gradient [N, C, *out_hw].
    An output of 1x1 is a mean of each plane: the row reduction, coalesced, with lanes to the plane's
    size (several small planes a workgroup); a thread per plane read 49-element planes uncoalesced
    (a global average pool, H100: 18-23 us for 3 MB).

    Arguments:
        x: the input, or the output's gradient.
        out_hw: the output's (rows, columns).
        backward: compute the input gradient.
        in_hw: the input's (rows, columns), with ``backward``.
    """
    x = contiguous(x)
    n, c = x.shape[:2]
    (h, w), (oh, ow) = (in_hw if backward else x.shape[2:]), out_hw
    if not backward and (oh, ow) == (1, 1) and h * w > 0:
        return row_reduce("mean", x, n * c, h * w, (n, c, 1, 1))
    out = Tensor.empty((n, c, h, w) if backward else (n, c, oh, ow), x.dtype, x.device)
    if out.numel():
        k, params, groups = _adaptive_plan(n, c, h, w, oh, ow, x.dtype.storage, backward, x._offset,
                                           x.device.max_workgroups)
        x.device.dispatch(k, [out._storage.buffer, x._storage.buffer], params, groups)
    return out


@functools.lru_cache(maxsize=1024)
def _adaptive_plan(n: int, c: int, h: int, w: int, oh: int, ow: int, t: str, backward: bool, off_x: int,
                   lim: int) -> tuple:
    """adaptive_avg_pool2d's (kernel, parameters, workgroups), made once per distinct call (as ``_max_plan``)."""
    # backward: at most ceil(oh / h) + 1 output rows hold an input row, and vec columns
    vec = _vec(lambda v: (-(-oh // h) + 1) * v * (-(-ow // w) + 1)) if backward else 1
    total = _threads(n, c, h, w, vec) if backward else n * c * oh * ow
    return (_ADAPTIVE.spec((t, t), T=t, BACKWARD="true" if backward else "false", VEC=vec, STORE=_store(t)),
            _ADAPTIVE.pack(total=total, off_x=off_x, h=h, w=w, oh=oh, ow=ow), _groups(total, lim))
