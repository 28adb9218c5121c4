"""The elementwise ops, one entry each: name, type rule, WGSL expression, gradients, API and test data.

Everything else about an op follows from its entry: the kernels (ops/elementwise.py compiles the
expression), the backward (autograd/differentiable.py runs each gradient expression as one fused kernel
and saves what the expressions read), the Tensor method, operator and in-place forms
(autograd/methods.py), the top-level ``wgpar.<name>`` function and ``__all__`` (functional.py),
and the parametrised tests (tests/test_registry.py: forward against NumPy in float64, gradients
against finite differences and PyTorch).

Expressions are WGSL over the operands ``x0``, ``x1``, ``x2`` (converted to their compute type)
and call the helpers of shaders/float_fns.wgsl and shaders/elementwise_fns.wgsl; ``{T}`` stands
for the compute type (f32 or i32) where a helper exists per type (``maximum_{T}``). A gradient
is an expression per operand over the same operands, the output ``y`` and the incoming gradient
``g`` (all converted to f32), or None where the op has no gradient for that operand. ``"g"``
alone passes the gradient through without a kernel.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

# How the result type follows from the operands' types.
COMMON = "common"  # the promoted type (bool arithmetic gives int32)
FLOAT = "float"  # the promoted type, float32 if that is not a float type
BOOL = "bool"  # bool (comparisons)
WHERE = "where"  # the promoted type of x1, x2; x0 is a condition in its own type
CAST = "cast"  # the type asked for (copies and casts)
INT = "int"  # the promoted type, which must be int32 or bool (bitwise ops: a float operand raises TypeError)

_VARS = re.compile(r"\b(x[0-3]|y|g)\b")
_erf = np.vectorize(math.erf)
_erfc = np.vectorize(math.erfc)


def _erfinv(y):
    """erfinv in float64 (NumPy has none, SciPy may be absent): Newton's method on erf (erfc near +-1)."""
    y = np.asarray(y, dtype=np.float64)
    a = np.abs(y)
    with np.errstate(all="ignore"):
        x = np.sqrt(-np.log(np.maximum(1.0 - a * a, 1e-300)))  # a start on the right side of the root
        x = np.where(a < 0.5, a * 0.886226925452758, np.minimum(x, 6.0))
        for _ in range(60):  # f(x) = erf(x) - a, written as (1 - a) - erfc(x) near 1 (exact there)
            f = np.where(a < 0.5, _erf(x) - a, (1.0 - a) - _erfc(x))
            x = x - f / (1.1283791670955126 * np.exp(-x * x))
        x = np.where(a == 1.0, np.inf, np.where(a > 1.0, np.nan, x))
    return np.where(np.isnan(y), y, np.copysign(x, y))


def _shift(a, b, left: bool):
    """PyTorch's int32 shifts: by 32 or more, or by a negative amount, << gives 0 and >> the sign (0 or -1)."""
    a, b = np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64)
    ok = (b >= 0) & (b < 32)
    s = np.where(ok, b, 0)
    if left:
        r = np.where(ok, ((a << s) + 2**31) % 2**32 - 2**31, 0)
    else:
        r = np.where(ok, a >> s, np.where(a < 0, -1, 0))
    return r.astype(np.int32)


@dataclass(frozen=True)
class Check:
    """How the generated tests exercise an op.

    ``ref`` computes the op in NumPy float64; ``domain`` names each operand's test values: "any"
    (normal), "pos" (at least 0.5), "nonzero" (|x| at least 0.5), "away0" (|x| at least 0.05,
    off a kink at 0), "unit" (|x| below 0.9), "int" (int32), "intnz" (nonzero int32), "shift"
    (int32 in [0, 32)); ``torch`` is the function compared
    with PyTorch (a dotted name under ``torch``; "" for the op's api name).
    """

    ref: object
    domain: tuple[str, ...] = ("any", "any")
    torch: str | None = ""
    rtol: float = 2e-6
    atol: float = 1e-6


