"""Tensor: shape, strides and dtype over a Storage on one Device.

Views (reshape, transpose, permute, slicing, expand) share storage and only
change shape, strides and offset; kernels read any strides, so no op copies
a view unless it must. Methods and operators forward to the differentiable ops of wgpar.autograd
through one hook (``install_ops``): this module imports nothing above it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from . import dtypes as _dt
from .dtypes import DType
from .errors import DeviceMismatchError, HostDeviceError
from .hooks import RemovableHandle, add_hook
from .runtime import adapters as _adapters
from .runtime.device import Device
from .storage import Storage

Shape = tuple[int, ...]


_STRIDES: dict[tuple, tuple[int, ...]] = {}  # shape -> contiguous strides: a step meets the same few shapes


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    hit = _STRIDES.get(shape) if type(shape) is tuple else None
    if hit is not None:
        return hit
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    out = tuple(reversed(strides))
    if type(shape) is tuple and type(acc) is int:  # NumPy integers in the shape give NumPy strides: not shared
        if len(_STRIDES) >= 4096:
            _STRIDES.clear()
        _STRIDES[shape] = out
    return out


def normalize_shape(shape: Iterable[Any]) -> Shape:
    """A shape given as ints or one sequence of ints, checked (non-negative ints) and made a tuple."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    if type(shape) is tuple:  # the usual case, checked without building a new tuple
        for n in shape:
            if type(n) is not int or n < 0:
                break
        else:
            return shape
    out = []
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"shape entries must be ints, got {shape!r}")
        if n < 0:
            raise ValueError(f"negative dimension in shape {tuple(shape)!r}")
        out.append(int(n))
    return tuple(out)


