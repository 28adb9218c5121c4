"""2-d convolution as im2col + the tuned matmul, and its gradients (col2im for the input's).

For groups G, the weight [O, C/G, kh, kw] is the matrix [G, O/G, K] with K = C/G * kh * kw, and
im2col (shaders/conv_im2col.wgsl) writes the input patches as [G, K, B * oh * ow] for a chunk of B
images, so one batched matmul gives [G, O/G, B * oh * ow]: the output channels, then images and
positions, which a permuting copy puts in [B, O, oh, ow] order (adding the bias on the way).
Backward: the weight's gradient is grad [G, O/G, B*L] @ cols^T, the patches' gradient weight^T @
grad, and col2im (conv_col2im.wgsl) sums each input element's taps from it. Batches whose patches
would pass ``WORKSPACE_BYTES`` run in chunks of images. docs/design.md ("Convolution") says why.
"""

from __future__ import annotations

from ..runtime.kernels import WORKGROUP, Kernel, grid
from ..tensor import Tensor
from .arith import inplace
from .elementwise import contiguous, copy_, fill, run_map
from .matmul import matmul
from .reduce import reduce
from .shape import narrow, permute, reshape, transpose
from .window import Window

_WINDOW = "c: u32, h: u32, w: u32, kh: u32, kw: u32, sh: u32, sw: u32, ph: u32, pw: u32, dh: u32, dw: u32, " \
          "oh: u32, ow: u32"
_IM2COL = Kernel("conv_im2col", "cols: w, x: r", f"total: u32, cols: u32, off_x: u32, {_WINDOW}")
_COL2IM = Kernel("conv_col2im", "gx: w, gcols: r", f"total: u32, cols: u32, off_gx: u32, {_WINDOW}")
# Most bytes of patches held at once: a larger batch runs in chunks of images.
WORKSPACE_BYTES = 64 << 20


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


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int) -> Tensor:
    """The convolution [N, O, oh, ow] of ``x`` [N, C, H, W] with ``weight`` [O, C / groups, kh, kw]
    (sizes and dtypes checked by the caller), plus ``bias`` [O].

    Arguments:
        x, weight, bias: the operands, one float dtype.
        win: the window (``window.window``).
        groups: input and output channels split into this many independent groups.
    """
    o = weight.shape[0]
    if win.n == 0:
        return Tensor.empty((0, o, win.oh, win.ow), x.dtype, x.device)
    g, og, kg = groups, o // groups, weight.numel() // o
    x = contiguous(x)
    w3 = reshape(contiguous(weight), (g, og, kg))
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


def conv2d_backward(x: Tensor, weight: Tensor, g: Tensor, win: Window, groups: int, need_x: bool, need_w: bool,
                    need_b: bool) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(input, weight, bias) gradients of ``conv2d`` for the output gradient ``g``; None where not needed.

    Arguments:
        x, weight: the forward's operands.
        g: the output's gradient [N, O, oh, ow].
        win, groups: as for ``conv2d``.
        need_x, need_w, need_b: which gradients to compute.
    """
    o = weight.shape[0]
    gr, og, kg = groups, o // groups, weight.numel() // o
    x = contiguous(x)
    w3 = reshape(contiguous(weight), (gr, og, kg))
    g4 = reshape(contiguous(g), (win.n, gr, og, win.positions))
    gx = Tensor.empty(x.shape, x.dtype, x.device) if need_x else None
    gw = gb = None
    for n0, nb in chunks(win, x):
        cols_n = nb * win.positions
        gy = reshape(contiguous(permute(narrow(g4, 0, n0, nb), (1, 2, 0, 3))), (gr, og, cols_n))
        if need_w:
            cols = reshape(im2col(x, win, n0, nb), (gr, kg, cols_n))
            part = matmul(gy, transpose(cols, -2, -1))
            gw = part if gw is None else inplace("add", gw, part)
        if need_b:
            part = reduce("sum", reshape(gy, (o, cols_n)), 1)
            gb = part if gb is None else inplace("add", gb, part)
        if need_x:
            gcols = matmul(transpose(w3, -2, -1), gy)  # [G, Kg, nb * L]
            col2im_into(gx, gcols, win, n0, nb)
    if win.n == 0:  # no images: nothing flowed into the weight and bias
        gw = fill((gr, og, kg), 0.0, weight.dtype, weight.device) if need_w else None
        gb = fill((o,), 0.0, g.dtype, g.device) if need_b else None
    return gx, None if gw is None else reshape(gw, weight.shape), gb


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int) -> Tensor:
    """The transposed convolution [N, C, H, W] of ``x`` [N, O, oh, ow] with ``weight`` [O, C / groups, kh, kw]
    (sizes and dtypes checked by the caller), plus ``bias`` [C]: the adjoint of ``conv2d`` over ``win`` (whose
    input is this output), so exactly ``conv2d_backward``'s input gradient for the output gradient ``x``:
    weight^T @ x per chunk of images, summed back by col2im.

    Arguments:
        x, weight, bias: the operands, one float dtype.
        win: the window of the convolution this is the adjoint of (``win.oh, win.ow`` = x's spatial size).
        groups: channels split into this many independent groups.
    """
    o = weight.shape[0]
    gr, og, kg = groups, o // groups, weight.numel() // o
    out = Tensor.empty((win.n, win.c, win.h, win.w), x.dtype, x.device)
    if win.n == 0:
        return out
    w3t = transpose(reshape(contiguous(weight), (gr, og, kg)), -2, -1)
    x4 = reshape(contiguous(x), (win.n, gr, og, win.positions))
    for n0, nb in chunks(win, out):
        xs = reshape(contiguous(permute(narrow(x4, 0, n0, nb), (1, 2, 0, 3))), (gr, og, nb * win.positions))
        col2im_into(out, matmul(w3t, xs), win, n0, nb)
    if bias is not None:
        inplace("add", out, reshape(bias, (1, win.c, 1, 1)))
    return out
