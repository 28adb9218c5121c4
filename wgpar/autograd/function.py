"""Custom differentiable ops: subclass Function with static forward/backward (as in PyTorch)."""

from __future__ import annotations

from ..tensor import Tensor
from .engine import record
from .grad_mode import is_grad_enabled, no_grad


class Context:
    """Passed to forward and backward: save tensors and values between them."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self._saved: tuple[Tensor, ...] = ()

    def save_for_backward(self, *tensors: Tensor) -> None:
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward takes tensors, got {type(t).__name__}")
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple[Tensor, ...]:
        return self._saved


class Function:
    """Subclass with ``forward(ctx, *args)`` returning one Tensor and ``backward(ctx, grad)``
    returning one gradient (or None) per forward argument; call ``MyFn.apply(*args)``.

    In-place changes to a tensor saved with ``ctx.save_for_backward`` are caught at backward.
    ``name`` names the graph node in errors (default: the class name).
    """

    name: str | None = None

    @staticmethod
    def forward(ctx: Context, *args, **kwargs) -> Tensor:
        raise NotImplementedError("Function subclasses must implement forward(ctx, *args)")

    @staticmethod
    def backward(ctx: Context, grad: Tensor):
        raise NotImplementedError("Function subclasses must implement backward(ctx, grad)")

    @classmethod
    def apply(cls, *args, **kwargs) -> Tensor:
        ctx = Context(tuple(isinstance(a, Tensor) and a.requires_grad for a in args))
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        if not isinstance(out, Tensor):
            raise TypeError(f"{cls.__name__}.forward must return one wgpar.Tensor, got {type(out).__name__}")
        if not (is_grad_enabled() and any(ctx.needs_input_grad)):
            return out
        n = len(args)

        def bw(g):
            grads = cls.backward(ctx, g)
            if not isinstance(grads, tuple):
                grads = (grads,)
            if len(grads) != n:
                raise RuntimeError(f"{cls.__name__}.backward returned {len(grads)} gradients for {n} inputs")
            for a, ga in zip(args, grads):
                if ga is not None and isinstance(a, Tensor) and ga.shape != a.shape:
                    raise RuntimeError(f"{cls.__name__}.backward: gradient of shape {ga.shape} for an input "
                                       f"of shape {a.shape}")
            return grads

        # save_for_backward takes None (an optional input), as torch's does; only tensors are checked
        saved = [t for t in ctx.saved_tensors if t is not None]
        return record(cls.name or cls.__name__, out, args, bw, saved)