class Tensor:
    """An n-dimensional array on a WebGPU device."""

    __array_priority__ = 1000  # numpy scalars/arrays defer to our operators

    def __init__(self, storage: Storage, shape: Shape, strides: Shape | None = None, offset: int = 0,
                 requires_grad: bool = False) -> None:
        self._storage = storage
        self._shape = shape = shape if type(shape) is tuple else tuple(shape)
        self._strides = contiguous_strides(shape) if strides is None else strides if type(strides) is tuple \
            else tuple(strides)
        self._offset = offset
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None
        self._node = None  # autograd: the graph node that produced this tensor
        self._retain = False

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def empty(cls, shape: Sequence[int], dtype: DType | str = _dt.float32, device=None) -> Tensor:
        """An uninitialised tensor of ``shape`` (wgpar.empty is the usual spelling)."""
        dtype = dtype if type(dtype) is DType else _dt.as_dtype(dtype)
        dev = device if type(device) is Device else _adapters.resolve(device)
        shape = normalize_shape(shape)
        if dtype is _dt.float16 and not dev.has_f16:
            check_dtype_supported(dtype, dev)
        return cls(Storage(dev, dtype, math.prod(shape)), shape)

    @classmethod
    def from_numpy(cls, arr: np.ndarray, device=None, dtype=None) -> Tensor:
        """A tensor holding a copy of ``arr`` (float64 data becomes float32, integers int32 once their values
        are checked to fit); unlike torch.from_numpy it never shares memory with the array."""
        arr = np.asarray(arr)
        dt = _dt.as_dtype(dtype) if dtype is not None else _dt.from_numpy_dtype(arr.dtype)
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"cannot make a {dt.name} tensor from NumPy dtype {arr.dtype}")
        t = cls.empty(arr.shape, dt, device)
        if t.numel() == 0:
            return t
        host_dtype = np.int32 if dt.storage == "i32" else dt.np
        if dt is _dt.bool_:
            arr = arr != 0  # bool(0.5) is True: a cast through int32 would truncate it to 0 first
        elif dt.storage == "i32":
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise ValueError("NaN or infinite values cannot be converted to int32")
            lo, hi = arr.min(), arr.max()
            if lo < -(2**31) or hi >= 2**31:
                raise ValueError(f"values in [{lo}, {hi}] do not fit int32")
        host = np.ascontiguousarray(arr, dtype=host_dtype)
        data = memoryview(host).cast("B")  # no host copy: the device copies straight from the array
        if len(data) % 4:
            data = bytes(data) + b"\0" * (4 - len(data) % 4)
        t.device.upload(t._storage.buffer, 0, data)
        if dt.storage == "i32":
            t._host_range = (int(host.min()), int(host.max()))  # lets index ops validate without a readback
        return t

    # -- attributes -----------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        """The sizes of the dims, a tuple of ints (PyTorch's torch.Size is a tuple too)."""
        return self._shape

    def size(self, dim: int | None = None):
        """The shape, or with ``dim`` the size of that dim."""
        return self._shape if dim is None else self._shape[wrap_dim(dim, self.ndim)]

    @property
    def dtype(self) -> DType:
        """The element type: wgpar.float32, float16, int32 or bool_."""
        return self._storage.dtype

    @property
    def device(self) -> Device:
        """The Device whose memory holds this tensor."""
        return self._storage.device

    @property
    def ndim(self) -> int:
        """The number of dims."""
        return len(self._shape)

    def dim(self) -> int:
        """The number of dims (``ndim``)."""
        return len(self._shape)

    def numel(self) -> int:
        """The number of elements."""
        return math.prod(self._shape)

    def __len__(self) -> int:
        """The size of dim 0, as ``len()`` of a torch tensor; a 0-d tensor has no length (TypeError)."""
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    @property
    def strides(self) -> Shape:
        """Strides in elements (not bytes, unlike NumPy)."""
        return self._strides

    def stride(self, dim: int | None = None):
        """The strides in elements, or with ``dim`` that dim's stride."""
        return self._strides if dim is None else self._strides[wrap_dim(dim, self.ndim)]

    @property
    def nbytes(self) -> int:
        """The bytes its elements take (a bool takes 4: WGSL storage has no 1-byte type)."""
        return self.numel() * self.dtype.itemsize

    @property
    def is_leaf(self) -> bool:
        """True unless an op recorded in the autograd graph produced this tensor."""
        return self._node is None

    def is_contiguous(self) -> bool:
        """Whether the elements lie in row-major order without gaps (size-1 dims' strides ignored)."""
        expect = contiguous_strides(self._shape)
        if self._strides == expect:
            return True
        return all(n == 1 or s == e for n, s, e in zip(self._shape, self._strides, expect))

    def data_ptr(self) -> tuple[int, int]:
        """(id of the storage, element offset): equal for views that start at the same element."""
        return id(self._storage), self._offset

    def untyped_storage(self) -> Storage:
        """The Storage under this tensor and its views (named like torch's; wgpar has one kind).

        ``t.untyped_storage().free()`` gives its memory back while ``t`` stays the same object, and
        ``.materialize()`` takes new memory for it (FSDP reshards and unshards parameters this way).
        """
        return self._storage

    @property
    def _host_range(self) -> tuple[int, int] | None:
        """(min, max) of the values as known on the host (index ops check ranges without a readback);
        None once an in-place write may have changed them."""
        known = self.__dict__.get("_known_range")
        if known is None or known[0] != self._storage.version:
            return None
        return known[1]

    @_host_range.setter
    def _host_range(self, rng: tuple[int, int]) -> None:
        self.__dict__["_known_range"] = (self._storage.version, rng)

    # -- autograd -------------------------------------------------------------------------
    def backward(self, grad: Tensor | None = None, retain_graph: bool = False) -> None:
        """Accumulate gradients of this tensor into the ``.grad`` of every leaf it depends on. Differs from
        torch: the seed gradient is ``grad`` (torch: ``gradient``); no ``create_graph=`` or ``inputs=``."""
        _ops.backward([self], [grad], retain_graph=retain_graph)

    def retain_grad(self) -> Tensor:
        """Keep ``.grad`` on this non-leaf tensor after backward."""
        _ops.retain_grad(self)
        return self

    def detach(self) -> Tensor:
        """A view of the same storage outside the graph."""
        return Tensor(self._storage, self._shape, self._strides, self._offset)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` in place (float tensors only; False only on a leaf); returns self."""
        if requires_grad and not self.dtype.is_float:
            raise TypeError(f"only floating point tensors can require gradients, got {self.dtype.name}")
        if not requires_grad and self._node is not None:
            raise RuntimeError("requires_grad_(False) on a non-leaf tensor; use detach()")
        self.requires_grad = requires_grad
        return self

    @property
    def grad_fn(self):
        """The autograd Node that produced this tensor, or None for a leaf."""
        return self._node

    def register_hook(self, hook: Callable[[Tensor], Tensor | None]) -> RemovableHandle:
        """Call ``hook(grad)`` each time backward computes the gradient w.r.t. this tensor.

        ``grad`` is that gradient summed over all uses of this tensor in the pass. The hook may
        return None or a replacement (same shape, dtype and device) that is used from then on: for a
        leaf, what accumulates into ``.grad``; for a non-leaf, what flows on through the graph (the
        hook runs as a pre-hook of the node that produced this tensor, see ``Node.register_prehook``).

        Arguments:
            hook: the callable.

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        if not self.requires_grad:
            raise RuntimeError(f"register_hook: the tensor of shape {self._shape} does not require grad, "
                               "so backward never computes its gradient")
        if self._node is not None:
            return self._node.register_prehook(hook)
        hooks = self.__dict__.get("_tensor_hooks")
        if hooks is None:
            hooks = self._tensor_hooks = OrderedDict()
        return add_hook(hooks, hook)

    def register_post_accumulate_grad_hook(self, hook) -> None:
        """Call ``hook(tensor)`` each time backward has finished this leaf's ``.grad``."""
        if self._node is not None:
            raise RuntimeError("post-accumulate-grad hooks can only be registered on leaf tensors")
        if not hasattr(self, "_grad_hooks"):
            self._grad_hooks = []
        self._grad_hooks.append(hook)

    def __deepcopy__(self, memo) -> Tensor:
        out = _ops.clone(self.detach())
        out.requires_grad = self.requires_grad
        return out

    # -- host interop ---------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Copy to a new NumPy array (waits for pending work on the device)."""
        if self.numel() == 0:
            return np.zeros(self._shape, dtype=self.dtype.np)
        src = self if self.is_contiguous() else self.contiguous()
        dt = src.dtype
        start = src._offset * dt.itemsize
        end = start + src.numel() * dt.itemsize
        lo = start - start % 4
        hi = -(-end // 4) * 4
        raw = src.device.download(src._storage.buffer, lo, hi - lo)
        host = np.frombuffer(raw, dtype=np.int32 if dt.storage == "i32" else dt.np,
                             count=src.numel(), offset=start - lo)
        if dt is _dt.bool_:
            host = host != 0
        return host.reshape(self._shape).copy()

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)`` / ``np.array(t, dtype)``: a host copy (waits for the device and reads back).

        ``copy=False`` (never copy) raises ValueError: device memory cannot be viewed from the host.
        """
        if copy is False:  # NumPy 2: copy=False means "never copy", and GPU memory always needs one
            raise ValueError("a wgpar.Tensor lives in GPU memory: converting it to NumPy always copies")
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __dlpack__(self, *args, **kwargs):
        """Refused (BufferError): DLPack shares memory without a copy, and WebGPU buffers cannot be shared.

        torch.tensor, torch.as_tensor and torch.from_dlpack all take this path when it exists, so all
        three raise this error, naming the copy that works: ``t.numpy()``.
        """
        raise BufferError(f"wgpar.Tensor of shape {self._shape} lives in a WebGPU buffer on {self.device}, which "
                          "cannot be shared through DLPack (no zero-copy view exists for another library); copy it "
                          "to the host with t.numpy(), e.g. torch.from_numpy(t.numpy()) or torch.tensor(t.numpy())")

    def __dlpack_device__(self):
        """Refused as ``__dlpack__`` is (BufferError): WebGPU memory has no DLPack device to export from."""
        self.__dlpack__()

    def tolist(self):
        """The values as (nested) Python lists; waits for the device and copies."""
        return self.numpy().tolist()

    def item(self):
        """The one value of a one-element tensor as a Python number; waits for the device and copies."""
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self._shape}")
        return self.numpy().reshape(()).item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    def __repr__(self) -> str:
        if self._storage.is_freed:  # repr must not raise: tracebacks and debuggers call it
            return f"tensor(<freed storage>, shape={self._shape}, device={self.device.index})"
        body = np.array2string(self.numpy(), separator=", ", precision=4, threshold=200, prefix="tensor(")
        extra = [f"device={self.device.index}"]
        if self.dtype is not _dt.float32:
            extra.append(f"dtype={self.dtype.name}")
        if self.requires_grad:
            extra.append("requires_grad=True")
        return f"tensor({body}, {', '.join(extra)})"

    def to(self, device=None, dtype=None) -> Tensor:
        """Copy to another device and/or convert dtype (``t.to(dev)``, ``t.to("float16")``, ``t.to(dev, dtype)``);
        already there, the tensor itself. ``"cpu"`` raises HostDeviceError: wgpar has no CPU tensor
        (``numpy()`` copies to the host); a dtype wgpar lacks warns once (README "Types")."""
        if _dt.is_dtype(device):
            device, dtype = None, device
        out = self
        if dtype is not None and _dt.as_dtype(dtype) is not out.dtype:
            out = _ops.cast(out, _dt.as_dtype(dtype))
        if device is not None:
            dev = _adapters.resolve(device)
            if dev is not out.device:
                out = _ops.to_device(out, dev)
        return out

    def float(self) -> Tensor:
        """This tensor as float32 (itself if it is one already), as PyTorch."""
        return self.to(dtype=_dt.float32)

    def half(self) -> Tensor:
        """This tensor as float16 (needs an adapter with shader-f16), as PyTorch."""
        return self.to(dtype=_dt.float16)

    def int(self) -> Tensor:
        """This tensor as int32: floats truncate toward zero, saturate at int32's range, NaN gives 0."""
        return self.to(dtype=_dt.int32)

    def long(self) -> Tensor:
        """This tensor as int32, wgpar's only integer type (PyTorch's long is int64): with a DTypeWarning,
        once per process; floats convert as in ``int()``. Class targets and indices take int32."""
        return self.to(dtype="int64")

    def bool(self) -> Tensor:
        """This tensor as bool (nonzero is True; NaN is True, as PyTorch)."""
        return self.to(dtype=_dt.bool_)

    def astype(self, dtype) -> Tensor:
        """NumPy's spelling of ``to(dtype)``."""
        return self.to(dtype=dtype)

    def cpu(self) -> Tensor:
        """Raises HostDeviceError (a TypeError): wgpar has no CPU tensor. ``t.numpy()`` is PyTorch's
        ``t.detach().cpu().numpy()``; ``.tolist()`` and ``.item()`` copy to Python values."""
        raise HostDeviceError(f"Tensor.cpu(): {_adapters.NO_HOST_TENSOR}; .to(device) moves a tensor between "
                              "wgpar devices")

    def cuda(self, device=None) -> Tensor:
        """Raises ValueError: wgpar has no CUDA device; the message says how to choose an adapter
        (``wgpar.device(i)``, ``WGPAR_ADAPTER``) and ``.to(device)`` moves a tensor to it."""
        raise ValueError(f"Tensor.cuda(): {_adapters.NO_CUDA}; .to(device) moves a tensor to it")

    # -- shape ----------------------------------------------------------------------------
    def reshape(self, *shape) -> Tensor:
        """This tensor with a new shape (one entry may be -1): a view when the strides allow one, else a
        copy, as in PyTorch."""
        return _ops.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    def view(self, *shape) -> Tensor:
        """This tensor's memory with a new shape, never a copy: raises RuntimeError (as PyTorch) where the
        strides cannot express it (a transposed tensor flattened, say); ``reshape`` copies then.
        ``view(dtype)`` (reinterpreting bits) is not supported: ``to(dtype)`` converts values."""
        if len(shape) == 1 and _dt.is_dtype(shape[0]):
            raise TypeError(f"view({shape[0]!r}): wgpar does not reinterpret a tensor's bits as another dtype; "
                            "to(dtype) converts the values")
        return _ops.view(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Dims ``start_dim``..``end_dim`` merged into one (a view when the strides allow, else a copy)."""
        return _ops.flatten(self, start_dim, end_dim)

    def permute(self, *axes) -> Tensor:
        """A view with the dims in the order ``axes`` (ints or one sequence)."""
        return _ops.permute(self, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes)

    def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor:
        """A view with dims ``dim0`` and ``dim1`` swapped (default: the last two; PyTorch requires both)."""
        return _ops.transpose(self, dim0, dim1)

    @property
    def T(self) -> Tensor:
        """A view with every dim reversed (NumPy's T; PyTorch deprecates it beyond 2 dims, wgpar allows it)."""
        return _ops.permute(self, tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> Tensor:
        """A view with the last two dims swapped (a batch of matrices transposed)."""
        return _ops.transpose(self, -2, -1)

    def t(self) -> Tensor:
        """The transpose of a matrix (a tensor of fewer than 2 dims as it is); more dims raise, as PyTorch."""
        return _ops.t(self)

    def repeat(self, *sizes) -> Tensor:
        """This tensor tiled ``sizes[i]`` times along each dim (more sizes than dims add leading dims), as
        PyTorch's repeat (NumPy's tile); a copy."""
        return _ops.repeat(self, sizes)

    def contiguous(self) -> Tensor:
        """This tensor if it is contiguous, else a contiguous copy."""
        return _ops.contiguous(self)

    def clone(self) -> Tensor:
        """A copy in new memory (differentiable)."""
        return _ops.clone(self)

    def expand(self, *shape) -> Tensor:
        """A broadcast view: size-1 dims repeated to ``shape`` without copying (-1 keeps a dim's size)."""
        return _ops.expand(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    def squeeze(self, dim=None) -> Tensor:
        """A view without size-1 dims (all, or those in ``dim``: an int or a tuple)."""
        return _ops.squeeze(self, dim)

    def unsqueeze(self, dim: int) -> Tensor:
        """A view with a new size-1 dim at ``dim``."""
        return _ops.unsqueeze(self, dim)

    def __getitem__(self, key) -> Tensor:
        """Indexing: ints, slices, None and ``...`` give a view; one integer array or tensor along a dim gathers
        (a copy). A bool mask over the leading dims selects, ``[count, *rest]``; it reads the count back
        (a host sync, as in PyTorch on CUDA) and is differentiable."""
        mask = _bool_mask(key, self.device)
        if mask is not None:
            return _ops.mask_getitem(self, mask)
        return _ops.getitem(self, key)

    def __setitem__(self, key, value) -> None:
        """Write ``value`` (a number, array or tensor, broadcast) into ``self[key]`` in place, outside the
        autograd graph: basic indexing, or a bool mask over the leading dims (no host sync: a value of one
        row per selected entry is taken in order, its length unchecked)."""
        mask = _bool_mask(key, self.device)
        if mask is not None:
            _ops.mask_setitem(self, mask, value)
            return
        _ops.setitem(self, key, value)

    def index_select(self, dim: int, index) -> Tensor:
        """The entries at ``index`` (ints in [0, n), an int32 tensor or host array) along ``dim``, gathered."""
        return _ops.index_select(self, dim, index)

    # -- arithmetic: the registry's ops (add, exp, __add__, add_, ...) are installed by autograd.methods --
    def __pos__(self):
        return self

    def __matmul__(self, o):
        return _ops.matmul(self, o)

    def __rmatmul__(self, o):
        return _ops.matmul(o, self)

    __hash__ = object.__hash__  # __eq__ (installed) is elementwise; identity hashing stays

    def matmul(self, o):
        """The matrix product ``self @ o`` (NumPy's matmul rules: 1-d operands, broadcast batch dims)."""
        return _ops.matmul(self, o)

    def bmm(self, o) -> Tensor:
        """Batched matrix product of [B, n, m] and [B, m, p] tensors, without broadcasting (PyTorch's bmm)."""
        return _ops.bmm(self, o)

    def masked_fill(self, mask, value) -> Tensor:
        """A copy with ``value`` (a number or a 0-d tensor) where the bool ``mask`` (broadcast to this
        tensor's shape) is True, in this tensor's dtype."""
        return _ops.masked_fill(self, mask, value)

    def masked_fill_(self, mask, value) -> Tensor:
        """In-place ``masked_fill``; like wgpar's other in-place ops, only on tensors outside the autograd
        graph (a parameter under ``no_grad``, a buffer)."""
        return _ops.masked_fill_(self, mask, value)

    def clamp(self, min=None, max=None):
        """Values limited to [min, max] (numbers or tensors); NaN stays NaN, as PyTorch."""
        return _ops.clamp(self, min, max)

    clip = clamp

    # in place, for optimizers and initialisation
    def clamp_(self, min=None, max=None):
        """In-place ``clamp`` (outside the autograd graph)."""
        return _ops.copy_(self, _ops.clamp(self, min, max))

    def copy_(self, src):
        """Write ``src`` (a tensor or number, broadcast, converted to this dtype) into this tensor in place;
        another device's tensor is copied through the host."""
        return _ops.copy_(self, src)

    def fill_(self, value):
        """Set every element to ``value`` in place."""
        return _ops.fill_(self, value)

    def zero_(self):
        """Set every element to 0 in place."""
        return _ops.fill_(self, 0)

    # -- reductions -----------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False, *, dim=None, keepdim=None):
        """Sum over an axis, a tuple of axes, or all elements. Differs from torch: int32 results; no ``dtype=``.

        An int32 (or bool) tensor sums to int32, which wraps around on overflow, exactly modulo 2**32
        (wgpar has no int64, unlike PyTorch's int sums); sum ``x.float()`` where totals may pass 2**31.
        """
        return _ops.reduce("sum", self, dim_arg(axis, dim), keepdim_arg(keepdims, keepdim))

    def mean(self, axis=None, keepdims=False, *, dim=None, keepdim=None):
        """The mean over an axis, a tuple of axes, or all elements; an integer tensor's mean is float32 (torch
        refuses it). Differs from torch: no ``dtype=``."""
        return _ops.reduce("mean", self, dim_arg(axis, dim), keepdim_arg(keepdims, keepdim))

    def max(self, axis=None, keepdims=False, *, dim=None, keepdim=None):
        """The largest element as a 0-d tensor, or with one int ``dim`` the named tuple
        ``(values, indices)`` along it, as in PyTorch (``values, indices = t.max(dim=1)``).

        NaN wins, as in PyTorch; indices are int32 and name the first maximum (the first NaN). The
        0-d form splits its gradient evenly over tied maxima, the dim form gives it to ``indices``
        (both as PyTorch). Several dims at once: ``amax``.
        """
        return _ops.extreme("max", self, dim_arg(axis, dim), keepdim_arg(keepdims, keepdim))

    def min(self, axis=None, keepdims=False, *, dim=None, keepdim=None):
        """The smallest element as a 0-d tensor, or with one int ``dim`` the named tuple
        ``(values, indices)`` along it, as in PyTorch; NaN wins. See ``max``; several dims: ``amin``."""
        return _ops.extreme("min", self, dim_arg(axis, dim), keepdim_arg(keepdims, keepdim))

    def amax(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """The largest values over ``dim`` (an int, a tuple of ints, or None: every element), values only
        (PyTorch's amax: the gradient split evenly over ties). NaN wins."""
        return _ops.reduce("max", self, dim_arg(axis, dim), keepdim_arg(keepdim, keepdims))

    def amin(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """The smallest values over ``dim`` (an int, a tuple of ints, or None), values only (PyTorch's
        amin). NaN wins."""
        return _ops.reduce("min", self, dim_arg(axis, dim), keepdim_arg(keepdim, keepdims))

    def argmax(self, axis=None, keepdims=False, *, dim=None, keepdim=None):
        """The int32 index of the largest value (of the flattened tensor without a dim); ties and NaN go to
        the first, as PyTorch."""
        return _ops.reduce("argmax", self, dim_arg(axis, dim), keepdim_arg(keepdims, keepdim))

    def argmin(self, axis=None, keepdims=False, *, dim=None, keepdim=None):
        """The int32 index of the smallest value (of the flattened tensor without a dim); ties and NaN go to
        the first, as PyTorch."""
        return _ops.reduce("argmin", self, dim_arg(axis, dim), keepdim_arg(keepdims, keepdim))

    def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None, keepdims=None) -> Tensor:
        """The variance over ``dim`` (an int, a tuple, or None: all), as PyTorch: the squared deviations'
        sum over max(N - correction, 0); ``correction=1`` (default, or ``unbiased=True``) is the unbiased
        estimate, 0 the population variance (NumPy's default). Float tensors only."""
        if isinstance(dim, bool):  # PyTorch's var(unbiased)
            dim, unbiased = None, dim
        return _ops.var(self, dim_arg(axis, dim), _ops.correction_arg("var", unbiased, correction),
                        keepdim_arg(keepdim, keepdims))

    def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None, keepdims=None) -> Tensor:
        """The standard deviation, ``sqrt(var(...))``, with var's arguments (PyTorch's default correction=1)."""
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        return _ops.std(self, dim_arg(axis, dim), _ops.correction_arg("std", unbiased, correction),
                        keepdim_arg(keepdim, keepdims))

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False):
        """The named tuple ``(values, indices)`` of this tensor sorted along ``dim``, as PyTorch.

        Runs on the device (a bitonic network). Always stable: equal values keep their order (so
        ``stable`` changes nothing); NaN sorts after every number ascending and before every number
        descending, as PyTorch. Indices are int32. The values' gradient goes back to where each came from.
        """
        return _ops.sort(self, dim, descending)

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
        """The int32 indices that sort this tensor along ``dim`` (``sort(...).indices``; stable)."""
        return _ops.sort(self.detach(), dim, descending).indices

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
        """The named tuple ``(values, indices)`` of the ``k`` largest (``largest=False``: smallest) entries
        along ``dim``, as PyTorch; NaN counts as the largest. Always in sorted order, ties to the first
        positions (a full sort on the device, then the first k). Indices are int32."""
        return _ops.topk(self, k, dim, largest, sorted)

    def softmax(self, axis=-1, *, dim=None):
        """Softmax along a dim (default the last; PyTorch requires one): one fused kernel per row."""
        return _ops.softmax(self, dim_arg(axis, dim), log=False)

    def log_softmax(self, axis=-1, *, dim=None):
        """log(softmax) along a dim, computed stably in one fused kernel per row."""
        return _ops.softmax(self, dim_arg(axis, dim), log=True)


def dim_arg(axis, dim):
    """The axis of a call that may name it ``axis`` (NumPy) or ``dim`` (PyTorch)."""
    if dim is not None:
        if axis is not None and axis != -1:
            raise TypeError("pass either axis= or dim=, not both")
        return dim
    return axis


def keepdim_arg(keepdims, keepdim) -> bool:
    """Whether to keep reduced dims, named ``keepdims`` (NumPy) or ``keepdim`` (PyTorch)."""
    return bool(keepdims if keepdim is None else keepdim)


def wrap_dim(dim: int, ndim: int) -> int:
    """``dim`` (negative counts from the end) as an index into ``ndim`` dimensions; IndexError if outside."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"dimension must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"dimension {dim} out of range for a {ndim}-d tensor")
    return int(dim) % n


def check_dtype_supported(dtype: DType, dev: Device) -> None:
    """Raise TypeError if ``dev`` cannot hold ``dtype`` (float16 needs the shader-f16 feature)."""
    if dtype is _dt.float16 and not dev.has_f16:
        raise TypeError(f"{dev} has no shader-f16 feature: float16 tensors are not supported there")


def check_same_device(*tensors: Tensor, op: str) -> Device:
    devs = {t.device for t in tensors}
    if len(devs) > 1:
        desc = ", ".join(f"{tuple(t.shape)} on {t.device}" for t in tensors)
        raise DeviceMismatchError(f"{op}: tensors are on different devices ({desc}); move them with .to(device)")
    return tensors[0].device


def _bool_mask(key, device: Device) -> Tensor | None:
    """The bool mask a whole indexing key is (a bool tensor, array or list, alone or in a 1-tuple),
    uploaded to ``device``; None for every other key. A mask among other indices raises."""
    items = key if isinstance(key, tuple) else (key,)
    masks = [k for k in items if (isinstance(k, Tensor) and k.dtype is _dt.bool_) or
             (isinstance(k, (np.ndarray, list)) and np.asarray(k).dtype == np.bool_)]
    if not masks:
        return None
    if len(items) != 1:
        raise IndexError("a boolean mask index must be the whole index (x[mask]); combine it with others "
                         "through nonzero() or where()")
    mask = masks[0]
    return mask if isinstance(mask, Tensor) else Tensor.from_numpy(np.asarray(mask), device=device)


class _NotInstalled:
    """Stands for the differentiable ops until wgpar.autograd installs them (``install_ops``)."""

    def __getattr__(self, name: str):
        raise RuntimeError(f"Tensor: {name} needs wgpar.autograd, which has not been imported (import wgpar)")


_ops: Any = _NotInstalled()


def install_ops(namespace: Any) -> None:
    """Route Tensor's methods through ``namespace``: the differentiable ops, ``backward`` and
    ``retain_grad``. wgpar.autograd calls this once, at import; it is how this module, a layer below
    autograd, reaches it without importing it (the registry's methods and operators are installed
    on Tensor the same way, by autograd/methods.py)."""
    global _ops
    _ops = namespace
