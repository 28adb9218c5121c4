"""Convolution layers: Conv1d and Conv2d (as torch.nn, weight [out, in / groups, *kernel]), and the transposed
convolutions ConvTranspose1d / ConvTranspose2d (weight [in, out / groups, *kernel]) with their functions."""

from __future__ import annotations

import math
from dataclasses import replace

from .. import creation, ops
from .. import dtypes as _dt
from ..autograd import Context, Function
from ..ops import conv as conv_ops
from ..ops.window import Window, pair, window
from ..tensor import Tensor, check_same_device
from . import functional as F
from . import init
from .module import Module
from .parameter import Parameter


def _check_channels(name: str, nd: int, in_channels: int, out_channels: int, groups: int, padding_mode: str,
                    kernel_size) -> tuple[int, ...]:
    """The checks a convolution and a transposed one share; returns the kernel size as an nd-tuple."""
    if in_channels < 1 or out_channels < 1 or groups < 1:
        raise ValueError(f"{name}: channels and groups must be positive, got in_channels={in_channels}, "
                         f"out_channels={out_channels}, groups={groups}")
    if in_channels % groups or out_channels % groups:
        raise ValueError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                         f"divisible by groups ({groups})")
    if padding_mode != "zeros":
        raise ValueError(f"{name}: only padding_mode='zeros' is supported, got {padding_mode!r}")
    return _tuple(kernel_size, nd, "kernel_size", name)


