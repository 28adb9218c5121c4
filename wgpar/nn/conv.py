"""Convolution layers: Conv1d and Conv2d (as torch.nn, weight [out, in / groups, *kernel]), and the transposed
convolutions ConvTranspose1d / ConvTranspose2d (weight [in, out / groups, *kernel]); their functions are in
nn/functional.py."""

from __future__ import annotations

import math

from .. import creation
from .. import dtypes as _dt
from ..tensor import Tensor
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
    ``torch.nn.Conv2d``; runs as implicit GEMM, a depthwise kernel or a matmul (docs/design.md, "Convolution").

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
        return F.conv_transpose1d(input, self.weight, self.bias, self.stride, self.padding,
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
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                self._output_padding(input, output_size), self.groups, self.dilation)
