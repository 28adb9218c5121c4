"""Reductions of host arrays, in blocks on the shared host thread pool.

Each rank reduces its slice of a collective's result from every rank's mapped
readback straight into the mapped upload buffers. Upload mappings may be
write-combined or device memory (resizable BAR), where reads are orders of
magnitude slower than writes, so each block of the result is built in a
cached scratch block and only ever written to them. Blocks run on a thread
pool (NumPy releases the GIL): one core cannot keep up with PCIe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial

import numpy as np

from ...dtypes import DType
from ...runtime.transfer import host_pool

BLOCK = 1 << 20  # elements per block: a worker's scratch block stays in its cache
MIN_BLOCK = 1 << 16  # the fewest items per block when a job is split over the pool's workers (a task costs ~20 us)
_scratch = threading.local()
_U32 = np.uint32


def _block_scratch(name: str, dtype) -> np.ndarray:
    """BLOCK items of ``dtype``, this thread's own (made once)."""
    a = getattr(_scratch, name, None)
    if a is None or a.dtype != dtype:
        a = np.empty(BLOCK, dtype=dtype)
        setattr(_scratch, name, a)
    return a


# NumPy converts float16 element by element (~20x a copy): these take a few whole-array integer passes
# instead (about 2x faster) and give NumPy's bits.

def f16_to_f32(h: np.ndarray, out: np.ndarray, tmp: np.ndarray, mask: np.ndarray) -> None:
    """``out[:] = h`` (float16 -> float32, exact). ``tmp``: uint32, ``mask``: bool scratch of h's length."""
    bits, o = h.view(np.uint16), out.view(_U32)
    np.bitwise_and(bits, 0x7fff, out=o, casting="unsafe")
    np.left_shift(o, 13, out=o)
    np.multiply(out, np.float32(2.0 ** 112), out=out)  # rebias the exponent: exact for normals and subnormals
    np.greater_equal(out, np.float32(65536), out=mask)  # exponent 31: infinity or NaN (payload kept)
    np.bitwise_or(o, _U32(0x7f800000), out=o, where=mask)
    np.bitwise_and(bits, 0x8000, out=tmp, casting="unsafe")
    np.left_shift(tmp, 16, out=tmp)
    np.bitwise_or(o, tmp, out=o)


def f32_to_f16(x: np.ndarray, out: np.ndarray, a: np.ndarray, h: np.ndarray, mask: np.ndarray) -> None:
    """``out[:] = x`` (float32 -> float16, to nearest even; overflow is infinity, a NaN keeps the top of its
    payload, at least one bit, as NumPy's cast does). ``a``, ``h``: uint32, ``mask``: bool scratch of x's
    length; ``out`` is only written (it may be mapped upload memory)."""
    u = x.view(_U32)
    np.bitwise_and(u, _U32(0x7fffffff), out=a)
    np.right_shift(a, 13, out=h)  # normal results: rebias, round half to even at bit 13
    np.bitwise_and(h, _U32(1), out=h)
    np.add(h, a, out=h)
    np.add(h, _U32(0xC8000FFF), out=h)  # ((15 - 127) << 23) + 0xfff, mod 2**32
    np.right_shift(h, 13, out=h)
    np.greater_equal(a, _U32(0x47800000), out=mask)  # |x| >= 65536, infinity, NaN
    if mask.any():
        big = np.nonzero(mask)[0]
        pay = (a[big] & _U32(0x7fffff)) >> _U32(13)
        pay[pay == 0] = 1
        h[big] = np.where(a[big] > 0x7f800000, pay | _U32(0x7c00), _U32(0x7c00))
    np.less(a, _U32(0x38800000), out=mask)  # subnormal results and zeros: a float add rounds at 2**-24
    if mask.any():
        f = a.view(np.float32)
        np.add(f, np.float32(0.5), out=f, where=mask)
        np.subtract(a, _U32(0x3f000000), out=h, where=mask)
    np.right_shift(u, 16, out=a)
    np.bitwise_and(a, _U32(0x8000), out=a)
    np.bitwise_or(h, a, out=h)
    np.copyto(out.view(np.uint16), h, casting="unsafe")


def host_dtype(dtype: DType) -> np.dtype:
    """The NumPy dtype of a tensor's bytes on the host (bool is stored as one int32 per element)."""
    return np.dtype(np.int32) if dtype.storage == "i32" else dtype.np


def check_reducible(dtype: DType, op: str, what: str) -> None:
    if op == "mean" and not dtype.is_float:
        raise TypeError(f"{what}: op 'mean' needs a float tensor, got {dtype.name}: reduce with op 'sum' and "
                        "divide by world_size yourself (an integer mean must choose its rounding), or reduce a float "
                        "copy (tensor.float())")


def _ufunc(op: str, is_bool: bool):
    if is_bool:  # 0/1 values: sum and max are "any", prod and min are "all"
        return np.maximum if op in ("sum", "max") else np.minimum
    return {"sum": np.add, "mean": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]


Task = Callable[[], None]


