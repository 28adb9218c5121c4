"""Batch norm's kernels over contiguous [N, C, ...] tensors (every dim past 1 is one, ``inner``):
per-channel partial sums (shaders/batch_norm_sums.wgsl) and one kernel that turns them into the
channel's coefficients and maps the elements with them (shaders/batch_norm_apply.wgsl), each one
workgroup per chunk of one channel. A training forward is two dispatches (the statistics, then the
output with the running statistics' and the batch counter's updates), its backward two, an
evaluation forward one.

The statistics are two passes over each chunk within one workgroup, the chunk's mean first, then the
sums of (x - mean) and (x - mean)^2 (no cancellation of large squares, as a single pass of x and x^2
would suffer); the chunks are combined about their weighted mean. Everything per channel is float32,
whatever the input's float type. The differentiable op is ``autograd.nn_ops.BatchNorm``.
"""

from __future__ import annotations

import functools
import math

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, WORKGROUP, Kernel, KernelSpec, grid
from ..storage import Storage
from ..tensor import Tensor

_SUMS = Kernel("batch_norm_sums", "part: w, a: r, b: r, st: r, nbt: w",
               "c: u32, inner: u32, count: u32, chunk: u32, groups: u32, off_p: u32, off_a: u32, off_b: u32, "
               "off_m: u32, off_n: u32")
_APPLY = Kernel("batch_norm_apply",
                "out: w, x: r, g: r, pa: r, st: w, wt: r, bs: r, rm: w, rv: w, em: r, ev: r, fac: r, gw: w, gb: w",
                "c: u32, inner: u32, count: u32, chunk: u32, groups: u32, off_x: u32, off_g: u32, off_p: u32, "
                "off_st: u32, off_w: u32, sw: u32, off_b: u32, sb: u32, off_rm: u32, srm: u32, off_rv: u32, "
                "srv: u32, off_f: u32, batch: u32, inv: f32, eps: f32, momentum: f32, unbias: f32")
# Rows of the float32 statistics a forward keeps for backward ([ROWS, C] from the start of ``stats``).
MEAN, SHIFT, VAR, INVSTD, SCALE = range(5)
ROWS = 5
# How a training forward's running statistics move: ``running += (value - running) * factor`` with
# factor the float ``momentum`` (FACTOR_PARAM), a one-element tensor's value (FACTOR_TENSOR) or the
# reciprocal of the batch counter, just incremented (FACTOR_CUMULATIVE: torch's momentum=None).
FACTOR_PARAM, FACTOR_TENSOR, FACTOR_CUMULATIVE = range(3)
_FACTOR = {FACTOR_PARAM: "p.momentum", FACTOR_TENSOR: "f32(fac[p.off_f])", FACTOR_CUMULATIVE: "1.0 / f32(fac[p.off_f])"}


