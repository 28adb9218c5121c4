"""Tensor factories: from data, filled, ranges and seeded random numbers."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from . import dtypes as _dt
from .ops import copy_, fill
from .ops.shape import view
from .tensor import Tensor, normalize_shape

_rng_lock = threading.Lock()
_rng = np.random.default_rng()
# (number of driver seedings, the last seed): an unseeded process's seed is its generator's entropy.
_process_seed: tuple[int, int] = (0, _rng.bit_generator.seed_seq.entropy)
_local = threading.local()  # a thread's own generator inside rng_stream; a rank thread's own generator


class _RankGenerator:
    """A thread rank's generator (None: none yet) and the count of driver seedings when it was made."""

    __slots__ = ("rng", "epoch")

    def __init__(self) -> None:
        self.rng: np.random.Generator | None = None
        self.epoch = 0


def own_generator_for_thread() -> None:
    """Give the calling thread (a thread rank) a generator of its own, as a process of its own would have.

    ``manual_seed`` there seeds that generator only. Until the rank seeds it, and again after each
    ``manual_seed`` on another thread (the driver), it restarts from the driver's last seed, as
    ``torch.manual_seed`` seeds every device's generator; the driver's own stream is never touched.
    """
    _local.rank = _RankGenerator()


def manual_seed(seed: int) -> None:
    """Seed wgpar's random number generator (rand, randn, dropout and layer initialisation).

    In a thread rank (``run_spmd``, ``MultiAdapterContext.run``) it seeds that rank's own generator, so
    ranks seeded alike draw alike and a rank draws what a process seeded alike would. Elsewhere it seeds
    the process's generator, and every rank restarts from this seed at its next draw.
    """
    global _rng, _process_seed
    rank = getattr(_local, "rank", None)
    if rank is not None:
        rank.rng, rank.epoch = np.random.default_rng(seed), _process_seed[0]
        return
    with _rng_lock:
        _rng = np.random.default_rng(seed)
        _process_seed = (_process_seed[0] + 1, seed)


def generator() -> np.random.Generator:
    """The generator this thread draws from: its own inside ``rng_stream``, a thread rank's own, else the
    process's (seeded by ``manual_seed``)."""
    own = getattr(_local, "rng", None)
    if own is not None:
        return own
    rank = getattr(_local, "rank", None)
    if rank is None:
        return _rng
    epoch, seed = _process_seed
    if rank.rng is None or rank.epoch != epoch:
        rank.rng, rank.epoch = np.random.default_rng(seed), epoch
    return rank.rng


@contextlib.contextmanager
def rng_stream(seed: int | Sequence[int]) -> Iterator[np.random.Generator]:
    """Inside the block, this thread draws every random number (dropout masks, rand, randn, layer
    initialisation) from its own generator seeded with ``seed``; other threads and the global
    generator are untouched. Pipeline stages run each micro-batch's forward in its own stream, so
    dropout does not depend on how threads interleave.

    Arguments:
        seed: an int or a sequence of ints (NumPy's ``default_rng`` seeding).
    """
    prev = getattr(_local, "rng", None)
    _local.rng = np.random.default_rng(seed)
    try:
        yield _local.rng
    finally:
        _local.rng = prev


def _check_requires_grad(requires_grad: bool, dtype: _dt.DType) -> None:
    if requires_grad and not dtype.is_float:
        raise TypeError(f"only floating point tensors can require gradients, got {dtype.name}")


