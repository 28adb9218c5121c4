"""einsum as permutes, reshapes, sums and one matmul per pair of operands, so it is differentiable and
runs on the tuned matmul kernels.

Operands are contracted left to right. Each contraction sorts the letters of both sides into batch
letters (in both, still needed), contracted letters (in both, needed no more) and the letters of one
side, and multiplies [batch, M, K] by [batch, K, N]. A letter repeated within one operand takes its
diagonal (a multiply by an identity mask, then a sum); a letter nothing else needs is summed first.
``...`` stands for broadcast dims (aligned from the right); a dim of size 1 broadcasts, as in PyTorch.
"""

from __future__ import annotations

import math
import string

from ..creation import eye
from ..tensor import Tensor
from .differentiable import binary, expand, matmul, permute, reduce, reshape

_LETTERS = set(string.ascii_letters)
_ELLIPSIS_BASE = 0x2460  # broadcast dims get characters outside the ASCII letters


def _error(equation: str, why: str) -> ValueError:
    return ValueError(f"einsum({equation!r}): {why}")


def _term(equation: str, text: str, ndim: int | None, width: int) -> list[str]:
    """A subscript string as one character per dim, ``...`` replaced by the broadcast dims' characters."""
    if text.count("...") > 1 or "." in text.replace("...", ""):
        raise _error(equation, f"{text!r}: only one '...' per operand")
    for ch in text.replace("...", ""):
        if ch not in _LETTERS:
            raise _error(equation, f"{text!r}: subscripts are letters a-z, A-Z (and '...'), not {ch!r}")
    letters = len(text.replace("...", ""))
    if "..." not in text:
        if ndim is not None and letters != ndim:
            raise _error(equation, f"{text!r} names {letters} dims of an operand with {ndim}")
        return list(text)
    extra = width if ndim is None else ndim - letters
    if extra < 0:
        raise _error(equation, f"{text!r} names {letters} dims of an operand with {ndim}")
    head, tail = text.split("...")
    return list(head) + [chr(_ELLIPSIS_BASE + width - extra + k) for k in range(extra)] + list(tail)


def _parse(equation: str, operands) -> tuple[list[list[str]], list[str]]:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    texts = lhs.split(",")
    if len(texts) != len(operands):
        raise _error(equation, f"{len(texts)} operand subscripts for {len(operands)} operands")
    width = max((t.ndim - len(s.replace("...", "")) for s, t in zip(texts, operands) if "..." in s), default=0)
    inputs = [_term(equation, s, t.ndim, width) for s, t in zip(texts, operands)]
    if arrow:
        output = _term(equation, rhs, None, width)
        if len(set(output)) != len(output):
            raise _error(equation, f"the output {rhs!r} repeats a subscript")
        seen = {c for term in inputs for c in term}
        missing = [c for c in output if c not in seen]
        if missing:
            raise _error(equation, f"the output names {''.join(missing)!r}, which no operand has")
    else:  # implicit output: broadcast dims, then the letters used once, alphabetically
        counts: dict[str, int] = {}
        for term in inputs:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        output = [chr(_ELLIPSIS_BASE + k) for k in range(width)]
        output += sorted(c for c, k in counts.items() if k == 1 and c in _LETTERS)
    return inputs, output


def _sizes(equation: str, inputs: list[list[str]], operands) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for term, t in zip(inputs, operands):
        for c, n in zip(term, t.shape):
            have = sizes.get(c)
            if have is None or have == 1:
                sizes[c] = n
            elif n not in (have, 1):
                what = f"subscript {c!r}" if c in _LETTERS else "a '...' dim"
                raise _error(equation, f"{what} has size {have} in one operand and {n} in another "
                                       f"(shapes {[tuple(o.shape) for o in operands]})")
    return sizes


def _diagonal(x: Tensor, term: list[str]) -> tuple[Tensor, list[str]]:
    """Take the diagonal of every letter repeated in ``term``."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        p = term.index(c)
        q = term.index(c, p + 1)
        n = x.shape[p]
        mask_shape = [1] * x.ndim
        mask_shape[p] = mask_shape[q] = n
        x = reduce("sum", binary("mul", x, reshape(eye(n, dtype=x.dtype, device=x.device), mask_shape)), q)
        term = term[:q] + term[q + 1:]
    return x, term


def _sum_out(x: Tensor, term: list[str], keep: set[str]) -> tuple[Tensor, list[str]]:
    axes = tuple(i for i, c in enumerate(term) if c not in keep)
    if not axes:
        return x, term
    return reduce("sum", x, axes), [c for c in term if c in keep]


def _contract(a: Tensor, ta: list[str], b: Tensor, tb: list[str], keep: set[str],
              sizes: dict[str, int]) -> tuple[Tensor, list[str]]:
    batch = [c for c in ta if c in tb and c in keep]
    inner = [c for c in ta if c in tb and c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]

    def arrange(x: Tensor, term: list[str], order: list[str], groups: list[list[str]]) -> Tensor:
        x = permute(x, [term.index(c) for c in order])
        full = [sizes[c] for c in order]
        if list(x.shape) != full:  # a dim of size 1 here broadcasts against the other operand's
            x = expand(x, full)
        return reshape(x, [math.prod(sizes[c] for c in g) for g in groups])

    lead = [batch] if batch else []
    a3 = arrange(a, ta, batch + left + inner, lead + [left, inner])
    b3 = arrange(b, tb, batch + inner + right, lead + [inner, right])
    out = matmul(a3, b3)
    term = batch + left + right
    return reshape(out, [sizes[c] for c in term]), term


def einsum(equation: str, *operands: Tensor) -> Tensor:
    """Einstein summation, as torch.einsum: ``einsum("bij,bjk->bik", a, b)``, ``einsum("ii", x)`` (trace),
    ``einsum("...qd,...kd->...qk", q, k)``, implicit outputs (``"ij,jk"``), any number of operands.

    Contractions run as matmuls (float tensors only); a repeated letter in one operand takes a
    diagonal; a dim's sizes must agree across operands or be 1 (it broadcasts, as in PyTorch).
    Malformed equations raise ValueError naming the problem.

    Arguments:
        equation: the subscripts, ``"ij,jk->ik"``.
        operands: the tensors (or one list of them).
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        raise TypeError(f"einsum: the equation must be a string, got {type(equation).__name__}")
    if not operands:
        raise _error(equation, "no operands")
    for x in operands:
        if not isinstance(x, Tensor):
            raise TypeError(f"einsum: operands must be wgpar.Tensors, got {type(x).__name__}")
    inputs, output = _parse(equation, operands)
    sizes = _sizes(equation, inputs, operands)
    terms = []
    for k, (x, term) in enumerate(zip(operands, inputs)):
        x, term = _diagonal(x, term)
        elsewhere = {c for j, other in enumerate(inputs) if j != k for c in other}
        terms.append(_sum_out(x, term, set(output) | elsewhere))
    acc, ta = terms[0]
    for k in range(1, len(terms)):
        b, tb = terms[k]
        keep = set(output) | {c for _, later in terms[k + 1:] for c in later}
        acc, ta = _sum_out(acc, ta, keep | set(tb))
        acc, ta = _contract(acc, ta, b, tb, keep, sizes)
    acc, ta = _sum_out(acc, ta, set(output))
    if ta != output:
        acc = permute(acc, [ta.index(c) for c in output])
    if list(acc.shape) != [sizes[c] for c in output]:
        acc = expand(acc, [sizes[c] for c in output])
    return acc