def blocks(n: int, block: int, workers: int = 0, align: int = 16) -> list[tuple[int, int]]:
    """``[0, n)`` as ``(a, b)`` blocks of at most ``block`` items; with ``workers``, of about ``n / workers``
    items instead where that is smaller (but at least MIN_BLOCK: a task costs tens of microseconds), so
    that one job of a few blocks still spreads over the pool. Block starts are multiples of ``align``."""
    if n <= 0:
        return []
    size = block if block > 0 else BLOCK
    if workers > 1:
        size = min(size, max(MIN_BLOCK, -(-n // workers)))
    size = max(align, -(-size // align) * align)
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def reduce_tasks(parts: Sequence[np.ndarray], targets: Sequence[np.ndarray], op: str, is_bool: bool = False,
                 block: int = BLOCK, acc: np.ndarray | None = None, workers: int = 0) -> list[Task]:
    """The blocks of ``reduce_into`` as tasks (run them with ``run_tasks``; any order, any thread)."""
    n = len(parts[0]) if parts else 0
    if n == 0:
        return []
    fn = _ufunc(op, is_bool)
    world = len(parts)
    half = parts[0].dtype == np.float16
    acc_dtype = np.dtype(np.float32) if half else parts[0].dtype
    out = acc

    def run_block(a: int, b: int) -> None:
        if world == 1:
            for t in targets if out is None else (out, *targets):
                np.copyto(t[a:b], parts[0][a:b], casting="unsafe")
            return
        m = b - a
        acc = out[a:b] if out is not None else _block_scratch("block", acc_dtype)[:m]
        if half:  # float16 parts are added as float32 from the first pair on (not rounded to float16 first)
            u, mask, t = _block_scratch("u", _U32)[:m], _block_scratch("mask", np.bool_)[:m], \
                _block_scratch("t", np.float32)[:m]
            f16_to_f32(parts[0][a:b], acc, u, mask)
            for p in parts[1:]:
                f16_to_f32(p[a:b], t, u, mask)
                fn(acc, t, out=acc)
        else:
            fn(parts[0][a:b], parts[1][a:b], out=acc)
            for p in parts[2:]:
                fn(acc, p[a:b], out=acc)
        if op == "mean":
            np.divide(acc, world, out=acc)
        src = acc
        if half and all(t.dtype == np.float16 for t in targets):  # rounded once, copied to every other target
            src = targets[0][a:b] if len(targets) == 1 else _block_scratch("h", np.float16)[:m]
            f32_to_f16(acc, src, _block_scratch("u", _U32)[:m], _block_scratch("u2", _U32)[:m],
                       _block_scratch("mask", np.bool_)[:m])
            if len(targets) == 1:
                return
        for t in targets:
            np.copyto(t[a:b], src, casting="unsafe")

    return [partial(run_block, a, b) for a, b in blocks(n, min(block, BLOCK), workers)]


def copy_tasks(dst: np.ndarray, src: np.ndarray, divide: float | None = None, block: int = BLOCK,
               workers: int = 0) -> list[Task]:
    """The blocks of ``copy_into`` as tasks (run them with ``run_tasks``)."""
    def run_block(a: int, b: int) -> None:
        if divide is None:
            np.copyto(dst[a:b], src[a:b])
        else:
            np.divide(src[a:b], divide, out=dst[a:b], casting="unsafe")

    return [partial(run_block, a, b) for a, b in blocks(len(src), block, workers)]


def _run_all(tasks: Sequence[Task]) -> None:
    for t in tasks:
        t()


def bundle(tasks: Sequence[Task], n: int) -> list[Task]:
    """At most ``n`` tasks that run ``tasks`` (task k: tasks k, k + n, ...; jobs split into about ``n``
    blocks each thus give every task one block of each job). Fewer, larger tasks for the pool: each
    task costs its worker the GIL for its bookkeeping, and with many workers on small blocks the GIL,
    not memory, becomes the limit."""
    if n < 1 or len(tasks) <= n:
        return list(tasks)
    return [partial(_run_all, tasks[k::n]) for k in range(n)]


def submit_tasks(tasks: Sequence[Task]) -> list[Future]:
    """Start ``tasks`` on the host pool; wait for them with ``finish_tasks``."""
    if not tasks:
        return []
    pool = host_pool()
    return [pool.submit(t) for t in tasks]


def finish_tasks(futures: Sequence[Future]) -> None:
    """Wait for every one of ``futures`` (all of them, even after one failed), then raise the first error."""
    error = None
    for f in futures:
        try:
            f.result()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, once every task has stopped
            if error is None:
                error = exc
    if error is not None:
        raise error


def run_tasks(tasks: Sequence[Task]) -> None:
    """Run ``tasks`` on the host pool and wait for all of them (a single task runs on the caller)."""
    if len(tasks) <= 1:
        for t in tasks:
            t()
        return
    finish_tasks(submit_tasks(tasks))


def reduce_into(parts: Sequence[np.ndarray], targets: Sequence[np.ndarray], op: str, is_bool: bool = False,
                block: int = BLOCK, acc: np.ndarray | None = None) -> None:
    """Reduce equal-length ``parts`` elementwise and write the result into every array of ``targets``.

    float16 accumulates in float32; NaN propagates (np.maximum / np.minimum / np.add do). ``block``
    (at most BLOCK) elements per task on the host pool. ``acc``: cached memory of the accumulation
    dtype (float32 for float16 parts) that receives the result too: the reduction accumulates in it
    instead of a scratch block (the same operations, so the same bits).
    """
    run_tasks(reduce_tasks(parts, targets, op, is_bool, block, acc))


def copy_into(dst: np.ndarray, src: np.ndarray, divide: float | None = None, block: int = BLOCK) -> None:
    """``dst[:] = src`` (or ``src / divide``, cast to dst's dtype) in blocks on the host pool (large copies
    between mappings)."""
    run_tasks(copy_tasks(dst, src, divide, block))
