"""The sliding window of convolution and pooling over [N, C, H, W]: sizes checked, output size computed.

One ``Window`` describes where every output position reads: kernel, stride, padding before the
first row / column, dilation, and the output size (padding after the last row / column and
``ceil_mode`` only change that size). The conv and pooling kernels take its fields as parameters.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from ..runtime.kernels import MAX_LOOP
from .plans import PlanCache


def pair(value, what: str, op: str) -> tuple[int, int]:
    """``value`` as (rows, columns): an int is used for both, a pair is taken as it is.

    Arguments:
        value: an int or a sequence of two ints.
        what: the argument's name, for errors.
        op: the caller's name, for errors.
    """
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{op}: {what} must be an int or a pair of ints, got {tuple(value)}")
        a, b = value
    else:
        a = b = value
    try:
        if isinstance(a, bool) or isinstance(b, bool):
            raise TypeError
        return operator.index(a), operator.index(b)
    except TypeError:
        raise TypeError(f"{op}: {what} must be an int or a pair of ints, got {value!r}") from None


@dataclass(frozen=True)
class Window:
    """Where each output position of a 2-d convolution or pooling reads.

    Output (oh, ow) reads input rows ``oh * sh - ph + i * dh`` for i < kh (columns alike); rows
    outside [0, h) are padding.
    """

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    oh: int
    ow: int

    @property
    def positions(self) -> int:
        """Output positions per image and channel."""
        return self.oh * self.ow

    def params(self) -> dict[str, int]:
        """The fields every window kernel's parameter block has."""
        return dict(c=self.c, h=self.h, w=self.w, kh=self.kh, kw=self.kw, sh=self.sh, sw=self.sw, ph=self.ph,
                    pw=self.pw, dh=self.dh, dw=self.dw, oh=self.oh, ow=self.ow)


def _out_size(size: int, k: int, s: int, before: int, after: int, d: int, ceil_mode: bool) -> int:
    span = size + before + after - d * (k - 1) - 1
    if span < 0:
        return 0
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + before:  # the last window must start inside the input (torch)
        out -= 1
    return out


# Windows already checked, by their arguments (a layer calls with the same ones every step: the checks
# cost about as much as the kernel's dispatch). Only plain ints and tuples of them are remembered: a
# bool equals an int as a key, and must still fail the checks.
_SEEN = PlanCache()


def _plain(v) -> bool:
    """An int, or a tuple of ints and such tuples (no bool, no list)."""
    t = type(v)
    if t is int:
        return True
    if t is not tuple:
        return False
    for e in v:
        if type(e) is not int and not (type(e) is tuple and _plain(e)):
            return False
    return True


def window(shape: tuple[int, ...], kernel, stride, padding, dilation, op: str, ceil_mode: bool = False) -> Window:
    """The window of ``op`` over an input of ``shape`` [N, C, H, W], every size checked.

    Arguments:
        shape: the input's shape.
        kernel, stride, dilation: ints or pairs (all >= 1).
        padding: an int or a pair (>= 0, the same before and after), or ((top, bottom), (left, right)).
        op: the caller's name, for errors.
        ceil_mode: round the output size up instead of down (pooling).
    """
    key = (shape, kernel, stride, padding, dilation, op, ceil_mode)
    try:
        hit = _SEEN.get(key)
    except TypeError:  # a list: not a key
        return _window(shape, kernel, stride, padding, dilation, op, ceil_mode)
    plain = _plain(kernel) and _plain(stride) and _plain(padding) and _plain(dilation)
    if hit is not None and plain:
        return hit
    win = _window(shape, kernel, stride, padding, dilation, op, ceil_mode)
    if plain:
        _SEEN.put(key, win)
    return win


def _window(shape: tuple[int, ...], kernel, stride, padding, dilation, op: str, ceil_mode) -> Window:
    if len(shape) != 4:
        raise ValueError(f"{op}: expected a 4-d input [N, C, H, W], got shape {shape}")
    n, c, h, w = shape
    kh, kw = pair(kernel, "kernel_size", op)
    sh, sw = pair(stride, "stride", op)
    dh, dw = pair(dilation, "dilation", op)
    if isinstance(padding, (tuple, list)) and padding and isinstance(padding[0], (tuple, list)):
        (pt, pb), (pl, pr) = (pair(p, "padding", op) for p in padding)
    else:
        pt, pl = pair(padding, "padding", op)
        pb, pr = pt, pl
    for name, vals, low in (("kernel_size", (kh, kw), 1), ("stride", (sh, sw), 1), ("dilation", (dh, dw), 1),
                            ("padding", (pt, pb, pl, pr), 0)):
        if min(vals) < low:
            raise ValueError(f"{op}: {name} must be >= {low}, got {vals}")
    if kh * kw > MAX_LOOP:  # each kernel thread loops over the window
        raise ValueError(f"{op}: a {kh}x{kw} window has more than {MAX_LOOP} elements")
    oh = _out_size(h, kh, sh, pt, pb, dh, ceil_mode)
    ow = _out_size(w, kw, sw, pl, pr, dw, ceil_mode)
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: input of size {h}x{w} (padding {(pt, pb, pl, pr)}) is smaller than the "
                         f"{kh}x{kw} kernel with dilation {(dh, dw)}: the output would be {oh}x{ow}")
    if math.prod((n, c, h, w)) >= 2**32 or math.prod((n, c, oh, ow)) >= 2**32:
        raise ValueError(f"{op}: input of shape {shape} has 2**32 elements or more; kernels index with u32")
    return Window(n, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow)