@dataclass(frozen=True)
class Op:
    """One elementwise op.

    Arguments:
        name: the op's name (the key of ``OPS``, the node name in the autograd graph).
        types: the result type rule: COMMON, FLOAT, BOOL, WHERE, CAST or INT.
        expr: its WGSL expression over x0.. (see the module docstring).
        on_bool: its expression where every operand is bool (so the result is; values 0 / 1 in i32), when
            ``expr`` does not hold there (``~`` on a bool is its logical not, not the bits' complement).
        grads: one gradient expression (or None) per operand; empty: not differentiable.
        api: the public name of the Tensor method and ``wgpar.<api>`` function; None for ops used
            only inside wgpar (or exposed by hand-written front ends, as where and clamp are).
        function: whether ``wgpar.<api>`` exists (False: a method only).
        dunder: the operator it implements (``"add"``: ``__add__`` and ``__radd__``; unary ``"neg"``:
            ``__neg__``; comparisons have no reflected form).
        inplace: also an in-place method ``<api>_`` and operator ``__i<dunder>__``.
        alpha: the method and function take PyTorch's ``alpha`` (other * alpha).
        autocast_fp32: inside ``autocast`` its float16 operands run in float32 (torch's autocast float32
            list: ops that need the range).
        check: test data for the generated tests.
        doc: one line for the docstrings of its method and function, saying what differs from PyTorch
            where something does.
    """

    name: str
    types: str
    expr: str
    grads: tuple[str | None, ...] = ()
    on_bool: str | None = None
    api: str | None = ""
    function: bool = True
    dunder: str | None = None
    inplace: bool = False
    alpha: bool = False
    autocast_fp32: bool = False
    check: Check | None = None
    doc: str = ""
    arity: int = field(init=False)

    def __post_init__(self) -> None:
        if self.api == "":
            object.__setattr__(self, "api", self.name)
        arity = 1 + max(int(v[1]) for v in _VARS.findall(self.expr) if v[0] == "x")
        object.__setattr__(self, "arity", arity)
        if self.grads and len(self.grads) != arity:
            raise ValueError(f"op {self.name}: {len(self.grads)} gradients for {arity} operands")

    @property
    def differentiable(self) -> bool:
        return any(g is not None for g in self.grads)


@dataclass(frozen=True)
class GradKernel:
    """A gradient expression made into an elementwise op of its own: ``operands`` names what it
    reads ("g", "x0".., "y") in the order its expression numbers them x0, x1, .."""

    op: str
    operands: tuple[str, ...]


OPS: dict[str, Op] = {}
GRADS: dict[str, tuple[GradKernel | str | None, ...]] = {}  # per operand: a kernel, "g" (pass through) or None
SAVES: dict[str, tuple[str, ...]] = {}  # what the gradients read besides g: operands ("x0"..) and the output "y"


def _define(op: Op) -> None:
    OPS[op.name] = op
    if not op.grads:
        return
    kernels: list[GradKernel | str | None] = []
    for k, expr in enumerate(op.grads):
        if expr is None or expr.strip() == "g":
            kernels.append(expr and "g")
            continue
        names = tuple(v for v in ("g", "x0", "x1", "x2", "x3", "y") if re.search(rf"\b{v}\b", expr))
        renamed = _VARS.sub(lambda m, names=names: f"x{names.index(m.group(1))}", expr)
        grad = Op(f"{op.name}.grad{k}", FLOAT, renamed, api=None)
        OPS[grad.name] = grad
        kernels.append(GradKernel(grad.name, tuple(names)))
    GRADS[op.name] = tuple(kernels)
    SAVES[op.name] = tuple(sorted({v for k in kernels if isinstance(k, GradKernel) for v in k.operands} - {"g"}))


