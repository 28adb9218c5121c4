"""Binary and in-place elementwise ops by name: the checked entry points over ``run_map``.

Integer ``//`` and ``%`` check their divisor for zeros first and raise as PyTorch does; that
check needs a reduction, so it lives here, above both elementwise.py and reduce.py.
"""

from __future__ import annotations

from ..errors import ZeroDivisionRuntimeError
from ..tensor import Tensor
from .elementwise import Operand, is_scalar, result_type, run_map
from .reduce import reduce

_INT_DIVISION = ("floordiv", "mod")


def binary(op: str, a: Operand, b: Operand) -> Tensor:
    """``op(a, b)`` into a new tensor (``op`` a name of ops/registry.py), with NumPy broadcasting.

    Arguments:
        op: the op's name.
        a, b: tensors or Python / NumPy numbers.
    """
    if op in _INT_DIVISION:
        _check_divisor(op, a, b)
    return run_map(op, [a, b])


def inplace(op: str, a: Tensor, b: Operand) -> Tensor:
    """``a = op(a, b)`` in place; the result must keep a's shape and dtype (a float result may be
    stored in another float type).

    Arguments:
        op: the op's name.
        a: the tensor written.
        b: a tensor broadcasting to a's shape, or a number.
    """
    dtype, _ = result_type(op, [a, b], None)
    if dtype is not a.dtype and not (a.dtype.is_float and dtype.is_float):
        raise TypeError(f"{op}_: result type {dtype.name} cannot be stored in place in a {a.dtype.name} tensor")
    if op in _INT_DIVISION:
        _check_divisor(op, a, b)
    run_map(op, [a, b], out=a, out_dtype=a.dtype)
    a._storage.bump_version()
    return a


def _check_divisor(op: str, a: Operand, divisor: Operand) -> None:
    """Raise, as PyTorch does, if an integer ``//`` or ``%`` has a zero divisor.

    A scalar is checked here. A tensor is checked on the host when its values' range is known
    there (``_host_range``: tensors made from host data), else with one 4-byte readback of a
    device-side "any zero" reduction. A flag written by the kernel and read at the next sync
    would spare that readback but raise later, at an unrelated op and maybe in another thread;
    integer division by a tensor is rare in training code, so the error stays at its op.
    """
    operands = (a, divisor)
    if not any(isinstance(x, Tensor) for x in operands) or not all(isinstance(x, Tensor) or is_scalar(x)
                                                                   for x in operands):
        return  # run_map rejects these operands with the error they deserve
    _, cts = result_type(op, [a, divisor], None)
    if cts[1] != "i32":
        return  # float division: a zero divisor gives inf or NaN, as in PyTorch
    sym = "//" if op == "floordiv" else "%"
    if not isinstance(divisor, Tensor):
        if int(divisor) == 0:
            raise ZeroDivisionRuntimeError(f"integer {sym} by zero (the divisor is the scalar {divisor!r})")
        return
    if divisor.numel() == 0:
        return
    rng = divisor._host_range
    if rng is not None and (rng[0] > 0 or rng[1] < 0):
        return
    if reduce("max", run_map("eq", [divisor, 0])).item():
        raise ZeroDivisionRuntimeError(f"integer {sym} by zero: the divisor tensor of shape {divisor.shape} "
                                       f"on {divisor.device} holds a zero")
