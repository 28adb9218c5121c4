"""Parameter: a leaf tensor that a Module registers and an optimizer updates."""

from __future__ import annotations

from ..runtime import memory_history as _hist
from ..tensor import Tensor


class Parameter(Tensor):
    """A Tensor that requires grad and is found by ``Module.parameters()``.

    Shares the storage of the tensor it wraps (no copy).
    """

    def __init__(self, data: Tensor, requires_grad: bool = True) -> None:
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter wraps a wgpar.Tensor, got {type(data).__name__}")
        if requires_grad and not data.dtype.is_float:
            raise TypeError(f"a Parameter that requires grad must be float, got {data.dtype.name}")
        super().__init__(data._storage, data.shape, data.strides, data._offset, requires_grad=requires_grad)
        self._storage.tag(_hist.PARAMETER)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
