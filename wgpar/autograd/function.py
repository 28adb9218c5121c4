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
        """Keep tensors for backward (``ctx.save_for_backward`` in torch); read them back as ``ctx.saved_tensors``.

        As in torch, modifying one of them in place before backward makes backward raise RuntimeError.

        Arguments:
            tensors: Tensors or None.
        """
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward takes tensors, got {type(t).__name__}")
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple[Tensor, ...]:
        """The tensors given to ``save_for_backward``, in that order."""
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
        """Compute the output from the inputs (override it as a staticmethod, as in ``torch.autograd.Function``).

        Runs under no_grad; it must return one Tensor (several outputs are not supported). Save what
        backward needs with ``ctx.save_for_backward``.

        Arguments:
            ctx: the Context shared with backward.
            args, kwargs: what ``apply`` was called with.
        """
        raise NotImplementedError("Function subclasses must implement forward(ctx, *args)")

    @staticmethod
    def backward(ctx: Context, grad: Tensor):
        """Gradients of the inputs from the gradient of the output (override it as a staticmethod).

        Return one gradient per positional argument of ``apply`` (a tuple when there are several; None for
        an input without gradient); each must have its input's shape (checked).

        Arguments:
            ctx: the Context forward filled.
            grad: the gradient with respect to the output.
        """
        raise NotImplementedError("Function subclasses must implement backward(ctx, grad)")

    @classmethod
    def apply(cls, *args, **kwargs) -> Tensor:
        """Run ``forward`` and, when grad is enabled and some tensor argument requires grad, record one graph
        node whose backward calls ``backward``, as ``torch.autograd.Function.apply``.

        Arguments:
            args, kwargs: passed to ``forward`` after the context; only positional tensors get gradients.
        """
        ctx = Context(tuple(isinstance(a, Tensor) and a.requires_grad for a in args))
        recording = is_grad_enabled()
        if recording:
            with no_grad():
                out = cls.forward(ctx, *args, **kwargs)
        else:  # already off (inference): no switch to make
            out = cls.forward(ctx, *args, **kwargs)
        if not isinstance(out, Tensor):
            raise TypeError(f"{cls.__name__}.forward must return one wgpar.Tensor, got {type(out).__name__}")
        if not (recording and any(ctx.needs_input_grad)):
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
