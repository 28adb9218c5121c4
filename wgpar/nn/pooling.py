"""Pooling layers: MaxPool2d, AvgPool2d and AdaptiveAvgPool2d (as torch.nn)."""

from __future__ import annotations

from ..tensor import Tensor
from . import functional as F
from .module import Module


class MaxPool2d(Module):
    """2-d max pooling over [N, C, H, W] (or [C, H, W]), as ``torch.nn.MaxPool2d``; NaN propagates.

    Arguments:
        kernel_size: the window, an int or a pair.
        stride: the step (default: kernel_size).
        padding: implicit -inf on both sides, at most half the kernel.
        dilation: spacing of the window's taps.
        return_indices: also return the int32 index of each maximum in its plane.
        ceil_mode: round the output size up.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.padding, self.dilation = kernel_size, padding, dilation
        self.stride = kernel_size if stride is None else stride
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x: Tensor):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """2-d average pooling over [N, C, H, W] (or [C, H, W]), as ``torch.nn.AvgPool2d``.

    Arguments:
        kernel_size: the window, an int or a pair.
        stride: the step (default: kernel_size).
        padding: implicit zeros on both sides, at most half the kernel.
        ceil_mode: round the output size up.
        count_include_pad: count the padding in the divisor.
        divisor_override: divide every window by this instead.
    """

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> None:
        super().__init__()
        self.kernel_size, self.padding = kernel_size, padding
        self.stride = kernel_size if stride is None else stride
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Average pooling of [N, C, H, W] (or [C, H, W]) to a fixed output size, as ``torch.nn.AdaptiveAvgPool2d``
    (see ``functional.adaptive_avg_pool2d``).

    Arguments:
        output_size: an int, or a pair whose None entries keep the input's size.
    """

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = tuple(output_size) if isinstance(output_size, list) else output_size

    def forward(self, x: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
