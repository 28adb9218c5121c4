"""Functional forms of the layers and losses (``wgpar.nn.functional``, as in torch.nn.functional)."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import replace

import numpy as np

from .. import creation, ops
from .. import dtypes as _dt
from ..autograd import differentiable as D
from ..autograd.autocast_mode import is_autocast_enabled
from ..autograd.engine import record
from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..autograd.nn_ops import (
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm,
    Conv2d,
    ConvTranspose2d,
    CrossEntropy,
    Dropout,
    max_pool2d_with_indices,
)
from ..ops import attention as _fused_attention
from ..ops.elementwise import contiguous as _raw_contiguous
from ..ops.index import _raise_if_out_of_range, as_index, index_add_rows
from ..ops.layer_norm import layer_norm_backward, layer_norm_forward
from ..ops.loss import class_targets
from ..ops.pool import adaptive_fits
from ..ops.window import pair, window
from ..tensor import Tensor, check_same_device


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with weight [out_features, in_features]; the transpose is a view."""
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: input of shape {x.shape} does not match weight of shape {weight.shape} "
                         f"(in_features {weight.shape[-1]})")
    lead = x.shape[:-1]
    if x.ndim > 2:  # [batch, seq, in] as one [batch * seq, in] product: the weight's gradient is then one
        x = D.reshape(x, (-1, x.shape[-1]))  # matmul over all rows, not a product per batch entry summed after
    y = D.linear(x, weight, bias)  # a 1-d x goes through matmul and add there
    return D.reshape(y, lead + (weight.shape[0],)) if len(lead) != 1 else y


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """``max(x, 0)`` elementwise (NaN stays NaN). Differs from torch: ``inplace=True`` raises ValueError."""
    _no_inplace(inplace, "relu")
    return D.unary("relu", input)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU: ``x * Phi(x)`` exactly (``approximate="none"``) or with PyTorch's tanh approximation
    (``approximate="tanh"``, GPT-2's ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``)."""
    if approximate == "none":
        return D.unary("gelu", x)
    if approximate == "tanh":
        return D.unary("gelu_tanh", x)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def tanh(input: Tensor) -> Tensor:
    """``tanh(x)`` elementwise."""
    return D.unary("tanh", input)


def sigmoid(input: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))`` elementwise."""
    return D.unary("sigmoid", input)


def _no_inplace(inplace: bool, op: str) -> None:
    if inplace:
        raise ValueError(f"{op}: inplace=True is not supported (wgpar's activations return a new tensor; "
                         f"write x = {op}(x))")


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """SiLU (swish): ``x * sigmoid(x)`` elementwise, as ``torch.nn.functional.silu``.

    Differs from torch: ``inplace=True`` raises.
    """
    _no_inplace(inplace, "silu")
    return D.binary("mul", input, D.unary("sigmoid", input))


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """``x`` where ``x > 0``, else ``negative_slope * x``, as ``torch.nn.functional.leaky_relu`` (the
    gradient at 0 is ``negative_slope``, as torch's; NaN stays NaN).

    Differs from torch: ``inplace=True`` raises.
    """
    _no_inplace(inplace, "leaky_relu")
    return D.where(ops.binary("gt", input, 0.0), input, D.binary("mul", input, float(negative_slope)))


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``, as ``torch.nn.functional.elu`` (the gradient
    at 0 is ``alpha``, as torch's).

    Differs from torch: ``inplace=True`` raises.
    """
    _no_inplace(inplace, "elu")
    pos = ops.binary("gt", input, 0.0)
    # expm1 only of the non-positive side: exp of a large x would be inf, and inf * a zero gradient NaN.
    neg = D.where(pos, 0.0, input)
    return D.where(pos, input, D.binary("mul", D.unary("expm1", neg), float(alpha)))


def _implicit_softmax_dim(name: str, ndim: int, stacklevel: int) -> int:
    """torch's ``_get_softmax_dim`` for a call without ``dim``: 0 for 0-, 1- and 3-d input (3-d taken as an
    unbatched [C, H, W]), else 1, with torch's deprecation warning (the last dim would silently differ)."""
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as "
                  f"an argument.", UserWarning, stacklevel=stacklevel + 1)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim`` (a row holding a NaN gives NaN); without ``dim``, torch's
    implicit (deprecated) choice, with its warning: dim 0 for 0-, 1- and 3-d input, else dim 1. ``dtype``
    converts the input first, as torch."""
    x = input if dtype is None else input.to(dtype)
    if dim is None:
        dim = _implicit_softmax_dim("softmax", x.ndim, 2)
    return D.softmax(x, dim, log=False)


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """``x - logsumexp(x)`` along ``dim``, computed stably in one kernel; without ``dim``, torch's implicit
    choice as in :func:`softmax`; ``dtype`` converts the input first."""
    x = input if dtype is None else input.to(dtype)
    if dim is None:
        dim = _implicit_softmax_dim("log_softmax", x.ndim, 2)
    return D.softmax(x, dim, log=True)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability p (a fresh mask per call, seeded by wgpar.manual_seed). Differs from
    torch: ``inplace=True`` raises ValueError; the masks differ from torch's for the same seed."""
    _no_inplace(inplace, "dropout")
    x = input
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return D.binary("mul", x, 0.0)
    if not x.dtype.is_float:
        raise TypeError(f"dropout needs a float tensor, got {x.dtype.name}")
    return Dropout.apply(x, p, int(creation.generator().integers(0, 2**32)))


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels: each [N, C] plane of ``input`` [N, C, H, W] (or [C, H, W]) is zeroed with
    probability ``p`` and the rest scaled by 1 / (1 - p), as ``torch.nn.functional.dropout2d``; masks
    come from wgpar.manual_seed.

    torch's deprecated inputs behave as torch's, with its warnings: 3-d input is taken as [N, C, L]
    (channel-wise 1-d dropout), 2-d input as plain elementwise dropout.

    Differs from torch: ``inplace=True`` raises.
    """
    _no_inplace(inplace, "dropout2d")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not isinstance(input, Tensor) or input.ndim not in (2, 3, 4):
        raise ValueError(f"dropout2d: expected a 2-, 3- or 4-d Tensor, got "
                         f"{getattr(input, 'shape', type(input).__name__)}")
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout "
                      "behavior is desired - input is interpreted as shape (N, C, L), where C is the channel "
                      "dim. This behavior will change in a future release to interpret the input as one "
                      "without a batch dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise "
                      "dropout behavior, please switch to using dropout1d instead.", UserWarning, stacklevel=2)
    elif input.ndim == 2:
        warnings.warn("dropout2d: Received a 2-D input to dropout2d, which is deprecated and will result in an "
                      "error in a future release. To retain the behavior and silence this warning, please use "
                      "dropout instead.", UserWarning, stacklevel=2)
    if not training or p == 0.0:
        return input
    if not input.dtype.is_float:
        raise TypeError(f"dropout2d needs a float tensor, got {input.dtype.name}")
    planes = input.shape[:2] if input.ndim > 2 else input.shape
    # One draw per channel on the host (N * C numbers), uploaded as a broadcast [N, C, 1, ...] scale.
    keep = creation.generator().random(planes) >= p
    scale = keep / (1.0 - p) if p < 1.0 else np.zeros(planes)
    mask = Tensor.from_numpy(scale.reshape(planes + (1,) * (input.ndim - len(planes))), device=input.device,
                             dtype=input.dtype)
    return D.binary("mul", input, mask)


def _batched(x, nd: int, op: str) -> tuple[Tensor, bool]:
    """``x`` with a batch dim (added when x has ``nd + 1`` dims, as torch takes unbatched inputs)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: input must be a wgpar.Tensor, got {type(x).__name__}")
    if x.ndim not in (nd + 1, nd + 2):
        dims = "[N, C, L] or [C, L]" if nd == 1 else "[N, C, H, W] or [C, H, W]"
        raise ValueError(f"{op}: expected an input of shape {dims}, got {x.shape}")
    if not x.dtype.is_float:
        raise TypeError(f"{op}: needs a float input, got {x.dtype.name}")
    return (D.unsqueeze(x, 0), True) if x.ndim == nd + 1 else (x, False)


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, dilation, groups: int, nd: int) -> Tensor:
    op = f"conv{nd}d"
    x, unbatched = _batched(x, nd, op)
    if not isinstance(weight, Tensor) or weight.ndim != nd + 2:
        raise ValueError(f"{op}: weight must be a Tensor of {nd + 2} dims [out, in / groups, *kernel], got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    check_same_device(x, weight, *(() if bias is None else (bias,)), op=op)
    out_dtype = _conv_dtypes(x, weight, bias, op)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    c, o = x.shape[1], weight.shape[0]
    if c % groups or o % groups or weight.shape[1] * groups != c:
        raise ValueError(f"{op}: input of shape {x.shape} ({c} channels) and weight of shape {weight.shape} do not "
                         f"fit groups={groups}: need in_channels = weight.shape[1] * groups and out_channels "
                         f"divisible by groups")
    if bias is not None and bias.shape != (o,):
        raise ValueError(f"{op}: bias of shape {bias.shape} for {o} output channels")
    if nd == 1:  # a row of one: [N, C, 1, L] with a 1 x k kernel
        x, weight = D.unsqueeze(x, 2), D.unsqueeze(weight, 2)
        stride, dilation = (1, _single(stride, "stride", op)), (1, _single(dilation, "dilation", op))
        if not isinstance(padding, str):
            padding = (0, _single(padding, "padding", op))
    kernel = weight.shape[2:]
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same":
            if pair(stride, "stride", op) != (1, 1):
                raise ValueError(f"{op}: padding='same' needs stride 1, got stride {stride}")
            totals = [d * (k - 1) for d, k in zip(pair(dilation, "dilation", op), kernel)]
            padding = tuple((t // 2, t - t // 2) for t in totals)  # the odd one after, as torch pads
        else:
            raise ValueError(f"{op}: padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
    win = window(x.shape, kernel, stride, padding, dilation, op)  # (checks stride and dilation)
    y = Conv2d.apply(x, weight, bias, win, groups, out_dtype)
    if nd == 1:
        y = D.squeeze(y, 2)
    return D.squeeze(y, 0) if unbatched else y


def _conv_dtypes(x: Tensor, weight: Tensor, bias: Tensor | None, op: str):
    """The result's dtype of a convolution: float16 inside autocast (as torch's; each operand is read in its
    own dtype, float32 master weights included, so no float16 copies are made), else the operands' one dtype."""
    if bias is not None and not isinstance(bias, Tensor):  # (the callers checked the weight)
        raise TypeError(f"{op}: bias must be a wgpar.Tensor or None, got {type(bias).__name__}")
    if is_autocast_enabled() and all(t is None or t.dtype.is_float for t in (x, weight, bias)):
        return D.autocast_dtype(x.device)
    if not x.dtype.is_float or any(t is not None and t.dtype is not x.dtype for t in (weight, bias)):
        raise TypeError(f"{op}: input ({x.dtype.name}), weight ({weight.dtype.name}) and bias "
                        f"({bias.dtype.name if bias is not None else 'none'}) must have one float dtype")
    return None


def _single(v, what: str, op: str):
    if not isinstance(v, (tuple, list)):
        return v
    if len(v) != 1:
        raise ValueError(f"{op}: {what} must be an int or a 1-tuple, got {tuple(v)}")
    return v[0]


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """1-d convolution (cross-correlation, as torch) of ``input`` [N, C, L] (or [C, L]) with ``weight``
    [O, C / groups, k]: [N, O, L_out]. Runs as a 2-d convolution of height 1.

    Arguments:
        input: the input, float.
        weight: the filters, input's dtype.
        bias: [O] or None.
        stride, dilation: an int (or 1-tuple), >= 1.
        padding: zeros on both sides: an int, 'valid' (none) or 'same' (output length L, stride 1).
        groups: split channels into this many independent groups (groups = C: depthwise).
    """
    return _conv(input, weight, bias, stride, padding, dilation, groups, 1)


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """2-d convolution (cross-correlation, as torch) of ``input`` [N, C, H, W] (or [C, H, W]) with
    ``weight`` [O, C / groups, kh, kw]: [N, O, H_out, W_out]. Runs as implicit GEMM on the tuned
    matmul's tiles, a depthwise kernel or a plain matmul for 1x1 (docs/design.md, "Convolution").

    Arguments:
        input: the input, float.
        weight: the filters, input's dtype.
        bias: [O] or None.
        stride, dilation: an int or a pair, >= 1.
        padding: zeros on both sides of each dim: an int, a pair, 'valid' or 'same' (stride 1).
        groups: split channels into this many independent groups (groups = C: depthwise).
    """
    return _conv(input, weight, bias, stride, padding, dilation, groups, 2)


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
    out_dtype = _conv_dtypes(x, weight, bias, op)
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
        stride, padding, output_padding, dilation = ((lead, _single(v, what, op)) for v, what, lead in (
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
    y = ConvTranspose2d.apply(x, weight, bias, win, groups, out_dtype)
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
    Runs as conv2d's input gradient (docs/design.md, "Convolution"); its input gradient is a conv2d.

    Arguments:
        input: the input, float.
        weight: the filters, input's dtype.
        bias: [C_out] or None.
        stride, padding, dilation: as the convolution this is the adjoint of (ints or pairs).
        output_padding: extra rows / columns after the output, smaller than stride or dilation (an int or a pair).
        groups: split channels into this many independent groups.
    """
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 2)


def _pool_window(x: Tensor, kernel_size, stride, padding, dilation, ceil_mode: bool, op: str):
    stride = kernel_size if stride is None or (isinstance(stride, (tuple, list)) and not stride) else stride
    win = window(x.shape, kernel_size, stride, padding, dilation, op, ceil_mode)
    if 2 * win.ph > (win.kh - 1) * win.dh + 1 or 2 * win.pw > (win.kw - 1) * win.dw + 1:
        for pad, extent in ((win.ph, (win.kh - 1) * win.dh + 1), (win.pw, (win.kw - 1) * win.dw + 1)):
            if 2 * pad > extent:
                raise ValueError(f"{op}: padding {pad} is more than half the kernel's extent {extent}")
    return win


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """2-d max pooling of ``input`` [N, C, H, W] (or [C, H, W]); a NaN in a window gives NaN, as in torch.

    Arguments:
        input: a float tensor.
        kernel_size: the window, an int or a pair.
        stride: the step (default: kernel_size).
        padding: implicit -inf on both sides, at most half the kernel.
        dilation: spacing of the window's taps.
        ceil_mode: round the output size up (windows starting inside the input or the left padding).
        return_indices: also return each output's int32 index h * W + w in its plane (torch: int64).
    """
    x, unbatched = _batched(input, 2, "max_pool2d")
    win = _pool_window(x, kernel_size, stride, padding, dilation, ceil_mode, "max_pool2d")
    out, idx = max_pool2d_with_indices(x, win)
    if unbatched:
        out, idx = D.squeeze(out, 0), ops.squeeze(idx, 0)
    return (out, idx) if return_indices else out


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """2-d average pooling of ``input`` [N, C, H, W] (or [C, H, W]), with torch's divisors.

    Arguments:
        input: a float tensor.
        kernel_size: the window, an int or a pair.
        stride: the step (default: kernel_size).
        padding: implicit zeros on both sides, at most half the kernel.
        ceil_mode: round the output size up.
        count_include_pad: count the padding in the divisor.
        divisor_override: divide every window by this instead.
    """
    x, unbatched = _batched(input, 2, "avg_pool2d")
    if divisor_override is not None and (isinstance(divisor_override, bool) or not isinstance(divisor_override, int)
                                         or divisor_override < 1):
        raise ValueError(f"avg_pool2d: divisor_override must be a positive int, got {divisor_override!r}")
    win = _pool_window(x, kernel_size, stride, padding, 1, ceil_mode, "avg_pool2d")
    out = AvgPool2d.apply(x, win, bool(count_include_pad), divisor_override)
    return D.squeeze(out, 0) if unbatched else out


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """Average pooling of ``input`` [N, C, H, W] (or [C, H, W]) to ``output_size`` (an int, or a pair whose
    None entries keep the input's size), as ``torch.nn.functional.adaptive_avg_pool2d``: output row i
    averages input rows ``floor(i * H / H_out)`` to ``ceil((i + 1) * H / H_out)``, and so for columns.
    One thread per output (an output of 1x1 from large planes: a mean of each plane), the gradient one thread
    per 4 input elements of a row (``ops.pool.adaptive_avg_pool2d``); windows past the loop limit run as two
    matmuls with the (host-built) averaging matrices."""
    x, unbatched = _batched(input, 2, "adaptive_avg_pool2d")
    in_hw = x.shape[2:]
    try:
        out_hw = _adaptive_size(tuple(output_size) if isinstance(output_size, list) else output_size, in_hw)
    except TypeError:  # unhashable: no int or pair of them
        raise ValueError(f"adaptive_avg_pool2d: output_size must be an int or a pair, got {output_size!r}") from None
    if adaptive_fits(in_hw, out_hw) and x.numel():
        y = AdaptiveAvgPool2d.apply(x, out_hw)
        return D.squeeze(y, 0) if unbatched else y
    rows, cols = (_averaging(n, int(m), x.dtype, x.device) for n, m in zip(x.shape[2:], out_hw))
    y = D.matmul(D.matmul(rows, x), D.transpose(cols, 0, 1))
    return D.squeeze(y, 0) if unbatched else y


@functools.lru_cache(maxsize=256)
def _adaptive_size(output_size, in_hw: tuple[int, int]) -> tuple[int, int]:
    """adaptive_avg_pool2d's (rows, columns) out of ``output_size`` for an input of ``in_hw``; checked once
    per distinct pair (the pooling's forward is host-bound: this ran per call)."""
    sizes = tuple(output_size) if isinstance(output_size, tuple) else (output_size, output_size)
    if len(sizes) != 2:
        raise ValueError(f"adaptive_avg_pool2d: output_size must be an int or a pair, got {output_size!r}")
    out_hw = tuple(n if s is None else s for n, s in zip(in_hw, sizes))
    if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1 for s in out_hw):
        raise ValueError(f"adaptive_avg_pool2d: output_size must be positive ints (or None), got {output_size!r}")
    return int(out_hw[0]), int(out_hw[1])


def _averaging(n: int, m: int, dtype, device) -> Tensor:
    """[m, n]: row i averages entries floor(i n / m) .. ceil((i + 1) n / m) - 1, torch's adaptive windows."""
    a = np.zeros((m, n))
    for i in range(m):
        lo, hi = (i * n) // m, -((-(i + 1) * n) // m)
        a[i, lo:hi] = 1.0 / (hi - lo)
    return Tensor.from_numpy(a, device=device, dtype=dtype)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float | Tensor = 0.1,
               eps: float = 1e-5) -> Tensor:
    """Batch normalisation over every dim but the channels (dim 1) of ``input`` [N, C, ...].

    Training normalises with the batch's mean and biased variance and, where running statistics are
    given, updates them in place: ``running = (1 - momentum) * running + momentum * batch`` with the
    unbiased variance, as torch. Otherwise the running statistics normalise. A training forward is two
    kernels (the update among them), its backward two; otherwise one.

    Arguments:
        input: a float tensor of at least 2 dims.
        running_mean, running_var: [C] float buffers (None: training keeps none).
        weight, bias: the affine [C] parameters, or None.
        training: use (and record) the batch's statistics.
        momentum: the running statistics' update factor (a float, or a one-element tensor).
        eps: added to the variance.
    """
    if momentum is None:
        raise TypeError("batch_norm: momentum must be a float or a one-element tensor, got None (the cumulative "
                        "average of BatchNorm's momentum=None needs its num_batches_tracked)")
    return _batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def _batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
                bias: Tensor | None, training: bool, momentum: float | Tensor | None, eps: float,
                counter: Tensor | None = None) -> Tensor:
    """``batch_norm``, and for the modules: a batch counter ``counter`` (an int32 scalar tensor) that training
    adds 1 to in the same kernels, and ``momentum`` None for the cumulative average (factor 1 / counter)."""
    if not isinstance(input, Tensor) or input.ndim < 2:
        raise ValueError(f"batch_norm: expected a Tensor [N, C, ...], got "
                         f"{getattr(input, 'shape', type(input).__name__)}")
    if not input.dtype.is_float:
        raise TypeError(f"batch_norm: needs a float input, got {input.dtype.name}")
    n, c = input.shape[:2]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and t.shape != (c,):
            raise ValueError(f"batch_norm: {name} of shape {t.shape} for an input of shape {input.shape} "
                             f"({c} channels)")
    if isinstance(momentum, Tensor) and momentum.numel() != 1:
        raise ValueError(f"batch_norm: a momentum tensor must hold one element, got shape {momentum.shape}")
    others = [t for t in (running_mean, running_var, weight, bias, momentum, counter) if isinstance(t, Tensor)]
    check_same_device(input, *others, op="batch_norm")
    if training:
        if input.numel() // max(c, 1) <= 1:
            raise ValueError(f"batch_norm: expected more than 1 value per channel when training, got input of "
                             f"shape {input.shape}")
    elif running_mean is None or running_var is None:
        raise ValueError("batch_norm: running_mean and running_var are needed unless training=True")
    x = input if input.is_contiguous() else D.contiguous(input)
    keep = is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    return BatchNorm.apply(x, weight, bias, running_mean, running_var, 0.0 if momentum is None else momentum,
                           bool(training), eps, momentum is None, counter, keep)


def embedding(input, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of ``weight`` [num_embeddings, dim] picked by integer indices ``input`` of any shape, as
    ``torch.nn.functional.embedding``; an index out of range raises.

    Indices given as host data (a NumPy array or list) are checked and sorted for the backward on the
    host, so neither direction reads anything back from the device.

    Differs from torch: ``max_norm`` (renormalising rows of ``weight`` in place), ``scale_grad_by_freq``
    and ``sparse`` gradients are not supported and raise.

    Arguments:
        input: integer indices (an int32 Tensor, or host data).
        weight: the table [num_embeddings, embedding_dim].
        padding_idx: a row (negative counts from the end) whose lookups pass no gradient to ``weight``.
    """
    if max_norm is not None:
        raise ValueError("embedding: max_norm (renormalising weight rows in place) is not supported")
    if scale_grad_by_freq or sparse:
        raise ValueError("embedding: scale_grad_by_freq and sparse gradients are not supported")
    n = weight.shape[0]
    pad = _padding_idx(padding_idx, n, "embedding")
    if isinstance(input, Tensor):
        out = D.index_select(weight, 0, input, op="embedding")
        idx = input
    else:
        host = np.asarray(input)
        idx = as_index(host, weight.device, n, f"embedding of {n} rows", noun="index")
        out = ops.index_select(weight, 0, idx, op="embedding")
        if is_grad_enabled() and weight.requires_grad:
            out = record("embedding", out, [weight],
                         lambda g: (index_add_rows(g, 0, idx, n, host_index=host),), [idx])
    if pad is None or not out.requires_grad:
        return out
    # Same values, but the lookups of the padding row take the detached copy: no gradient reaches it.
    keep = ops.unsqueeze(ops.binary("ne", idx, pad), -1)
    return D.where(keep, out, out.detach())


def _padding_idx(padding_idx: int | None, n: int, op: str) -> int | None:
    if padding_idx is None:
        return None
    if not -n <= padding_idx < n:
        raise ValueError(f"{op}: padding_idx {padding_idx} must be within num_embeddings ({n})")
    return padding_idx % n


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` dims, then scale by ``weight`` and shift by ``bias``.

    One fused kernel each way (wgpar/ops/layer_norm.py) when weight and bias (if given) have x's dtype;
    the composed ops otherwise. Inside autocast it runs in float32.
    """
    x = input
    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else (normalized_shape,)
    if tuple(x.shape[-len(shape):]) != shape:
        raise ValueError(f"layer_norm: input of shape {x.shape} does not end with normalized_shape {shape}")
    x = D.autocast_full(x)
    params = [t for t in (weight, bias) if t is not None]
    if x.dtype.is_float and all(t.shape == shape and t.dtype is x.dtype for t in params):
        check_same_device(x, *params, op="layer_norm")
        return _layer_norm_fused(x, shape, weight, bias, eps)
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mu = D.reduce("mean", x, axes, keepdims=True)
    xc = D.binary("sub", x, mu)
    var = D.reduce("mean", D.binary("mul", xc, xc), axes, keepdims=True)
    y = D.binary("mul", xc, D.unary("rsqrt", D.binary("add", var, eps)))
    if weight is not None:
        y = D.binary("mul", y, weight)
    if bias is not None:
        y = D.binary("add", y, bias)
    return y


def _layer_norm_fused(x: Tensor, shape: tuple[int, ...], weight: Tensor | None, bias: Tensor | None,
                      eps: float) -> Tensor:
    cols = int(np.prod(shape))
    rows = x.numel() // cols if cols else 0
    x2 = ops.reshape(_raw_contiguous(x), (rows, cols))
    w = None if weight is None else ops.reshape(_raw_contiguous(weight), (cols,))
    b = None if bias is None else ops.reshape(_raw_contiguous(bias), (cols,))
    y2, stats = layer_norm_forward(x2, w, b, eps)
    y = ops.reshape(y2, x.shape)
    if not (is_grad_enabled() and (x.requires_grad or any(t is not None and t.requires_grad for t in (weight, bias)))):
        return y

    def bw(g):
        g2 = ops.reshape(_raw_contiguous(g), (rows, cols))
        want_w = weight is not None and weight.requires_grad
        want_b = bias is not None and bias.requires_grad
        dx, gw, gb = layer_norm_backward(x2, w, stats, g2, want_w or want_b)
        gw = ops.reshape(gw, shape) if want_w else None
        gb = ops.reshape(gb, shape) if want_b else None
        return ops.reshape(dx, x.shape), gw, gb

    return record("layer_norm", y, [x, weight, bias], bw, [x, *(t for t in (weight, bias) if t is not None)])


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise ``input`` [N, C, *] over each group of ``C / num_groups`` channels (and every spatial
    entry) to mean 0, variance 1 (biased), then scale and shift per channel by ``weight`` and ``bias`` [C],
    as ``torch.nn.functional.group_norm``. Runs as layer_norm's fused kernel on [N, G, rest] rows."""
    if not isinstance(input, Tensor) or input.ndim < 2:
        raise ValueError(f"group_norm: expected a Tensor [N, C, *], got "
                         f"{getattr(input, 'shape', type(input).__name__)}")
    n, c = input.shape[:2]
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1 or c % num_groups:
        raise ValueError(f"group_norm: num_channels ({c}) must be divisible by num_groups ({num_groups})")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.shape != (c,):
            raise ValueError(f"group_norm: {name} of shape {t.shape} for {c} channels")
    rest = input.numel() // (n * num_groups) if n else 0
    y = layer_norm(D.reshape(input, (n, num_groups, rest)), (rest,), eps=eps)
    y = D.reshape(y, input.shape)
    per_channel = (c,) + (1,) * (input.ndim - 2)
    if weight is not None:
        y = D.binary("mul", y, D.reshape(weight, per_channel))
    if bias is not None:
        y = D.binary("add", y, D.reshape(bias, per_channel))
    return y


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """``input / sqrt(mean(input ** 2) + eps) * weight`` over the trailing ``normalized_shape`` dims, as
    ``torch.nn.functional.rms_norm``; ``eps=None`` is the input dtype's machine epsilon, as torch.
    Composed of elementwise ops and a mean, computed in the input's dtype."""
    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else (normalized_shape,)
    if not isinstance(input, Tensor) or tuple(input.shape[input.ndim - len(shape):]) != shape \
            or len(shape) > input.ndim:
        raise ValueError(f"rms_norm: input of shape {getattr(input, 'shape', None)} does not end with "
                         f"normalized_shape {shape}")
    if not input.dtype.is_float:
        raise TypeError(f"rms_norm: needs a float input, got {input.dtype.name}")
    if weight is not None and weight.shape != shape:
        raise ValueError(f"rms_norm: weight of shape {weight.shape} for normalized_shape {shape}")
    if eps is None:
        eps = float(np.finfo(input.dtype.np).eps)
    axes = tuple(range(input.ndim - len(shape), input.ndim))
    ms = D.reduce("mean", D.binary("mul", input, input), axes, keepdims=True)
    y = D.binary("mul", input, D.unary("rsqrt", D.binary("add", ms, float(eps))))
    return y if weight is None else D.binary("mul", y, weight)


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Squared error ``(input - target) ** 2``, reduced by "mean" (default), "sum" or not ("none"). Differs from
    torch: shapes that differ raise ValueError (torch broadcasts with a warning); no ``size_average=``,
    ``reduce=`` or ``weight=``."""
    if isinstance(target, Tensor) and input.shape != target.shape:
        raise ValueError(f"mse_loss: input shape {input.shape} and target shape {target.shape} differ")
    input, target = D.autocast_full(input), D.autocast_full(target)
    d = D.binary("sub", input, target)
    sq = D.binary("mul", d, d)
    return _reduce(sq, reduction, "mse_loss")


_REDUCTIONS = ("mean", "sum", "none")


def _loss_args(op: str, reduction: str, size_average=None, reduce=None) -> None:
    if size_average is not None or reduce is not None:
        raise ValueError(f"{op}: size_average and reduce (deprecated in torch) are not supported; use reduction=")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _reduce(t: Tensor, reduction: str, what: str) -> Tensor:
    if reduction == "mean":
        return D.reduce("mean", t)
    if reduction == "sum":
        return D.reduce("sum", t)
    if reduction == "none":
        return t
    raise ValueError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _pair(input, target, op: str, cast_target: bool = True) -> tuple[Tensor, Tensor]:
    """input and target (a Tensor or host data, then uploaded in input's dtype) of one shape, float."""
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a wgpar.Tensor, got {type(input).__name__}")
    if not input.dtype.is_float:
        raise TypeError(f"{op}: input must be float, got {input.dtype.name}")
    if not isinstance(target, Tensor):
        target = Tensor.from_numpy(np.asarray(target), device=input.device, dtype=input.dtype)
    check_same_device(input, target, op=op)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"{op}: target of shape {target.shape} for input of shape {input.shape} (wgpar does not "
                         f"broadcast them, where torch warns and broadcasts)")
    if cast_target and not target.dtype.is_float:
        target = D.cast(target, input.dtype)
    return D.autocast_full(input), D.autocast_full(target)


def _weighted_mean_or(per: Tensor, weight: Tensor | None, reduction: str) -> Tensor:
    """torch's rule for an elementwise weight of the input's shape: mean is sum(w * l) / sum(w)."""
    if weight is None:
        return _reduce(per, reduction, "loss")
    per = D.binary("mul", per, weight)
    if reduction == "mean":
        return D.binary("div", D.reduce("sum", per), D.reduce("sum", weight))
    return _reduce(per, reduction, "loss")


def _class_targets(target, c: int, ignore_index: int, like: Tensor, op: str) -> tuple[Tensor, Tensor | None]:
    """Class targets as int32 with ignored entries set to 0, and the bool mask of the kept ones (None when
    none is ignored). Every kept target is checked to lie in [0, C) before narrowing: host data on the host,
    a tensor through its known range (one readback where unknown, and one more where ignore_index is
    among its values)."""
    what = f"{op} with {c} classes"
    if isinstance(target, Tensor):
        if target.dtype.is_float or target.dtype is _dt.bool_ or target.dtype.storage != "i32":
            raise TypeError(f"{op}: targets must be int32 class indices (or float probabilities), got "
                            f"{target.dtype.name}")
        check_same_device(like, target, op=op)
        if target.numel() == 0:
            return target, None
        lo, hi = _value_range(target)
        if not lo <= ignore_index <= hi:
            _raise_if_out_of_range(lo, hi, c, what, False, "target")
            return target, None
        keep = ops.binary("ne", target, ignore_index)
        safe = ops.where(keep, target, 0)
        _raise_if_out_of_range(*_value_range(safe), c, what, False, "target")
        return safe, keep
    host = np.asarray(target)
    if host.size and host.dtype.kind not in "iu":
        raise TypeError(f"{op}: targets must hold integer class indices, got {host.dtype}")
    keep = host != ignore_index
    safe = np.where(keep, host, 0)
    if safe.size:
        _raise_if_out_of_range(int(safe.min()), int(safe.max()), c, what, False, "target")
    t = Tensor.from_numpy(safe.astype(np.int32), device=like.device)
    return t, (None if keep.all() else Tensor.from_numpy(keep, device=like.device))


def _classes_last(x: Tensor) -> Tensor:
    """[N, C, d1, ...] as [N * d1 * ..., C]."""
    if x.ndim > 2:
        x = D.permute(x, (0,) + tuple(range(2, x.ndim)) + (1,))
    return D.reshape(x, (-1, x.shape[-1]))


def _class_weight(weight, c: int, like: Tensor, op: str) -> Tensor | None:
    if weight is None:
        return None
    if not isinstance(weight, Tensor):
        weight = Tensor.from_numpy(np.asarray(weight), device=like.device, dtype=_dt.float32)
    if weight.shape != (c,) or not weight.dtype.is_float:
        raise ValueError(f"{op}: weight must be a float tensor of shape ({c},) (one per class), got "
                         f"{weight.shape} ({weight.dtype.name})")
    check_same_device(like, weight, op=op)
    return weight


def _nll(logp: Tensor, target, weight: Tensor | None, ignore_index: int, reduction: str, smoothing: float,
         op: str) -> Tensor:
    """The class-index loss of log-probabilities [N, C, *]: -w[t] logp[t] per entry (0 where ignored), with
    torch's label smoothing, reduced by torch's rule (mean: divided by the kept entries' weight sum)."""
    c = logp.shape[1]
    out_shape = logp.shape[:1] + logp.shape[2:]
    tshape = tuple(target.shape) if isinstance(target, Tensor) else np.shape(target)
    if tshape != out_shape:
        raise ValueError(f"{op}: targets of shape {tshape} for input of shape {logp.shape} (expected {out_shape})")
    if c == 0 and int(np.prod(out_shape)):
        raise ValueError(f"{op}: input of shape {logp.shape} has no classes")
    tgt, keep = _class_targets(target, c, ignore_index, logp, op)
    lp = _classes_last(logp)
    m = lp.shape[0]
    tgt, keep = ops.reshape(tgt, (m,)), None if keep is None else ops.reshape(keep, (m,))
    # Flat positions row * C + target pick one entry per row; index_select carries the gradient.
    rows = Tensor.from_numpy(np.arange(m, dtype=np.int32) * c, device=lp.device)
    flat = ops.binary("add", rows, tgt)
    flat._host_range = (0, max(m * c - 1, 0))  # every kept target was checked, ignored ones are 0
    per = D.unary("neg", D.index_select(D.reshape(lp, (-1,)), 0, flat))
    w_t = None if weight is None else ops.cast(ops.index_select(weight, 0, tgt), lp.dtype)
    if w_t is not None:
        per = D.binary("mul", per, w_t)
    if smoothing:
        total = D.reduce("sum", lp if weight is None else D.binary("mul", lp, ops.cast(weight, lp.dtype)), -1)
        per = D.binary("add", D.binary("mul", per, 1.0 - smoothing), D.binary("mul", total, -smoothing / c))
    if keep is not None:  # where, not a product: an ignored entry's -inf log-probability stays out
        per = D.where(keep, per, 0.0)
    if reduction == "none":
        return D.reshape(per, out_shape)
    loss = D.reduce("sum", per)
    if reduction == "sum":
        return loss
    if w_t is not None:
        denom = ops.reduce("sum", w_t if keep is None else ops.where(keep, w_t, 0.0))
    else:
        denom = float(m) if keep is None else ops.reduce("sum", ops.cast(keep, _dt.float32))
    return D.binary("div", loss, denom)


def _is_probabilities(target) -> bool:
    if isinstance(target, Tensor):
        return target.dtype.is_float
    return np.asarray(target).dtype.kind == "f"


def cross_entropy(input: Tensor, target, weight: Tensor | None = None, size_average=None, ignore_index: int = -100,
                  reduce=None, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross entropy of logits [N, C] (or [C], or [N, C, d1, ...]) as ``torch.nn.functional.cross_entropy``.

    ``target`` holds class indices ([N] / [] / [N, d1, ...], int) or class probabilities (float, input's
    shape). Class indices equal to ``ignore_index`` contribute nothing; ``weight`` [C] scales each class;
    ``label_smoothing`` mixes the target with the uniform distribution. Reductions as torch: "mean" over
    class indices divides by the kept entries' summed weight (NaN when every entry is ignored), over
    probabilities by the number of entries; "sum"; "none" (the per-entry losses).

    Plain class indices of [N, C] logits, none ignored, with no weight or smoothing, run one fused kernel
    each way; everything else is log_softmax composed with a gather. Class-index tensors are checked on
    the host through their known range (one readback where unknown, one more where ``ignore_index`` is
    among their values).

    Differs from torch: targets are int32 (torch: int64); ``weight`` gets no gradient; the deprecated
    ``size_average`` and ``reduce`` raise.
    """
    _loss_args("cross_entropy", reduction, size_average, reduce)
    if not isinstance(input, Tensor):
        raise TypeError(f"cross_entropy: input must be a wgpar.Tensor, got {type(input).__name__}")
    if input.ndim < 1:
        raise ValueError(f"cross_entropy: expected logits of shape [N, C], [C] or [N, C, d1, ...], got {input.shape}")
    if not input.dtype.is_float:
        raise TypeError(f"cross_entropy: logits must be float, got {input.dtype.name}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    x = D.autocast_full(input)
    probs = _is_probabilities(target)
    unbatched = x.ndim == 1
    if unbatched:
        x = D.unsqueeze(x, 0)
        if isinstance(target, Tensor):
            target = D.unsqueeze(target, 0) if probs else ops.reshape(target, (1,))
        else:
            target = np.asarray(target)[None]
    c = x.shape[1]
    weight = _class_weight(weight, c, x, "cross_entropy")
    if probs:
        out = _cross_entropy_probs(x, target, weight, reduction, label_smoothing)
    elif x.ndim == 2 and weight is None and not label_smoothing and _none_ignored(target, ignore_index):
        out = CrossEntropy.apply(x, class_targets(target, x, "cross_entropy"), reduction)
    else:
        out = _nll(D.softmax(x, 1, log=True), target, weight, ignore_index, reduction, label_smoothing,
                   "cross_entropy")
    return D.squeeze(out, 0) if unbatched and reduction == "none" else out


def _none_ignored(target, ignore_index: int) -> bool:
    """True when no target can equal ignore_index (known without a readback where the range is known)."""
    if isinstance(target, Tensor):
        if target.dtype.storage != "i32" or target.dtype is _dt.bool_ or target.numel() == 0:
            return True  # class_targets raises or there is nothing to ignore
        lo, hi = _value_range(target)
    else:
        host = np.asarray(target)
        if not host.size or host.dtype.kind not in "iu":
            return True
        lo, hi = int(host.min()), int(host.max())
    return not lo <= ignore_index <= hi


def _cross_entropy_probs(x: Tensor, target, weight: Tensor | None, reduction: str, smoothing: float) -> Tensor:
    if not isinstance(target, Tensor):
        target = Tensor.from_numpy(np.asarray(target), device=x.device, dtype=x.dtype)
    check_same_device(x, target, op="cross_entropy")
    if target.shape == x.shape[:1] + x.shape[2:]:
        raise TypeError(f"cross_entropy: class-index targets must be integer, got {target.dtype.name} (float "
                        f"targets are class probabilities of the input's shape {x.shape})")
    if target.shape != x.shape:
        raise ValueError(f"cross_entropy: probability targets of shape {target.shape} for input of shape {x.shape} "
                         f"(they must match)")
    c = x.shape[1]
    if smoothing:
        target = D.binary("add", D.binary("mul", target, 1.0 - smoothing), smoothing / c)
    prod = D.binary("mul", D.softmax(x, 1, log=True), target)
    if weight is not None:
        prod = D.binary("mul", prod, ops.reshape(ops.cast(weight, x.dtype), (c,) + (1,) * (x.ndim - 2)))
    per = D.unary("neg", D.reduce("sum", prod, 1))
    if reduction == "mean":  # torch divides by the entries (N * d1 * ...), weight or not
        return D.binary("div", D.reduce("sum", per), float(per.numel()))
    return _reduce(per, reduction, "cross_entropy")


def nll_loss(input: Tensor, target, weight: Tensor | None = None, size_average=None, ignore_index: int = -100,
             reduce=None, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities [N, C] (or [C], or [N, C, d1, ...]) at integer class
    targets, as ``torch.nn.functional.nll_loss``: ``-weight[t] * input[t]`` per entry, none for targets
    equal to ``ignore_index``; "mean" divides by the kept entries' summed weight.

    Differs from torch: targets are int32 (torch: int64); ``weight`` gets no gradient; the deprecated
    ``size_average`` and ``reduce`` raise.
    """
    _loss_args("nll_loss", reduction, size_average, reduce)
    if not isinstance(input, Tensor) or input.ndim < 1 or not input.dtype.is_float:
        raise ValueError(f"nll_loss: expected float log-probabilities [N, C], [C] or [N, C, d1, ...], got "
                         f"{getattr(input, 'shape', type(input).__name__)}")
    x = D.autocast_full(input)
    unbatched = x.ndim == 1
    if unbatched:
        x = D.unsqueeze(x, 0)
        target = ops.reshape(target, (1,)) if isinstance(target, Tensor) else np.asarray(target)[None]
    weight = _class_weight(weight, x.shape[1], x, "nll_loss")
    out = _nll(x, target, weight, ignore_index, reduction, 0.0, "nll_loss")
    return D.squeeze(out, 0) if unbatched and reduction == "none" else out


def binary_cross_entropy(input: Tensor, target, weight: Tensor | None = None, size_average=None, reduce=None,
                         reduction: str = "mean") -> Tensor:
    """``-weight * (t log(x) + (1 - t) log(1 - x))`` of probabilities ``input`` against ``target`` of one
    shape, each log clamped at -100 as torch's, as ``torch.nn.functional.binary_cross_entropy``.

    Differs from torch: an input outside [0, 1] gives NaN instead of raising (checking would read the
    tensor back); at an input of exactly 0 or 1 the gradient through the clamped log is 0 (torch: the
    unclamped formula divided by max(x (1 - x), 1e-12)); ``weight`` (broadcast to the input) gets no
    gradient; the deprecated ``size_average`` and ``reduce`` raise.
    """
    _loss_args("binary_cross_entropy", reduction, size_average, reduce)
    x, t = _pair(input, target, "binary_cross_entropy")
    log_x = D.clamp(D.unary("log", x), min=-100.0)
    log_1mx = D.clamp(D.unary("log1p", D.unary("neg", x)), min=-100.0)
    # (t - 1) log(1 - x) - t log(x), torch's order of terms
    per = D.binary("sub", D.binary("mul", D.binary("sub", t, 1.0), log_1mx), D.binary("mul", t, log_x))
    return _reduce(_bce_weight(per, weight, x), reduction, "binary_cross_entropy")


def _bce_weight(per: Tensor, weight, x: Tensor) -> Tensor:
    if weight is None:
        return per
    if not isinstance(weight, Tensor):
        weight = Tensor.from_numpy(np.asarray(weight), device=x.device, dtype=x.dtype)
    try:
        np.broadcast_shapes(weight.shape, x.shape)
    except ValueError:
        raise ValueError(f"weight of shape {weight.shape} does not broadcast to the input's {x.shape}") from None
    return D.binary("mul", per, weight.detach())


def binary_cross_entropy_with_logits(input: Tensor, target, weight: Tensor | None = None, size_average=None,
                                     reduce=None, reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """``binary_cross_entropy(sigmoid(input), target)`` computed stably from logits, as
    ``torch.nn.functional.binary_cross_entropy_with_logits``: ``(1 - t) x + (1 + (p - 1) t) softplus(-x)``
    with ``pos_weight`` p (broadcast along the last dim: one per class) scaling the positive term, then
    ``weight`` (broadcast to the input).

    Differs from torch: ``weight`` and ``pos_weight`` get no gradient; the deprecated ``size_average`` and
    ``reduce`` raise.
    """
    _loss_args("binary_cross_entropy_with_logits", reduction, size_average, reduce)
    x, t = _pair(input, target, "binary_cross_entropy_with_logits")
    sp = D.unary("softplus", D.unary("neg", x))
    if pos_weight is not None:
        if not isinstance(pos_weight, Tensor):
            pos_weight = Tensor.from_numpy(np.asarray(pos_weight), device=x.device, dtype=x.dtype)
        try:
            np.broadcast_shapes(pos_weight.shape, x.shape)
        except ValueError:
            raise ValueError(f"binary_cross_entropy_with_logits: pos_weight of shape {pos_weight.shape} does not "
                             f"broadcast to the input's {x.shape}") from None
        coef = D.binary("add", D.binary("mul", D.binary("sub", pos_weight.detach(), 1.0), t), 1.0)
        sp = D.binary("mul", coef, sp)
    per = D.binary("add", D.binary("mul", D.binary("sub", 1.0, t), x), sp)
    return _reduce(_bce_weight(per, weight, x), reduction, "binary_cross_entropy_with_logits")


def l1_loss(input: Tensor, target, size_average=None, reduce=None, reduction: str = "mean",
            weight: Tensor | None = None) -> Tensor:
    """``|input - target|``, as ``torch.nn.functional.l1_loss``; with ``weight`` (input's shape) each entry
    is scaled and "mean" is ``sum(w |d|) / sum(w)``, as torch. The gradient at ``input == target`` is 0.

    Differs from torch: input and target must have one shape (torch broadcasts them, warning); the
    deprecated ``size_average`` and ``reduce`` raise.
    """
    _loss_args("l1_loss", reduction, size_average, reduce)
    x, t = _pair(input, target, "l1_loss")
    return _weighted_mean_or(D.unary("abs", D.binary("sub", x, t)), _same_shape_weight(weight, x, "l1_loss"),
                             reduction)


def _same_shape_weight(weight, x: Tensor, op: str) -> Tensor | None:
    if weight is None:
        return None
    if not isinstance(weight, Tensor):
        weight = Tensor.from_numpy(np.asarray(weight), device=x.device, dtype=x.dtype)
    if weight.shape != x.shape:
        raise ValueError(f"{op}: Weights and input must have the same size, got {weight.shape} and {x.shape}")
    return weight


def smooth_l1_loss(input: Tensor, target, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0) -> Tensor:
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (``d = input - target``; beta 0 is
    l1_loss), as ``torch.nn.functional.smooth_l1_loss``.

    Differs from torch: input and target must have one shape; the deprecated ``size_average`` and
    ``reduce`` raise.
    """
    _loss_args("smooth_l1_loss", reduction, size_average, reduce)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    x, t = _pair(input, target, "smooth_l1_loss")
    d = D.binary("sub", x, t)
    a = D.unary("abs", d)
    if beta == 0.0:
        return _reduce(a, reduction, "smooth_l1_loss")
    quad = D.binary("mul", D.binary("mul", d, d), 0.5 / beta)
    per = D.where(ops.binary("lt", a, float(beta)), quad, D.binary("sub", a, 0.5 * beta))
    return _reduce(per, reduction, "smooth_l1_loss")


def huber_loss(input: Tensor, target, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)`` (``d = input - target``), as
    ``torch.nn.functional.huber_loss``; ``weight`` (input's shape) as in :func:`l1_loss`.

    Differs from torch: input and target must have one shape.
    """
    _loss_args("huber_loss", reduction)
    if delta <= 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    x, t = _pair(input, target, "huber_loss")
    d = D.binary("sub", x, t)
    a = D.unary("abs", d)
    quad = D.binary("mul", D.binary("mul", d, d), 0.5)
    lin = D.binary("mul", D.binary("sub", a, 0.5 * delta), float(delta))
    per = D.where(ops.binary("lt", a, float(delta)), quad, lin)
    return _weighted_mean_or(per, _same_shape_weight(weight, x, "huber_loss"), reduction)


def kl_div(input: Tensor, target, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """Kullback-Leibler divergence of the distribution ``target`` from log-probabilities ``input``, as
    ``torch.nn.functional.kl_div``: ``target * (log(target) - input)`` per entry (0 where target is 0), or
    with ``log_target`` ``exp(target) * (target - input)``. ``reduction="batchmean"`` divides the sum by
    the batch size (the true KL divergence); "mean" divides by every entry and warns, as torch.

    Differs from torch: input and target must have one shape; the deprecated ``size_average`` and
    ``reduce`` raise.
    """
    if size_average is not None or reduce is not None:
        raise ValueError("kl_div: size_average and reduce (deprecated in torch) are not supported; use reduction=")
    if reduction not in ("mean", "sum", "none", "batchmean"):
        raise ValueError(f"kl_div: reduction must be 'mean', 'batchmean', 'sum' or 'none', got {reduction!r}")
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                      "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                      "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                      UserWarning, stacklevel=2)
    x, t = _pair(input, target, "kl_div")
    if log_target:
        per = D.binary("mul", D.unary("exp", t), D.binary("sub", t, x))
    else:
        pos = ops.binary("gt", t, 0.0)
        # xlogy(t, t): t log t, 0 at t == 0; the log sees 1 there so no -inf meets a zero gradient
        t_log_t = D.where(pos, D.binary("mul", t, D.unary("log", D.where(pos, t, 1.0))), 0.0)
        per = D.binary("sub", t_log_t, D.binary("mul", t, x))
    if reduction == "batchmean":
        total = D.reduce("sum", per)
        return total if x.ndim == 0 else D.binary("div", total, float(x.shape[0]))
    return _reduce(per, reduction, "kl_div")


# -- shapes: one_hot, pad, normalize, interpolate ---------------------------------------------------
def _value_range(t: Tensor) -> tuple[int, int]:
    """The smallest and largest value of an int32 tensor: known from its upload, else one readback."""
    rng = t._host_range
    if rng is None:
        vals = t.numpy()
        rng = t._host_range = (int(vals.min()), int(vals.max()))
    return rng


def one_hot(tensor, num_classes: int = -1) -> Tensor:
    """``[..., num_classes]`` with a 1 at each class index of ``tensor`` and 0 elsewhere, as
    ``torch.nn.functional.one_hot``; ``num_classes=-1`` takes the largest index + 1 (one readback unless
    the tensor was uploaded from host data, whose range is known).

    Differs from torch: the result is int32 (torch: int64), and so must the indices be.
    """
    if not isinstance(tensor, Tensor):
        tensor = Tensor.from_numpy(np.asarray(tensor))
    if tensor.dtype.storage != "i32" or tensor.dtype is _dt.bool_:
        raise TypeError(f"one_hot is only applicable to index tensor (int32), got {tensor.dtype.name}")
    if tensor.numel() == 0:
        if num_classes < 0:
            raise ValueError("one_hot: can not infer total number of classes from empty tensor")
        return ops.fill(tensor.shape + (num_classes,), 0, _dt.int32, tensor.device)
    lo, hi = _value_range(tensor)
    if lo < 0:
        raise ValueError(f"one_hot: class values must be non-negative, got {lo}")
    if num_classes == -1:
        num_classes = hi + 1
    elif hi >= num_classes:
        raise ValueError(f"one_hot: class values must be smaller than num_classes ({num_classes}), got {hi}")
    classes = Tensor.from_numpy(np.arange(num_classes, dtype=np.int32), device=tensor.device)
    return ops.cast(ops.binary("eq", ops.unsqueeze(tensor, -1), classes), _dt.int32)


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(input: Tensor, pad, mode: str = "constant", value: float | None = None) -> Tensor:
    """Pad (or, with negative sizes, crop) the last ``len(pad) // 2`` dims of ``input``, as
    ``torch.nn.functional.pad``: ``pad`` is ``(left_last, right_last, left_second_last, ...)``.

    ``mode="constant"`` fills with ``value`` (default 0) and pads any number of dims; "reflect" (mirror
    without repeating the edge), "replicate" (repeat the edge) and "circular" (wrap around) pad the last
    1, 2 or 3 dims of an input with one or two more dims than that, as torch. Each padded dim is one
    gather along it (reflect, replicate, circular) or one concatenation (constant); the gradient sums
    back to the entries each output came from.
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"pad: input must be a wgpar.Tensor, got {type(input).__name__}")
    pad = tuple(pad)
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in pad):
        raise TypeError(f"pad: pad must be a sequence of ints, got {pad}")
    if len(pad) % 2:
        raise ValueError("pad: Padding length must be divisible by 2")
    k = len(pad) // 2
    if k > input.ndim:
        raise ValueError(f"pad: Padding length should be less than or equal to two times the input dimension "
                         f"but got padding length {len(pad)} and input of dimension {input.ndim}")
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: unrecognised padding mode {mode!r} (one of {', '.join(_PAD_MODES)})")
    if mode != "constant":
        if value is not None and value != 0:
            raise ValueError(f'pad: padding mode "{mode}" doesn\'t take in value argument')
        if k > 3 or input.ndim not in (k + 1, k + 2):
            raise ValueError(f"pad: padding size {len(pad)} is not supported for {input.ndim}D input in mode "
                             f"{mode!r}: pad the last 1, 2 or 3 dims of an input with 1 or 2 more dims")
    y = input
    for i in range(k):
        d = input.ndim - 1 - i
        before, after = int(pad[2 * i]), int(pad[2 * i + 1])
        y = _pad_dim(y, d, before, after, mode, 0.0 if value is None else value)
    return y


def _pad_dim(x: Tensor, d: int, before: int, after: int, mode: str, value) -> Tensor:
    n = x.shape[d]
    if n + min(before, 0) + min(after, 0) < 0:
        raise ValueError(f"pad: cropping {-min(before, 0)} + {-min(after, 0)} from dim {d} of shape {x.shape}")
    if mode in ("reflect", "circular"):
        limit = n - 1 if mode == "reflect" else n
        if max(before, after) > limit:
            raise ValueError(f"pad: {mode} padding ({before}, {after}) of dim {d} must be "
                             f"{'less than' if mode == 'reflect' else 'at most'} its size {n} (input {x.shape})")
    if before < 0 or after < 0:  # crop first (a view), then pad what is left, as torch
        key = (slice(None),) * d + (slice(-min(before, 0), n - (-min(after, 0))),)
        x = D.getitem(x, key)
        n = x.shape[d]
        before, after = max(before, 0), max(after, 0)
    if before == 0 and after == 0:
        return x
    if mode == "constant":
        parts = []
        for size in (before, None, after):
            if size is None:
                parts.append(x)
            elif size:
                shape = x.shape[:d] + (size,) + x.shape[d + 1:]
                parts.append(ops.fill(shape, value, x.dtype, x.device))
        return D.cat(parts, d)
    if n == 0 or (mode == "reflect" and max(before, after) > n - 1):
        raise ValueError(f"pad: {mode} padding ({before}, {after}) does not fit dim {d} of shape {x.shape}")
    j = np.arange(-before, n + after)
    if mode == "reflect":
        src = np.abs(j)
        src = np.where(src > n - 1, 2 * (n - 1) - src, src)
    elif mode == "replicate":
        src = np.clip(j, 0, n - 1)
    else:
        src = j % n
    return D.index_select(x, d, src.astype(np.int32), op=f"pad ({mode})")


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None) -> Tensor:
    """``input / max(||input||_p, eps)`` along ``dim``, as ``torch.nn.functional.normalize`` (the norm's
    gradient is zero where the norm is zero, as torch's).

    Differs from torch: ``out=`` is not supported and raises.
    """
    if out is not None:
        raise ValueError("normalize: out= is not supported; use the returned tensor")
    from ..autograd.composites import vector_norm

    denom = D.clamp(vector_norm(input, p, dim, keepdim=True), min=float(eps))
    return D.binary("div", input, denom)


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None,
                recompute_scale_factor: bool | None = None, antialias: bool = False) -> Tensor:
    """Resize the spatial dims of ``input`` [N, C, H, W], as ``torch.nn.functional.interpolate``.

    ``size`` (an int or a pair) or ``scale_factor`` (a number or a pair; the output is
    ``floor(H * scale_factor)``) picks the output size. ``mode="nearest"`` copies ``floor(h_out * scale)``
    (torch's "nearest", not "nearest-exact"); ``"bilinear"`` blends the two nearest rows then columns, from
    pixel centres (``align_corners=False``, the default) or from the corner pixels
    (``align_corners=True``). The scale is ``1 / scale_factor`` when given (unless
    ``recompute_scale_factor=True``), else the ratio of sizes, as torch. Each dim is one or two gathers
    along it, so the gradient is the transposed blend.

    Differs from torch: 4-d input only; the modes "linear", "bicubic", "trilinear", "area" and
    "nearest-exact", and ``antialias=True``, raise.
    """
    if not isinstance(input, Tensor) or input.ndim != 4:
        raise ValueError(f"interpolate: wgpar resizes 4-d input [N, C, H, W] only, got "
                         f"{getattr(input, 'shape', type(input).__name__)}")
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"interpolate: mode {mode!r} is not supported (wgpar has 'nearest' and 'bilinear')")
    if align_corners is not None and mode == "nearest":
        raise ValueError("interpolate: align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if antialias:
        raise ValueError("interpolate: antialias=True is not supported")
    if not input.dtype.is_float:
        raise TypeError(f"interpolate: needs a float input, got {input.dtype.name}")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: either size or scale_factor should be defined, not both")
    in_hw = input.shape[2:]
    if size is not None:
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        if len(sizes) != 2 or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1
                                  for s in sizes):
            raise ValueError(f"interpolate: size must be a positive int or a pair of them, got {size!r}")
        out_hw, scales = tuple(int(s) for s in sizes), (None, None)
    else:
        factors = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * 2
        if len(factors) != 2 or any(float(f) <= 0 for f in factors):
            raise ValueError(f"interpolate: scale_factor must be positive, a number or a pair, got {scale_factor!r}")
        out_hw = tuple(int(math.floor(n * float(f))) for n, f in zip(in_hw, factors))
        if min(out_hw) < 1:
            raise ValueError(f"interpolate: scale_factor {scale_factor} gives an empty output {out_hw}")
        scales = (None, None) if recompute_scale_factor else tuple(float(f) for f in factors)
    y = input
    for d, n_in, n_out, s in zip((2, 3), in_hw, out_hw, scales):
        if mode == "nearest":
            y = _resize_nearest(y, d, n_in, n_out, s)
        else:
            y = _resize_linear(y, d, n_in, n_out, s, bool(align_corners))
    return y


def _resize_nearest(x: Tensor, d: int, n_in: int, n_out: int, scale: float | None) -> Tensor:
    # torch (in float32): src = min(floor(dst * scale), n_in - 1) with scale = 1 / scale_factor or n_in / n_out
    dst = np.arange(n_out)
    if n_out == n_in:  # torch's exact special cases, whatever the scale says
        src = dst
    elif n_out == 2 * n_in:
        src = dst // 2
    else:
        s = np.float32(n_in / n_out if scale is None else 1.0 / scale)
        src = np.minimum(np.floor(dst.astype(np.float32) * s).astype(np.int64), n_in - 1)
    return D.index_select(x, d, src.astype(np.int32), op="interpolate")


def _resize_linear(x: Tensor, d: int, n_in: int, n_out: int, scale: float | None, align_corners: bool) -> Tensor:
    # torch's area_pixel_compute_source_index, in float32 as torch computes it for float input
    dst = np.arange(n_out, dtype=np.float32)
    if align_corners:
        src = dst * np.float32((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    else:
        s = np.float32(n_in / n_out if scale is None else 1.0 / scale)
        src = np.maximum(s * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0.0))
    i0 = np.minimum(src.astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = (src - i0.astype(np.float32)).astype(np.float32)
    shape = (n_out,) + (1,) * (x.ndim - 1 - d)
    w1 = Tensor.from_numpy(lam.reshape(shape), device=x.device, dtype=x.dtype)
    w0 = Tensor.from_numpy((np.float32(1.0) - lam).reshape(shape), device=x.device, dtype=x.dtype)
    a = D.index_select(x, d, i0.astype(np.int32), op="interpolate")
    b = D.index_select(x, d, i1.astype(np.int32), op="interpolate")
    return D.binary("add", D.binary("mul", a, w0), D.binary("mul", b, w1))


# -- attention ----------------------------------------------------------------------------------------
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` (torch.nn.functional.scaled_dot_product_attention).

    query [..., L, E], key [..., S, E], value [..., S, Ev] with equal leading dims ([batch, heads] or
    [batch]). ``is_causal`` lets query i see keys j <= i (torch's top-left alignment when L != S);
    ``attn_mask`` is a bool mask (True: attend) or a float mask added to the scores, broadcast to
    [..., L, S]; ``dropout_p`` drops attention weights (apply it only in training, as torch's
    modules do); ``scale`` defaults to 1 / sqrt(E).

    Without a mask or dropout, 3-d or 4-d operands with E == Ev a multiple of 4 (up to 256) run the
    fused kernels (wgpar/ops/attention.py): no [L, S] matrix in memory, forward or backward.
    Everything else runs the composed reference (matmul, mask, softmax, matmul). Inside autocast the
    operands are float16 and the probabilities accumulate in float32.

    Arguments:
        query, key, value: the operands.
        attn_mask: None, or a bool / float Tensor (or array) broadcastable to [..., L, S]; an integer
            mask raises (use ``mask.bool()``). A query row that may attend to no key gives zeros and a
            zero gradient, as torch's does (not softmax's NaN).
        dropout_p: probability of zeroing an attention weight.
        is_causal: apply the causal mask (not together with ``attn_mask``).
        scale: the score scale.
    """
    if attn_mask is None and dropout_p == 0.0 and type(query) is type(key) is type(value) is Tensor \
            and query.ndim == 4 and not is_autocast_enabled():
        # The common call again: replay the kernel an earlier call of this layout chose (ops/attention.py).
        sc = _fused_attention.default_scale(query.shape[-1]) if scale is None else float(scale)
        hit = _fused_attention.replay_forward(query, key, value, bool(is_causal), sc)
        if hit is not None:
            return _attention_record(query, key, value, *hit, bool(is_causal), sc)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"scaled_dot_product_attention: {name} must be a wgpar.Tensor, got {type(t).__name__}")
        if t.ndim < 2 or not t.dtype.is_float:
            raise ValueError(f"scaled_dot_product_attention: {name} must be a float tensor of at least 2 dims, "
                             f"got shape {t.shape} ({t.dtype.name})")
    check_same_device(query, key, value, op="scaled_dot_product_attention")
    if key.shape[:-2] != query.shape[:-2] or value.shape[:-2] != query.shape[:-2] or key.shape[-1] != query.shape[-1] \
            or value.shape[-2] != key.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: shapes query {query.shape}, key {key.shape}, value "
                         f"{value.shape} do not fit [..., L, E], [..., S, E], [..., S, Ev]")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass either attn_mask or is_causal=True, not both")
    if attn_mask is not None:
        attn_mask = _attention_mask(attn_mask, query, key)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}")
    scale = _fused_attention.default_scale(query.shape[-1]) if scale is None else float(scale)
    if is_autocast_enabled():
        query, key, value = D.autocast_lower(query), D.autocast_lower(key), D.autocast_lower(value)
    if not (query.dtype is key.dtype is value.dtype):
        query, key, value = (D.cast(t, _dt.float32) if t.dtype is not _dt.float32 else t for t in (query, key, value))
    path = _fused_attention.forced_path()
    why = "an attn_mask or dropout" if (attn_mask is not None or dropout_p > 0.0) else (
        f"{query.ndim}-d operands" if query.ndim not in (3, 4) else None)
    if why is None:
        q4, k4, v4 = ((t if t.ndim == 4 else D.unsqueeze(t, 1)) for t in (query, key, value))
        why = _fused_attention.supported(q4, k4, v4)
    if path == "fused" and why is not None:
        raise ValueError(f"scaled_dot_product_attention: the fused kernels cannot run {why}")
    if why is not None or path == "reference":
        return _attention_reference(query, key, value, attn_mask, dropout_p, is_causal, scale)
    out = _attention_fused(q4, k4, v4, bool(is_causal), scale)
    return out if query.ndim == 4 else D.squeeze(out, 1)


class AttentionMaskError(TypeError, ValueError, RuntimeError):
    """An ``attn_mask`` that attention refuses: an integer dtype (torch raises, and adding a 0/1 mask to the
    scores would silently differ from the bool mask it means) or a shape that does not broadcast to the
    scores. A RuntimeError as torch raises, and the TypeError / ValueError a Python user catches."""


def _attention_mask(mask, query: Tensor, key: Tensor) -> Tensor:
    """``mask`` as a bool or float Tensor on the query's device, checked against the scores' shape."""
    scores = query.shape[:-1] + (key.shape[-2],)
    if isinstance(mask, Tensor):
        check_same_device(query, mask, op="scaled_dot_product_attention (attn_mask)")
        ok, kind = mask.dtype is _dt.bool_ or mask.dtype.is_float, mask.dtype.name
    else:
        mask = np.asarray(mask)
        ok, kind = mask.dtype.kind in "bf", mask.dtype.name
    if not ok:
        raise AttentionMaskError(f"scaled_dot_product_attention: attn_mask must be bool (True: attend) or float "
                                 f"(added to the scores), got {kind}; an integer 0/1 mask (a Hugging Face "
                                 f"attention_mask) means mask.bool() (torch refuses integer masks too)")
    try:
        fits = np.broadcast_shapes(tuple(mask.shape), scores) == scores
    except ValueError:
        fits = False
    if not fits:
        raise AttentionMaskError(f"scaled_dot_product_attention: attn_mask of shape {tuple(mask.shape)} does not "
                                 f"broadcast to the scores' shape {scores} (query {query.shape}, key {key.shape})")
    return mask if isinstance(mask, Tensor) else Tensor.from_numpy(mask, device=query.device)


def _attention_fused(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
    return _attention_record(q, k, v, *_fused_attention.attention_forward(q, k, v, causal, scale), causal, scale)


def _attention_record(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float) -> Tensor:
    """``out``, the fused forward's result, with its backward recorded when a gradient is wanted."""
    if not (is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return out
    y = out.detach()  # no out -> node -> closure -> out cycle

    def bw(g):
        return _fused_attention.attention_backward(q, k, v, y, lse, g, causal, scale)

    return record("scaled_dot_product_attention", out, [q, k, v], bw, [q, k, v, y, lse])


def _attention_reference(q: Tensor, k: Tensor, v: Tensor, attn_mask, dropout_p: float, is_causal: bool,
                         scale: float) -> Tensor:
    lq, lk = q.shape[-2], k.shape[-2]
    scores = D.binary("mul", D.matmul(q, D.transpose(k, -2, -1)), scale)
    if is_causal:
        scores = D.where(_causal_mask(lq, lk, q.device), scores, float("-inf"))
    if attn_mask is None:
        weights = D.softmax(scores, -1)
    else:
        if attn_mask.dtype is _dt.bool_:
            scores = D.where(attn_mask, scores, float("-inf"))
        else:
            scores = D.binary("add", scores, attn_mask)
        # A row that may attend to no key gets zeros and no gradient, as torch's (>= 2.5) safe softmax
        # gives, not softmax's 0 / 0 = NaN: its scores become finite (so the softmax backward multiplies
        # finite probabilities by a zero gradient), its probabilities 0. A NaN score is no -inf: NaN stays.
        with no_grad():
            dead = ops.binary("eq", ops.reduce("max", scores, -1, keepdims=True), float("-inf"))
        weights = D.where(dead, 0.0, D.softmax(D.where(dead, 0.0, scores), -1))
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p, True)
    return D.matmul(weights, v)


_MASKS: dict = {}


def _causal_mask(lq: int, lk: int, device) -> Tensor:
    key = (lq, lk, device)
    mask = _MASKS.get(key)
    if mask is None:
        if len(_MASKS) > 16:
            _MASKS.clear()
        mask = _MASKS[key] = Tensor.from_numpy(np.tril(np.ones((lq, lk), dtype=bool)), device=device)
    return mask