def _chunking(count: int, channels: int) -> tuple[int, int]:
    """(chunk, chunks per channel): enough workgroups to fill a GPU, no thread looping past MAX_LOOP
    (the statistics read their chunk twice)."""
    groups = max(1, min(-(-count // (8 * WORKGROUP)), 1024 // channels))
    groups = max(groups, -(-count // (WORKGROUP * MAX_LOOP // 2)))
    chunk = max(1, -(-count // groups))
    return chunk, -(-count // chunk)


def _shape(x: Tensor) -> tuple[int, int, int]:
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def _new(shape: tuple[int, ...], dtype: _dt.DType, like: Tensor) -> Tensor:
    return Tensor(Storage(like.device, dtype, math.prod(shape)), shape)


@functools.lru_cache(maxsize=64)
def _sums_kernel(ta: str, tb: str | None, counter: str | None) -> KernelSpec:
    """MODE 0, the statistics of a (``tb`` None; ``counter`` the batch counter's type, or None), or MODE 1,
    the gradient's sums (``tb`` the gradient's type)."""
    if tb is None:
        types, without = ["f32", ta] + ([counter] if counter else []), ("b", "st") + (() if counter else ("nbt",))
    else:
        types, without = ["f32", ta, tb, "f32"], ("nbt",)
    return _SUMS.spec(types, without=without, MODE=int(tb is not None),
                      COUNT="nbt[p.off_n] = nbt[p.off_n] + 1;" if counter else "",
                      MEAN="0.0" if tb is None else "st[p.off_m + ch]",
                      VB="0.0" if tb is None else "f32(b[p.off_b + at])")


def _sums_launch(ta: str, tb: str | None, counter: str | None, c: int, inner: int, count: int, chunk: int,
                 groups: int, lim: int, off_p: int, off_a: int, off_b: int = 0, off_m: int = 0,
                 off_n: int = 0) -> tuple:
    """The sums pass's (kernel, parameters, workgroups): the statistics of a (``tb`` None; ``counter`` the
    batch counter's type, or None) or the gradient's sums (``tb`` its type), as ``_sums_kernel``."""
    return (_sums_kernel(ta, tb, counter),
            _SUMS.pack(c=c, inner=inner, count=count, chunk=chunk, groups=groups, off_p=off_p, off_a=off_a,
                       off_b=off_b, off_m=off_m, off_n=off_n),
            grid(c * groups, lim))


@functools.lru_cache(maxsize=256)
def _apply_kernel(mode: int, tx: str, tw: str | None, tb: str | None, rm: str | None, rv: str | None,
                  factor: tuple[int, str] | None, keep: bool) -> KernelSpec:
    """A forward (mode 0: batch statistics, 1: running ones): the types of x, weight, bias and the running
    statistics (None where absent), how the running statistics move (mode 0; (FACTOR_*, the type of
    ``fac``) or None to leave them) and whether the st rows are kept (written)."""
    # The running statistics are rm and rv where they are written, em and ev (read-only: they may share a
    # buffer with the weight or bias) where they normalise.
    named = {"out": tx, "x": tx, "st": "f32" if keep else None, "wt": tw, "bs": tb,
             "rm": rm if factor else None, "rv": rv if factor else None,
             "em": rm if mode == 1 else None, "ev": rv if mode == 1 else None,
             "fac": factor[1] if factor and factor[0] != FACTOR_PARAM else None}
    running = ""
    if mode == 0 and factor:
        for r, t, value in (("rm", rm, "m + shift"), ("rv", rv, "v * p.unbias")):
            if t is not None:
                at = f"{r}[p.off_{r} + ch * p.s{r}]"
                running += f"{at} = {t}(f32({at}) + ({value} - f32({at})) * {_FACTOR[factor[0]]}); "
    store = "".join(f"st[p.off_st + {i}u * p.c + ch] = {v}; "
                    for i, v in enumerate(("m", "shift", "v", "invstd", "scale"))) if keep else ""
    return _APPLY.spec([t for t in named.values() if t is not None], without=("g", "pa", "gw", "gb") + tuple(
        k for k, t in named.items() if t is None), MODE=mode, PART="st[p.off_p + i]" if mode == 0 else "0.0",
        STAT="0.0", GRADS="", STORE=store, RUNNING=running,
        WEIGHT="1.0" if tw is None else "f32(wt[p.off_w + ch * p.sw])",
        BIAS="0.0" if tb is None else "f32(bs[p.off_b + ch * p.sb])",
        RMEAN="f32(em[p.off_rm + ch * p.srm])" if mode == 1 else "0.0",
        RVAR="f32(ev[p.off_rv + ch * p.srv])" if mode == 1 else "0.0",
        BODY=f"out[at] = {tx}((f32(x[p.off_x + at]) - m) * k2 + k3);")


def forward(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, training: bool,
            running_mean: Tensor | None = None, running_var: Tensor | None = None, momentum: float | Tensor = 0.0,
            cumulative: bool = False, counter: Tensor | None = None,
            keep: bool = True) -> tuple[Tensor, Tensor | None]:
    """Batch norm of contiguous ``x`` [N, C, ...] and the float32 statistics backward needs: (y in x's
    dtype, ``stats`` with rows ``MEAN``, ``SHIFT``, ``VAR``, ``INVSTD``, ``SCALE`` of C each first, or
    None without ``keep``). ``y = (x - mean) * scale + bias - shift * scale``, scale = invstd * weight.

    Training (x's own statistics, N * inner >= 1): two dispatches; the first also adds 1 to ``counter``,
    the second updates the running statistics given, in place. Otherwise the running statistics
    normalise (shift 0): one dispatch.

    Arguments:
        x: contiguous [N, C, ...], a float dtype, not empty.
        weight, bias: [C] or None.
        eps: added to the variance.
        training: normalise with x's statistics (else with the running ones).
        running_mean, running_var: [C] float tensors (any strides): updated in training, read otherwise.
        momentum: the running statistics' factor, a float or a one-element tensor (training).
        cumulative: the factor is 1 / ``counter`` after its increment instead (torch's momentum=None).
        counter: the int32 batch counter (a scalar tensor) to add 1 to, or None.
        keep: whether to return the statistics (backward needs them).
    """
    mom = momentum if isinstance(momentum, Tensor) else None
    factor, st_numel, sums, apply = _forward_plan(
        x.shape, x.dtype.storage, x._offset, _meta(weight), _meta(bias), _meta(running_mean), _meta(running_var),
        _meta(counter), _meta(mom), 0.0 if mom is not None else float(momentum), cumulative, bool(training), keep,
        float(eps), x.device.max_workgroups)
    out = _new(x.shape, x.dtype, x)
    st = _new((st_numel,), _dt.float32, x) if st_numel else None
    dev = x.device
    if training:
        bufs = [st._storage.buffer, x._storage.buffer]
        if counter is not None:
            bufs.append(counter._storage.buffer)
        dev.dispatch(sums[0], bufs, sums[1], sums[2])
        for t in (running_mean, running_var, counter) if factor else (counter,):
            if t is not None:
                t._storage.bump_version()
    fac = None if factor is None or factor[0] == FACTOR_PARAM else (counter if cumulative else momentum)
    bufs = [out, x, st, weight, bias] + ([running_mean, running_var] if not training or factor else []) + [fac]
    dev.dispatch(apply[0], [t._storage.buffer for t in bufs if t is not None], apply[1], apply[2])
    return out, st


def _meta(t: Tensor | None) -> tuple[str, int, int] | None:
    """What a plan needs of an operand: (element type, offset, stride of a [C] vector), or None."""
    return None if t is None else (t.dtype.storage, t._offset, t._strides[0] if t._strides else 0)


@functools.lru_cache(maxsize=512)
def _forward_plan(shape: tuple[int, ...], tx: str, off_x: int, weight, bias, running_mean, running_var, counter,
                  mom, momentum: float, cumulative: bool, training: bool, keep: bool, eps: float, lim: int) -> tuple:
    """(factor, statistics' elements, the statistics' (kernel, parameters, workgroups) or None, the apply's)
    of one forward, made once per shape, dtypes, offsets and settings (``_meta`` of each operand): a batch
    norm layer's host cost per call is then about its two dispatches'."""
    n, c, inner = shape[0], shape[1], math.prod(shape[2:])
    count = n * inner
    chunk, groups = _chunking(count, c)
    w_off, sw = weight[1:] if weight else (0, 0)
    b_off, sb = bias[1:] if bias else (0, 0)
    rm_off, srm = running_mean[1:] if running_mean else (0, 0)
    rv_off, srv = running_var[1:] if running_var else (0, 0)
    tw, tb, trm, trv = (None if m is None else m[0] for m in (weight, bias, running_mean, running_var))
    factor = fac = None
    unbias = 0.0
    sums = None
    if training:
        st_numel = ROWS * c + 3 * c * groups
        t_count, off_n = (None, 0) if counter is None else counter[:2]
        sums = _sums_launch(tx, None, t_count, c, inner, count, chunk, groups, lim, ROWS * c, off_x, off_n=off_n)
        if running_mean is not None or running_var is not None:
            if cumulative:
                factor, fac = (FACTOR_CUMULATIVE, counter[0]), counter
            elif mom is not None:
                factor, fac = (FACTOR_TENSOR, mom[0]), mom
            else:
                factor = (FACTOR_PARAM, "f32")
            unbias = count / (count - 1) if count > 1 else float("inf")
        keep = True
    else:
        st_numel = ROWS * c if keep else 0
    k = _apply_kernel(0 if training else 1, tx, tw, tb, trm, trv, factor, keep)
    apply = (k, _APPLY.pack(c=c, inner=inner, count=count, chunk=chunk, groups=groups, off_x=off_x, off_g=0,
                            off_p=ROWS * c if training else 0, off_st=0, off_w=w_off, sw=sw, off_b=b_off, sb=sb,
                            off_rm=rm_off, srm=srm, off_rv=rv_off, srv=srv,
                            off_f=0 if fac is None or factor[0] == FACTOR_PARAM else fac[1], batch=0, inv=1.0 / count,
                            eps=eps, momentum=momentum, unbias=unbias),
             grid(c * groups, lim))
    return factor, st_numel, sums, apply


@functools.lru_cache(maxsize=64)
def _grad_kernel(tout: str | None, tx: str | None, tg: str | None, sums: bool, tw: str | None,
                 tb: str | None) -> KernelSpec:
    """A backward: the types of the input gradient (None: not wanted), of x (None: not read), of g (None:
    not read), of the weight and bias gradients (None: not wanted), and whether there are gradient sums."""
    named = {"out": tout, "x": tx, "g": tg, "pa": "f32" if sums else None, "st": "f32", "gw": tw, "gb": tb}
    grads = (f"gw[ch] = {tw}(sgx * invstd); " if tw else "") + (f"gb[ch] = {tb}(sg);" if tb else "")
    if tout is None:
        body = ""
    elif tx is None:
        body = f"out[at] = {tout}(f32(g[p.off_g + at]) * k1);"
    else:
        body = f"out[at] = {tout}(f32(g[p.off_g + at]) * k1 + (f32(x[p.off_x + at]) - m) * k2 + k3);"
    return _APPLY.spec([t for t in named.values() if t is not None],
                       without=("wt", "bs", "rm", "rv", "em", "ev", "fac") +
                       tuple(k for k, t in named.items() if t is None),
                       MODE=2, PART="pa[i]" if sums else "0.0", STAT="st[p.off_st + r * p.c + ch]", GRADS=grads,
                       STORE="", RUNNING="", WEIGHT="1.0", BIAS="0.0", RMEAN="0.0", RVAR="0.0", BODY=body)


def backward(x: Tensor, g: Tensor, stats: Tensor, batch_stats: bool, need_x: bool, w_dtype: _dt.DType | None,
             b_dtype: _dt.DType | None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The input, weight and bias gradients (None where not asked for) of the batch norm of ``x`` with
    output gradient ``g`` and the forward's ``stats``. The weight and bias gradients are tensors of their
    own (they become the parameters' .grad without a copy). Two dispatches (one for an input gradient
    alone with running statistics).

    Arguments:
        x, g: contiguous [N, C, ...], not empty.
        stats: the forward's statistics (``forward``).
        batch_stats: whether they were x's own (the input gradient's two corrections).
        need_x: whether to compute the input gradient.
        w_dtype, b_dtype: the weight and bias gradients' dtypes, or None not to compute them.
    """
    n, c, inner = _shape(x)
    count = n * inner
    chunk, groups = _chunking(count, c)
    sums = w_dtype is not None or b_dtype is not None or batch_stats
    part = None
    if sums:
        part = _new((2 * c * groups,), _dt.float32, x)
        k, params, wg = _sums_launch(x.dtype.storage, g.dtype.storage, None, c, inner, count, chunk, groups,
                                     x.device.max_workgroups, 0, x._offset, g._offset, stats._offset + MEAN * c)
        x.device.dispatch(k, [t._storage.buffer for t in (part, x, g, stats)], params, wg)
    gx = _new(x.shape, x.dtype, x) if need_x else None
    gw, gb = (None if t is None else _new((c,), t, x) for t in (w_dtype, b_dtype))
    reads_x = need_x and batch_stats
    k = _grad_kernel(x.dtype.storage if need_x else None, x.dtype.storage if reads_x else None,
                     g.dtype.storage if need_x else None, sums, None if gw is None else gw.dtype.storage,
                     None if gb is None else gb.dtype.storage)
    bufs = [gx, x if reads_x else None, g if need_x else None, part, stats, gw, gb]
    x.device.dispatch(k, [t._storage.buffer for t in bufs if t is not None],
                      _APPLY.pack(c=c, inner=inner, count=count, chunk=chunk, groups=groups, off_x=x._offset,
                                  off_g=g._offset, off_p=0, off_st=stats._offset, off_w=0, sw=0, off_b=0, sb=0,
                                  off_rm=0, srm=0, off_rv=0, srv=0, off_f=0, batch=int(batch_stats), inv=1.0 / count,
                                  eps=0.0, momentum=0.0, unbias=0.0),
                      grid(c * groups, x.device.max_workgroups))
    return gx, gw, gb