for _op in (
    # -- arithmetic -------------------------------------------------------------------------------
    Op("add", COMMON, "x0 + x1", ("g", "g"), dunder="add", inplace=True, alpha=True, check=Check(np.add),
       doc="a + b, with PyTorch's type promotion (``alpha`` scales b first)"),
    Op("sub", COMMON, "x0 - x1", ("g", "neg_{T}(g)"), dunder="sub", inplace=True, alpha=True,
       check=Check(np.subtract), doc="a - b (``alpha`` scales b first)"),
    Op("mul", COMMON, "x0 * x1", ("g * x1", "g * x0"), dunder="mul", inplace=True, check=Check(np.multiply),
       doc="a * b"),
    Op("div", FLOAT, "div_(x0, x1)", ("div_(g, x1)", "-(div_(g, x1) * y)"), dunder="truediv", inplace=True,
       check=Check(np.divide, ("any", "nonzero")),
       doc="True division a / b: always a float (int32 / int32 is float32, as PyTorch)"),
    Op("pow", FLOAT, "fpow(x0, x1)", ("g * (x1 * fpow(x0, x1 - 1.0))", "g * (y * log_(x0))"), dunder="pow",
       inplace=True, autocast_fp32=True, check=Check(np.power, ("pos", "any"), rtol=1e-5),
       doc="a ** b, always a float: int32 ** int32 is float32 (PyTorch keeps integers)"),
    Op("floordiv", COMMON, "floordiv_{T}(x0, x1)", api="floor_divide", dunder="floordiv",
       check=Check(np.floor_divide, ("int", "intnz")),
       doc="a // b, rounded toward -inf (PyTorch's floor_divide); an integer zero divisor raises; int32 wraps"),
    Op("mod", COMMON, "mod_{T}(x0, x1)", ("g", "g * neg_{T}(floordiv_{T}(x0, x1))"), api="remainder",
       dunder="mod", check=Check(np.mod, ("any", "nonzero"), rtol=1e-5, atol=1e-5),
       doc="The remainder of a / b with b's sign (PyTorch's remainder, Python's %); a zero int divisor raises"),
    Op("maximum", COMMON, "maximum_{T}(x0, x1)",
       ("g * ((1.0 - select(0.0, 1.0, lt_{T}(x0, x1))) - select(0.0, 0.5, eq_{T}(x0, x1)))",
        "g * ((1.0 - select(0.0, 1.0, gt_{T}(x0, x1))) - select(0.0, 0.5, eq_{T}(x0, x1)))"),
       check=Check(np.maximum),
       doc="The larger of a and b; NaN where either is NaN, as PyTorch"),
    Op("minimum", COMMON, "minimum_{T}(x0, x1)",
       ("g * ((1.0 - select(0.0, 1.0, gt_{T}(x0, x1))) - select(0.0, 0.5, eq_{T}(x0, x1)))",
        "g * ((1.0 - select(0.0, 1.0, lt_{T}(x0, x1))) - select(0.0, 0.5, eq_{T}(x0, x1)))"),
       check=Check(np.minimum),
       doc="The smaller of a and b; NaN where either is NaN, as PyTorch"),
    # -- comparisons: IEEE results for NaN operands (elementwise_fns.wgsl) ---------------------------
    Op("eq", BOOL, "eq_{T}(x0, x1)", dunder="eq", check=Check(np.equal, ("int", "int")),
       doc="a == b, as bool (NaN equals nothing)"),
    Op("ne", BOOL, "ne_{T}(x0, x1)", dunder="ne", check=Check(np.not_equal, ("int", "int")),
       doc="a != b, as bool (NaN differs from everything)"),
    Op("lt", BOOL, "lt_{T}(x0, x1)", dunder="lt", check=Check(np.less),
       doc="a < b, as bool (False where either is NaN)"),
    Op("le", BOOL, "le_{T}(x0, x1)", dunder="le", check=Check(np.less_equal),
       doc="a <= b, as bool (False where either is NaN)"),
    Op("gt", BOOL, "gt_{T}(x0, x1)", dunder="gt", check=Check(np.greater),
       doc="a > b, as bool (False where either is NaN)"),
    Op("ge", BOOL, "ge_{T}(x0, x1)", dunder="ge", check=Check(np.greater_equal),
       doc="a >= b, as bool (False where either is NaN)"),
    Op("same", BOOL, "same_{T}(x0, x1)", api=None),  # equal or both NaN: what a max / min reduction picked
    # -- bitwise (int32 and bool; bool & | ^ ~ are logical) and logical (any dtype, bool result) -------
    Op("bitwise_and", INT, "x0 & x1", dunder="and", inplace=True, check=Check(np.bitwise_and, ("int", "int")),
       doc="a & b on int32 or bool tensors (bool: logical and); a float operand raises TypeError "
           "(PyTorch: NotImplementedError)"),
    Op("bitwise_or", INT, "x0 | x1", dunder="or", inplace=True, check=Check(np.bitwise_or, ("int", "int")),
       doc="a | b on int32 or bool tensors (bool: logical or); a float operand raises TypeError "
           "(PyTorch: NotImplementedError)"),
    Op("bitwise_xor", INT, "x0 ^ x1", dunder="xor", inplace=True, check=Check(np.bitwise_xor, ("int", "int")),
       doc="a ^ b on int32 or bool tensors (bool: logical xor); a float operand raises TypeError "
           "(PyTorch: NotImplementedError)"),
    Op("bitwise_not", INT, "~x0", on_bool="select(1i, 0i, nz_{T}(x0))", dunder="invert",
       check=Check(np.invert, ("int",)),
       doc="~x on an int32 or bool tensor (bool: logical not); a float raises TypeError (PyTorch: "
           "NotImplementedError); no in-place bitwise_not_"),
    Op("bitwise_left_shift", INT, "shl_{T}(x0, x1)", dunder="lshift", inplace=True,
       check=Check(lambda a, b: _shift(a, b, True), ("int", "shift")),
       doc="a << b on int32 tensors, wrapping; a shift by 32 or more or by a negative amount gives 0, as "
           "PyTorch; bool and float operands raise TypeError"),
    Op("bitwise_right_shift", INT, "shr_{T}(x0, x1)", dunder="rshift", inplace=True,
       check=Check(lambda a, b: _shift(a, b, False), ("int", "shift")),
       doc="a >> b on int32 tensors, arithmetic (the sign fills in); a shift by 32 or more or by a negative "
           "amount gives 0 or -1 by the sign, as PyTorch; bool and float operands raise TypeError"),
    Op("logical_and", BOOL, "nz_{T}(x0) && nz_{T}(x1)", check=Check(np.logical_and, ("any", "int")),
       doc="Whether a and b are both nonzero, as bool, for any dtypes (NaN is nonzero); no in-place form"),
    Op("logical_or", BOOL, "nz_{T}(x0) || nz_{T}(x1)", check=Check(np.logical_or, ("any", "int")),
       doc="Whether a or b is nonzero, as bool, for any dtypes (NaN is nonzero); no in-place form"),
    Op("logical_xor", BOOL, "nz_{T}(x0) != nz_{T}(x1)", check=Check(np.logical_xor, ("any", "int")),
       doc="Whether exactly one of a and b is nonzero, as bool, for any dtypes (NaN is nonzero); no in-place form"),
    Op("logical_not", BOOL, "!nz_{T}(x0)", check=Check(np.logical_not, ("any",)),
       doc="Whether x is zero, as bool, for any dtype (NaN is nonzero); no in-place form"),
    # -- unary ------------------------------------------------------------------------------------
    Op("neg", COMMON, "neg_{T}(x0)", ("neg_{T}(g)",), dunder="neg", check=Check(np.negative, ("any",)),
       doc="-x (int32 wraps: -INT_MIN is INT_MIN)"),
    Op("abs", COMMON, "abs_{T}(x0)", ("g * sign_{T}(x0)",), dunder="abs", check=Check(np.abs, ("away0",)),
       doc="|x| (int32 wraps: abs(INT_MIN) is INT_MIN)"),
    Op("sign", COMMON, "sign_{T}(x0)", check=Check(np.sign, ("any",)),
       doc="-1, 0 or 1 by the sign of x; sign(NaN) is 0, as PyTorch"),
    Op("relu", COMMON, "relu_{T}(x0)", ("relu_bwd_{T}(x0, g)",), check=Check(lambda x: np.maximum(x, 0), ("away0",)),
       doc="max(x, 0); NaN stays NaN, as PyTorch"),
    Op("exp", FLOAT, "exp_(x0)", ("g * y",), autocast_fp32=True, check=Check(np.exp, ("any",), rtol=1e-5),
       doc="e ** x (an integer tensor gives float32)"),
    Op("log", FLOAT, "log_(x0)", ("div_(g, x0)",), autocast_fp32=True, check=Check(np.log, ("pos",), rtol=1e-5),
       doc="The natural logarithm (an integer tensor gives float32)"),
    Op("sqrt", FLOAT, "sqrt_(x0)", ("div_(g * 0.5, y)",), check=Check(np.sqrt, ("pos",), rtol=1e-5),
       doc="The square root (an integer tensor gives float32)"),
    Op("rsqrt", FLOAT, "rsqrt_(x0)", ("g * (fpow(y, 3.0) * -0.5)",), autocast_fp32=True,
       check=Check(lambda x: 1 / np.sqrt(x), ("pos",), rtol=1e-5),
       doc="1 / sqrt(x) (an integer tensor gives float32)"),
    Op("tanh", FLOAT, "tanh_(x0)", ("g * (1.0 - y * y)",), check=Check(np.tanh, ("any",), rtol=1e-5),
       doc="The hyperbolic tangent (an integer tensor gives float32)"),
    Op("sigmoid", FLOAT, "sigmoid_(x0)", ("g * y * (1.0 - y)",),
       check=Check(lambda x: 1 / (1 + np.exp(-x)), ("any",), rtol=1e-5),
       doc="1 / (1 + exp(-x)), without overflow (an integer tensor gives float32)"),
    Op("softplus", FLOAT, "softplus_(x0)", ("g * sigmoid_(x0)",),
       check=Check(lambda x: np.logaddexp(0.0, x), ("any",), torch="nn.functional.softplus", rtol=1e-5),
       doc="log(1 + exp(x)), without overflow (PyTorch's nn.functional.softplus with beta 1)"),
    Op("gelu", FLOAT, "gelu_(x0)", ("g * gelu_grad_(x0)",),
       check=Check(lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), ("any",), torch="nn.functional.gelu",
                   rtol=1e-5),
       doc="The exact (erf) GELU, PyTorch's default (an integer tensor gives float32)"),
    # PyTorch's gelu(approximate="tanh"); reached through nn.functional.gelu and nn.GELU.
    Op("gelu_tanh", FLOAT, "gelu_tanh_(x0)", ("g * gelu_tanh_grad_(x0)",), api=None,
       check=Check(lambda x: 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))), ("any",),
                   rtol=1e-5)),
    Op("expm1", FLOAT, "expm1_(x0)", ("g * (y + 1.0)",), check=Check(np.expm1, ("any",), rtol=1e-5),
       doc="exp(x) - 1, accurate near 0 (an integer tensor gives float32)"),
    Op("log1p", FLOAT, "log1p_full_(x0)", ("div_(g, 1.0 + x0)",), check=Check(np.log1p, ("pos",), rtol=1e-5),
       doc="log(1 + x), accurate near 0 (an integer tensor gives float32)"),
    Op("log2", FLOAT, "log2_(x0)", ("div_(g, x0 * 0.6931471805599453)",), check=Check(np.log2, ("pos",), rtol=1e-5),
       doc="The base-2 logarithm (an integer tensor gives float32)"),
    Op("log10", FLOAT, "log10_(x0)", ("div_(g, x0 * 2.302585092994046)",),
       check=Check(np.log10, ("pos",), rtol=1e-5), doc="The base-10 logarithm (an integer tensor gives float32)"),
    Op("exp2", FLOAT, "exp2_(x0)", ("g * y * 0.6931471805599453",), check=Check(np.exp2, ("any",), rtol=1e-5),
       doc="2 ** x (an integer tensor gives float32)"),
    Op("asin", FLOAT, "asin_(x0)", ("div_(g, sqrt_(1.0 - x0 * x0))",), check=Check(np.arcsin, ("unit",), rtol=1e-5),
       doc="The arcsine; NaN outside [-1, 1] (an integer tensor gives float32)"),
    Op("acos", FLOAT, "acos_(x0)", ("-div_(g, sqrt_(1.0 - x0 * x0))",),
       check=Check(np.arccos, ("unit",), rtol=1e-5),
       doc="The arccosine; NaN outside [-1, 1] (an integer tensor gives float32)"),
    Op("atan2", FLOAT, "atan2_(x0, x1)",
       ("div_(g * x1, x0 * x0 + x1 * x1)", "div_(-(g * x0), x0 * x0 + x1 * x1)"),
       check=Check(np.arctan2, rtol=1e-6),
       doc="The angle of the point (b, a), atan2(a, b) in [-pi, pi], within a few ulp (own polynomial, not the "
           "driver's atan2); an integer tensor gives float32"),
    Op("arctan2", FLOAT, "atan2_(x0, x1)",
       ("div_(g * x1, x0 * x0 + x1 * x1)", "div_(-(g * x0), x0 * x0 + x1 * x1)"),
       check=Check(np.arctan2, torch="atan2", rtol=1e-6), doc="atan2 under NumPy's name (as PyTorch's arctan2)"),
    Op("reciprocal", FLOAT, "div_(1.0, x0)", ("-(g * y * y)",), check=Check(np.reciprocal, ("nonzero",)),
       doc="1 / x, always a float (an integer tensor gives float32, as PyTorch)"),
    Op("erf", FLOAT, "erf_full_(x0)", ("g * 1.1283791670955126 * exp_(-(x0 * x0))",),
       check=Check(_erf, ("any",), rtol=1e-6, atol=1e-7),
       doc="The error function, within a few ulp (own series and fit, not the driver's exp: erf(x) for tiny x "
           "is x * 2 / sqrt(pi)); an integer tensor gives float32"),
    Op("erfc", FLOAT, "erfc_(x0)", ("g * -1.1283791670955126 * exp_(-(x0 * x0))",),
       check=Check(_erfc, ("any",), rtol=1e-6, atol=1e-7),
       doc="1 - erf(x) without the cancellation, within a few ulp down to the smallest normal float32 "
           "(values below it may be flushed to 0 on GPUs); an integer tensor gives float32"),
    Op("erfinv", FLOAT, "erfinv_(x0)", ("g * 0.886226925452758 * exp_(y * y)",),
       check=Check(_erfinv, ("unit",), rtol=2e-6, atol=1e-7),
       doc="The inverse of erf on [-1, 1] (+-inf at +-1, NaN outside), from Newton steps on erf; an integer "
           "tensor gives float32"),
    Op("atan", FLOAT, "atan_(x0)", ("div_(g, 1.0 + x0 * x0)",), check=Check(np.arctan, ("any",), rtol=1e-5),
       doc="The arctangent (an integer tensor gives float32)"),
    Op("sin", FLOAT, "sin_(x0)", ("g * cos_(x0)",), check=Check(np.sin, ("any",), rtol=1e-5),
       doc="The sine, within a few ulp over the whole float32 range: exact argument reduction, not the "
           "driver's (an integer tensor gives float32)"),
    Op("cos", FLOAT, "cos_(x0)", ("-(g * sin_(x0))",), check=Check(np.cos, ("any",), rtol=1e-5),
       doc="The cosine, within a few ulp over the whole float32 range: exact argument reduction, not the "
           "driver's (an integer tensor gives float32)"),
    Op("tan", FLOAT, "tan_(x0)", ("g * (1.0 + y * y)",), check=Check(np.tan, ("any",), rtol=1e-5),
       doc="The tangent, within a few ulp over the whole float32 range: exact argument reduction, not the "
           "driver's (an integer tensor gives float32)"),
    Op("sinh", FLOAT, "sinh_(x0)", ("g * cosh_(x0)",), check=Check(np.sinh, ("any",), rtol=1e-5),
       doc="The hyperbolic sine, accurate near 0 (an integer tensor gives float32)"),
    Op("cosh", FLOAT, "cosh_(x0)", ("g * sinh_(x0)",), check=Check(np.cosh, ("any",), rtol=1e-5),
       doc="The hyperbolic cosine (an integer tensor gives float32)"),
    # -- rounding: the gradient is zero, as PyTorch's (zero_ in elementwise_fns.wgsl) ------------------
    Op("round", COMMON, "round_{T}(x0)", ("zero_(g)",), check=Check(np.round, ("any",)),
       doc="x rounded to the nearest integer, halves to even (as PyTorch; no decimals= argument); "
           "an int32 tensor is returned unchanged"),
    Op("floor", COMMON, "floor_{T}(x0)", ("zero_(g)",), check=Check(np.floor, ("any",)),
       doc="The largest integer <= x (an int32 tensor unchanged); the gradient is zero, as PyTorch"),
    Op("ceil", COMMON, "ceil_{T}(x0)", ("zero_(g)",), check=Check(np.ceil, ("any",)),
       doc="The smallest integer >= x (an int32 tensor unchanged); the gradient is zero, as PyTorch"),
    Op("trunc", COMMON, "trunc_{T}(x0)", ("zero_(g)",), check=Check(np.trunc, ("any",)),
       doc="x rounded toward zero (an int32 tensor unchanged); the gradient is zero, as PyTorch"),
    # -- classification: bool results ----------------------------------------------------------------
    Op("isnan", BOOL, "isnan_{T}(x0)", check=Check(np.isnan, ("any",)), doc="Whether x is NaN, as bool"),
    Op("isinf", BOOL, "isinf_{T}(x0)", check=Check(np.isinf, ("any",)),
       doc="Whether x is +inf or -inf, as bool"),
    Op("isfinite", BOOL, "isfinite_{T}(x0)", check=Check(np.isfinite, ("any",)),
       doc="Whether x is neither NaN nor infinite, as bool (an integer always is)"),
    # -- selection, clamping, copies (front ends by hand: wgpar.where, Tensor.clamp, Tensor.to) ----
    Op("where", WHERE, "select(x2, x1, nz_{T}(x0))",  # {T}: the condition's compute type
       (None, "select(0.0, g, nz_{T}(x0))", "select(g, 0.0, nz_{T}(x0))"), api=None),
    # PyTorch's clamp rule: x gets g where min <= x <= max (so 0 at a NaN), a bound where it was taken
    # (with min > max the result is max: min gets nothing).
    Op("clamp", COMMON, "minimum_{T}(maximum_{T}(x0, x1), x2)",
       ("select(0.0, g, ge_{T}(x0, x1) && le_{T}(x0, x2))", "select(0.0, g, lt_{T}(x0, x1) && lt_{T}(x1, x2))",
        "select(0.0, g, gt_{T}(x0, x2) || lt_{T}(x2, x1))"), api=None),
    Op("clamp_min", COMMON, "maximum_{T}(x0, x1)",
       ("select(0.0, g, ge_{T}(x0, x1))", "select(0.0, g, lt_{T}(x0, x1))"), api=None),
    Op("clamp_max", COMMON, "minimum_{T}(x0, x1)",
       ("select(0.0, g, le_{T}(x0, x1))", "select(0.0, g, gt_{T}(x0, x1))"), api=None),
    Op("copy", CAST, "x0", api=None),
):
    _define(_op)