class _ConvNd(Module):
    _nd = 0

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        name = type(self).__name__
        kernel = _check_channels(name, self._nd, in_channels, out_channels, groups, padding_mode, kernel_size)
        if isinstance(padding, str) and padding not in ("valid", "same"):
            raise ValueError(f"{name}: padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel
        self.stride = _tuple(stride, self._nd, "stride", name)
        self.padding = padding if isinstance(padding, str) else _tuple(padding, self._nd, "padding", name)
        self.dilation = _tuple(dilation, self._nd, "dilation", name)
        self.groups, self.padding_mode = groups, padding_mode
        if padding == "same" and any(s != 1 for s in self.stride):
            raise ValueError(f"{name}: padding='same' needs stride 1, got stride {self.stride}")
        self.weight = Parameter(creation.empty(out_channels, in_channels // groups, *kernel, dtype=dtype,
                                               device=device))
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # torch's default
        if bias:
            self.bias = Parameter(creation.empty(out_channels, dtype=dtype, device=device))
            bound = 1.0 / math.sqrt(in_channels // groups * math.prod(kernel))
            init.uniform_(self.bias, -bound, bound)
        else:
            self.bias = None

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self._nd:
            s += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1,) * self._nd:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")


def _tuple(v, n: int, what: str, name: str) -> tuple[int, ...]:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
    if len(t) != n or not all(isinstance(x, int) and not isinstance(x, bool) for x in t):
        raise ValueError(f"{name}: {what} must be an int or a tuple of {n} ints, got {v!r}")
    return t


class Conv1d(_ConvNd):
    """1-d convolution over [N, C_in, L] (or [C_in, L]) to [N, C_out, L_out], as ``torch.nn.Conv1d``.

    Arguments:
        in_channels, out_channels: channels of the input and the output.
        kernel_size, stride, dilation: ints (or 1-tuples).
        padding: zeros on both sides: an int, 'valid' or 'same'.
        groups: independent channel groups (groups = in_channels: depthwise).
        bias: add a learned bias per output channel.
        padding_mode: only 'zeros'.
        device, dtype: of the parameters.
    """

    _nd = 1

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    """2-d convolution over [N, C_in, H, W] (or [C_in, H, W]) to [N, C_out, H_out, W_out], as
    ``torch.nn.Conv2d``; runs as im2col + matmul (docs/design.md, "Convolution").

    Arguments:
        in_channels, out_channels: channels of the input and the output.
        kernel_size, stride, dilation: ints or pairs.
        padding: zeros on both sides of each dim: an int, a pair, 'valid' or 'same'.
        groups: independent channel groups (groups = in_channels: depthwise).
        bias: add a learned bias per output channel.
        padding_mode: only 'zeros'.
        device, dtype: of the parameters.
    """

    _nd = 2

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2dFn(Function):
    """The transposed 2-d convolution, the adjoint of conv2d over ``win`` (ops/conv.py): its input gradient is
    conv2d of the output gradient, its weight gradient conv2d's weight gradient with the roles of input and
    output gradient swapped. ``apply(x, weight, bias, win, groups)``, checked by the caller."""

    name = "conv_transpose2d"

    @staticmethod
    def forward(ctx: Context, x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int) -> Tensor:
        ctx.win, ctx.groups = win, groups
        ctx.save_for_backward(x, weight)
        return conv_ops.conv_transpose2d(x, weight, bias, win, groups)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx = conv_ops.conv2d(g, weight, None, ctx.win, ctx.groups) if need_x else None
        gw = conv_ops.conv2d_backward(g, weight, x, ctx.win, ctx.groups, False, True, False)[1] if need_w else None
        gb = ops.reduce("sum", ops.reshape(g, (g.shape[0], g.shape[1], -1)), (0, 2)) if need_b else None
        return gx, gw, gb, None, None


def _conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, output_padding, groups: int,
                    dilation, nd: int) -> Tensor:
    op = f"conv_transpose{nd}d"
    if not isinstance(x, Tensor) or x.ndim not in (nd + 1, nd + 2):
        dims = "[N, C, L] or [C, L]" if nd == 1 else "[N, C, H, W] or [C, H, W]"
        raise ValueError(f"{op}: expected an input of shape {dims}, got {getattr(x, 'shape', type(x).__name__)}")
    if not isinstance(weight, Tensor) or weight.ndim != nd + 2:
        raise ValueError(f"{op}: weight must be a Tensor of {nd + 2} dims [in, out / groups, *kernel], got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    check_same_device(x, weight, *(() if bias is None else (bias,)), op=op)
    for t in (weight, bias):
        if not x.dtype.is_float or (t is not None and t.dtype is not x.dtype):
            raise TypeError(f"{op}: input ({x.dtype.name}), weight ({weight.dtype.name}) and bias "
                            f"({bias.dtype.name if bias is not None else 'none'}) must have one float dtype")
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    n, c = x.shape[:2]
    if weight.shape[0] != c or c % groups:
        raise ValueError(f"{op}: input of shape {x.shape} ({c} channels) and weight of shape {weight.shape} do not "
                         f"fit groups={groups}: need in_channels = weight.shape[0], divisible by groups")
    c_out = weight.shape[1] * groups
    if bias is not None and bias.shape != (c_out,):
        raise ValueError(f"{op}: bias of shape {bias.shape} for {c_out} output channels")
    if nd == 1:  # a row of one: [N, C, 1, L] with a 1 x k kernel
        x, weight = x.unsqueeze(2), weight.unsqueeze(2)
        stride, padding, output_padding, dilation = ((lead, _tuple(v, 1, what, op)[0]) for v, what, lead in (
            (stride, "stride", 1), (padding, "padding", 0), (output_padding, "output_padding", 0),
            (dilation, "dilation", 1)))
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = (pair(v, what, op) for v, what in (
        (stride, "stride"), (padding, "padding"), (output_padding, "output_padding"), (dilation, "dilation")))
    kh, kw = weight.shape[2:]
    if not (0 <= oph < max(sh, dh) and 0 <= opw < max(sw, dw)):
        raise ValueError(f"{op}: output_padding {(oph, opw)} must be >= 0 and smaller than stride {(sh, sw)} or "
                         f"dilation {(dh, dw)}")
    h, w = x.shape[2:]
    out_h = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    out_w = (w - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"{op}: input of size {h}x{w} gives an output of size {out_h}x{out_w} (padding "
                         f"{(ph, pw)} too large)")
    # The adjoint conv's window, its output cut to the input's size: where output_padding >= stride (it may
    # while below dilation) that conv would see more positions than the input has, which hold nothing here.
    win = replace(window((n, c_out, out_h, out_w), (kh, kw), (sh, sw), (ph, pw), (dh, dw), op), oh=h, ow=w)
    y = ConvTranspose2dFn.apply(x, weight, bias, win, groups)
    if nd == 1:
        y = y.squeeze(2)
    return y.squeeze(0) if unbatched else y


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """1-d transposed convolution of ``input`` [N, C_in, L] (or [C_in, L]) with ``weight`` [C_in, C_out / groups, k]:
    [N, C_out, (L - 1) stride - 2 padding + dilation (k - 1) + output_padding + 1], as
    ``torch.nn.functional.conv_transpose1d`` (conv1d's adjoint; runs as the 2-d one of height 1).

    Arguments:
        input: the input, float.
        weight: the filters, input's dtype.
        bias: [C_out] or None.
        stride, padding, dilation: as the convolution this is the adjoint of (ints or 1-tuples).
        output_padding: extra size on one side of the output, smaller than stride or dilation.
        groups: split channels into this many independent groups.
    """
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 1)


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """2-d transposed convolution of ``input`` [N, C_in, H, W] (or [C_in, H, W]) with ``weight``
    [C_in, C_out / groups, kh, kw], as ``torch.nn.functional.conv_transpose2d``: the adjoint of conv2d (its
    input gradient), output size (H - 1) stride - 2 padding + dilation (kh - 1) + output_padding + 1 per dim.
    Runs as weight^T @ input per chunk of images and col2im (docs/design.md, "Convolution"); its input gradient
    is a conv2d.

    Arguments:
        input: the input, float.
        weight: the filters, input's dtype.
        bias: [C_out] or None.
        stride, padding, dilation: as the convolution this is the adjoint of (ints or pairs).
        output_padding: extra rows / columns after the output, smaller than stride or dilation (an int or a pair).
        groups: split channels into this many independent groups.
    """
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 2)