def tensor(data, device=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Make a tensor from a list, a NumPy array, a number, or another tensor (copied)."""
    if isinstance(data, Tensor):
        data = data.numpy()
    arr = np.asarray(data)
    if arr.dtype == object:
        raise TypeError("tensor(): data must be numbers or nested lists of numbers of equal length")
    if dtype is None and arr.dtype.kind == "f":
        dtype = _dt.float16 if arr.dtype == np.float16 else _dt.float32
    if requires_grad:  # before the upload: nothing is made for a call that fails
        _check_requires_grad(True, _dt.as_dtype(dtype) if dtype is not None else _dt.from_numpy_dtype(arr.dtype))
    t = Tensor.from_numpy(arr, device=device, dtype=dtype)
    t.requires_grad = bool(requires_grad)
    return t


def from_numpy(arr: np.ndarray, device=None) -> Tensor:
    """A tensor on ``device`` holding a copy of the NumPy array ``arr`` (torch.from_numpy's spelling).

    Unlike ``torch.from_numpy`` it cannot share the array's memory (the data lives in a WebGPU buffer):
    later writes to ``arr`` do not reach the tensor; ``t.numpy()`` copies back. float64 becomes float32
    and int64 int32 (values checked to fit), as ``wgpar.tensor`` does.

    Arguments:
        arr: a NumPy array of numbers or bools.
        device: the target device (default: wgpar's default device).
    """
    return Tensor.from_numpy(arr, device=device)


def _factory(shape, value, dtype, device, requires_grad) -> Tensor:
    dtype = _dt.as_dtype(dtype)
    _check_requires_grad(requires_grad, dtype)
    t = fill(normalize_shape(shape), value, dtype, device)
    t.requires_grad = bool(requires_grad)
    return t


def zeros(*shape, dtype=_dt.float32, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``shape`` filled with 0, as ``torch.zeros``.

    Differs from torch: the default dtype is float32 and a dtype wgpar lacks (float64, int64) gives the
    nearest one (float32, int32) with a DTypeWarning; the tensor lives on a wgpu device (there is no CPU
    tensor); ``out=``, ``layout=`` and ``pin_memory=`` are not accepted.

    Arguments:
        shape: the sizes, as ints or one sequence of ints.
        dtype: a wgpar dtype or its name (also a NumPy or torch dtype).
        device: a Device, an index, ``"wgpu"`` or ``"wgpu:N"`` (default device 0).
        requires_grad: make it a leaf that records gradients (floating dtypes only, else TypeError).
    """
    return _factory(shape, 0, dtype, device, requires_grad)


def ones(*shape, dtype=_dt.float32, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``shape`` filled with 1, as ``torch.ones``.

    Differs from torch as ``wgpar.zeros`` does (float32 default, int64 given as int32, wgpu devices only,
    no ``out=``/``layout=``).

    Arguments: as ``wgpar.zeros``'s (shape, dtype, device, requires_grad).
    """
    return _factory(shape, 1, dtype, device, requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value``, as ``torch.full``.

    Without ``dtype`` the dtype follows the value as in torch: a bool gives bool, a float float32, an int
    int32 (torch: int64). Wgpu devices only; no ``out=``/``layout=``.

    Arguments:
        shape: the sizes: an int or a sequence of ints.
        fill_value: the value (a Python or NumPy number or bool).
        dtype: a wgpar dtype or its name; None infers it from ``fill_value``.
        device: a Device, an index, ``"wgpu"`` or ``"wgpu:N"`` (default device 0).
        requires_grad: make it a leaf that records gradients (floating dtypes only, else TypeError).
    """
    if dtype is None:  # as in PyTorch: a bool fills a bool tensor, a float a float32 one
        if isinstance(fill_value, (bool, np.bool_)):
            dtype = _dt.bool_
        else:
            dtype = _dt.float32 if isinstance(fill_value, (float, np.floating)) else _dt.int32
    return _factory(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), fill_value, dtype, device,
                    requires_grad)


def _like(t: Tensor, dtype, device):
    if not isinstance(t, Tensor):
        raise TypeError(f"*_like: expected a wgpar.Tensor, got {type(t).__name__}")
    return t.shape, t.dtype if dtype is None else _dt.as_dtype(dtype), t.device if device is None else device


def zeros_like(t: Tensor, dtype=None, *, device=None, requires_grad: bool = False) -> Tensor:
    """Zeros of ``t``'s shape, with its dtype and device unless given (torch.zeros_like; always
    contiguous: wgpar has no memory_format)."""
    shape, dtype, device = _like(t, dtype, device)
    return _factory(shape, 0, dtype, device, requires_grad)


def ones_like(t: Tensor, dtype=None, *, device=None, requires_grad: bool = False) -> Tensor:
    """Ones of ``t``'s shape, with its dtype and device unless given (torch.ones_like)."""
    shape, dtype, device = _like(t, dtype, device)
    return _factory(shape, 1, dtype, device, requires_grad)


def full_like(t: Tensor, fill_value, dtype=None, *, device=None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` in a tensor of ``t``'s shape, with its dtype and device unless given (torch.full_like:
    the dtype is t's, not the fill value's)."""
    shape, dtype, device = _like(t, dtype, device)
    return _factory(shape, fill_value, dtype, device, requires_grad)


def empty_like(t: Tensor, dtype=None, *, device=None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor of ``t``'s shape, with its dtype and device unless given (torch.empty_like)."""
    shape, dtype, device = _like(t, dtype, device)
    _check_requires_grad(requires_grad, dtype)
    out = Tensor.empty(shape, dtype, device)
    out.requires_grad = bool(requires_grad)
    return out


def _random_like(name: str, t: Tensor, dtype, device, requires_grad: bool, draw) -> Tensor:
    shape, dtype, device = _like(t, dtype, device)
    if not dtype.is_float:  # as PyTorch: no uniform or normal samples of an integer type
        raise TypeError(f"{name}: needs a float dtype, got {dtype.name} (pass dtype=wgpar.float32)")
    with _rng_lock:
        data = draw(generator())(shape, dtype=np.float32)
    return tensor(data, device=device, dtype=dtype, requires_grad=requires_grad)


def rand_like(t: Tensor, dtype=None, *, device=None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1) of ``t``'s shape, its dtype and device unless given (torch.rand_like);
    drawn on the host from the seeded generator, as ``rand``."""
    return _random_like("rand_like", t, dtype, device, requires_grad, lambda g: g.random)


def randn_like(t: Tensor, dtype=None, *, device=None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples of ``t``'s shape, its dtype and device unless given (torch.randn_like);
    drawn on the host from the seeded generator, as ``randn``."""
    return _random_like("randn_like", t, dtype, device, requires_grad, lambda g: g.standard_normal)


def empty(*shape, dtype=_dt.float32, device=None) -> Tensor:
    """An uninitialised tensor of ``shape``, as ``torch.empty``: its values are whatever its buffer held.

    Differs from torch: no ``requires_grad`` argument (set ``t.requires_grad = True`` afterwards), float32
    default, wgpu devices only, no ``out=``/``layout=``/``memory_format=``.

    Arguments:
        shape: the sizes, as ints or one sequence of ints.
        dtype: a wgpar dtype or its name.
        device: a Device, an index, ``"wgpu"`` or ``"wgpu:N"`` (default device 0).
    """
    return Tensor.empty(normalize_shape(shape), dtype, device)


def arange(start, stop=None, step=1, dtype=None, device=None) -> Tensor:
    """Values from start (default 0) up to stop, step apart: int32 when all three are integers.

    Arguments:
        start, stop, step: as in NumPy and PyTorch; step must be nonzero, integer values must fit int32.
        dtype: the result's dtype (default int32 or float32, as above).
        device: where the tensor goes.
    """
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if dtype is None:
        dtype = _dt.int32 if all(isinstance(v, (int, np.integer)) for v in (start, stop, step)) else _dt.float32
    return Tensor.from_numpy(np.arange(start, stop, step), device=device, dtype=dtype)


def linspace(start, end, steps: int, dtype=None, device=None) -> Tensor:
    """``steps`` values from ``start`` to ``end`` inclusive, evenly spaced (float32 unless ``dtype``).

    Computed in float64 on the host and uploaded, like ``arange``.

    Arguments:
        start, end: numbers.
        steps: how many values (>= 0).
        dtype: the result's dtype (default float32).
        device: where the tensor goes.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"linspace: steps must be an int >= 0, got {steps!r}")
    dt = _dt.float32 if dtype is None else _dt.as_dtype(dtype)
    if not dt.is_float:  # as PyTorch: the ends become integers first, then each value truncates toward zero
        start, end = math.trunc(start), math.trunc(end)
    values = np.linspace(float(start), float(end), int(steps), dtype=np.float64)
    if not dt.is_float:
        values = np.trunc(values)
    return Tensor.from_numpy(values, device=device, dtype=dt)


def eye(n: int, m: int | None = None, dtype=None, device=None) -> Tensor:
    """The n x m identity matrix (m defaults to n): zeros with ones written through a diagonal view.

    Arguments:
        n, m: rows and columns.
        dtype: default float32.
        device: where the tensor goes.
    """
    n, m = normalize_shape((n, n if m is None else m))
    out = fill((n, m), 0, _dt.float32 if dtype is None else _dt.as_dtype(dtype), device)
    k = min(n, m)
    if k:
        copy_(view(out, (k,), (m + 1,)), 1)
    return out


def rand(*shape, dtype=_dt.float32, device=None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1), drawn on the host from the seeded generator."""
    with _rng_lock:
        data = generator().random(normalize_shape(shape), dtype=np.float32)
    return tensor(data, device=device, dtype=dtype, requires_grad=requires_grad)


def randn(*shape, dtype=_dt.float32, device=None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples, drawn on the host from the seeded generator."""
    with _rng_lock:
        data = generator().standard_normal(normalize_shape(shape), dtype=np.float32)
    return tensor(data, device=device, dtype=dtype, requires_grad=requires_grad)


def randint(low, high=None, size=(), device=None) -> Tensor:
    """Integers drawn uniformly from [low, high) (``randint(high, size=...)`` starts at 0), as int32.

    Arguments:
        low, high: the range; both bounds must fit int32 (high may be 2**31), checked before drawing.
        size: the shape.
        device: where the tensor goes.
    """
    if high is None:
        low, high = 0, low
    if not -(2**31) <= low < high <= 2**31:
        raise ValueError(f"randint: the range [{low}, {high}) must be non-empty and lie within int32 "
                         f"[{-(2**31)}, {2**31})")
    with _rng_lock:
        shape = normalize_shape(size if isinstance(size, (tuple, list)) else (size,))
        data = generator().integers(low, high, size=shape, dtype=np.int64)
    return Tensor.from_numpy(data, device=device)