class _ConvTransposeNd(Module):
    _nd = 0

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        name = type(self).__name__
        kernel = _check_channels(name, self._nd, in_channels, out_channels, groups, padding_mode, kernel_size)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel
        self.stride = _tuple(stride, self._nd, "stride", name)
        self.padding = _tuple(padding, self._nd, "padding", name)
        self.output_padding = _tuple(output_padding, self._nd, "output_padding", name)
        self.dilation = _tuple(dilation, self._nd, "dilation", name)
        self.groups, self.padding_mode = groups, padding_mode
        self.weight = Parameter(creation.empty(in_channels, out_channels // groups, *kernel, dtype=dtype,
                                               device=device))
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # torch's default (fan_in from weight.shape[1])
        if bias:
            self.bias = Parameter(creation.empty(out_channels, dtype=dtype, device=device))
            bound = 1.0 / math.sqrt(init.fan_in(self.weight))
            init.uniform_(self.bias, -bound, bound)
        else:
            self.bias = None

    def _output_padding(self, x: Tensor, output_size) -> tuple[int, ...]:
        """torch's choice of output_padding for a requested ``output_size`` (the trailing spatial sizes)."""
        if output_size is None:
            return self.output_padding
        name = type(self).__name__
        want = tuple(output_size)[-self._nd:]
        spatial = x.shape[-self._nd:]
        pads = []
        for i, (size, target) in enumerate(zip(spatial, want)):
            least = (size - 1) * self.stride[i] - 2 * self.padding[i] + self.dilation[i] * (self.kernel_size[i] - 1) + 1
            if not least <= target < least + max(self.stride[i], self.dilation[i]):
                raise ValueError(f"{name}: output_size {tuple(output_size)} is not reachable from input {x.shape}: "
                                 f"dim {i} can be {least} to {least + max(self.stride[i], self.dilation[i]) - 1}")
            pads.append(target - least)
        return tuple(pads)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self._nd:
            s += f", padding={self.padding}"
        if self.output_padding != (0,) * self._nd:
            s += f", output_padding={self.output_padding}"
        if self.dilation != (1,) * self._nd:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")


class ConvTranspose1d(_ConvTransposeNd):
    """1-d transposed convolution over [N, C_in, L] (or [C_in, L]), as ``torch.nn.ConvTranspose1d``: weight
    [in_channels, out_channels / groups, k]; ``forward(input, output_size=None)`` (output_size picks
    output_padding, as torch).

    Arguments:
        in_channels, out_channels: channels of the input and the output.
        kernel_size, stride, padding, dilation: ints (or 1-tuples), as the convolution this is the adjoint of.
        output_padding: extra size after the output, smaller than stride or dilation.
        groups: independent channel groups.
        bias: add a learned bias per output channel.
        padding_mode: only 'zeros'.
        device, dtype: of the parameters.
    """

    _nd = 1

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        return conv_transpose1d(input, self.weight, self.bias, self.stride, self.padding,
                                self._output_padding(input, output_size), self.groups, self.dilation)


class ConvTranspose2d(_ConvTransposeNd):
    """2-d transposed convolution over [N, C_in, H, W] (or [C_in, H, W]), as ``torch.nn.ConvTranspose2d``:
    weight [in_channels, out_channels / groups, kh, kw]; ``forward(input, output_size=None)`` (output_size picks
    output_padding, as torch). The adjoint of Conv2d, run by its machinery (``conv_transpose2d``).

    Arguments:
        in_channels, out_channels: channels of the input and the output.
        kernel_size, stride, padding, dilation: ints or pairs, as the convolution this is the adjoint of.
        output_padding: extra rows / columns after the output, smaller than stride or dilation.
        groups: independent channel groups.
        bias: add a learned bias per output channel.
        padding_mode: only 'zeros'.
        device, dtype: of the parameters.
    """

    _nd = 2

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        return conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                self._output_padding(input, output_size), self.groups, self.dilation)
