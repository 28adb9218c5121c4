"""ProcessGroup: one rank's view of a group of ranks, and the Work handle of an asynchronous collective.

Every parallel strategy in wgpar is written against this interface only (one
rank, its device, its group), so the same code runs on thread ranks of one
process (``backends/threads.py``) and on processes under MPI. A backend
implements the ``_``-prefixed methods, each returning a :class:`Work`; the
public methods here validate their arguments once for every backend and
either return the Work (``async_op=True``) or wait for it.

Semantics shared by every backend:

- Collectives on one group match by order: the k-th collective a rank calls
  meets the k-th collective of every other rank. Each carries a kind (the
  method, plus the caller's ``label``); ranks that call different kinds at the
  same position, or disagree on shapes, dtypes or the reduction, raise a
  CollectiveError naming the ranks and what differs, instead of mixing data.
- An asynchronous collective reads its input when it is called (in the
  device's stream order) and writes its output some time before ``wait``
  returns: do not touch either tensor until then.
- Every wait has a timeout (``group.timeout``). A rank that fails aborts the
  group; a rank that never arrives is named by the others' timeouts. Either
  way every rank raises, and the group refuses further collectives until
  ``reset()`` (called when no rank is inside a collective).
- ``send`` deposits its message and completes without waiting for the
  receiver; ``recv`` waits (with the timeout) for the matching message. Messages
  between two ranks with the same tag arrive in the order they were sent.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from typing import Any

from ..runtime.device import Device
from ..tensor import Tensor
from .errors import CollectiveError, CollectiveTimeoutError

DEFAULT_TIMEOUT = 300.0
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
_ALIASES = {"avg": "mean", "product": "prod"}


def split_sizes(n: int, parts: int) -> list[int]:
    """Split n as evenly as possible: the first n % parts get one more (never drops anything)."""
    base, extra = divmod(n, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


def check_reduce_op(op: str, what: str) -> str:
    """The canonical name of a reduction ("avg" -> "mean"); ValueError naming the valid ones."""
    name = _ALIASES.get(op, op) if isinstance(op, str) else op
    if name not in REDUCE_OPS:
        raise ValueError(f"{what}: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    return name


class Work:
    """Handle of an asynchronous collective.

    ``wait(timeout=None)`` blocks until the collective has finished and returns its result
    (the output tensor, or list of tensors); it raises the collective's error, or a
    CollectiveTimeoutError when it is not done within ``timeout`` seconds (the group's limit
    when None: the collective itself fails before that if a rank is missing).
    ``is_completed()`` polls without blocking.
    """

    __slots__ = ("what", "_limit", "_done", "_result", "_error")

    def __init__(self, what: str, limit: float) -> None:
        self.what = what
        self._limit = limit
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    @classmethod
    def completed(cls, what: str, result: Any = None) -> Work:
        """A Work already done, holding ``result`` (for operations that finish at once).

        Arguments:
            what: the operation's name, for errors.
            result: what ``wait()`` returns.
        """
        work = cls(what, 0.0)
        work.set_result(result)
        return work

    def set_result(self, result: Any) -> None:
        """Complete the work with ``result`` (backends call it).

        Arguments:
            result: what ``wait()`` returns.
        """
        self._result = result
        self._done.set()

    def set_error(self, error: BaseException) -> None:
        """Complete the work with an error that ``wait()`` raises (backends call it).

        Arguments:
            error: the exception.
        """
        self._error = error
        self._done.set()

    def is_completed(self) -> bool:
        """Whether the collective has finished (successfully or not), without blocking."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the collective finished and return its result, as ``torch.distributed.Work.wait``.

        Raises the collective's error (a CollectiveError), or CollectiveTimeoutError after ``timeout``.

        Arguments:
            timeout: seconds to wait (None: the group's limit).
        """
        limit = self._limit if timeout is None else float(timeout)
        if not self._done.wait(limit):
            raise CollectiveTimeoutError(f"{self.what}: not complete after {limit:g} s")
        err = self._error
        if err is not None:
            # A fresh exception per wait: the same handle may be waited on more than once.
            if isinstance(err, CollectiveError):
                raise type(err)(str(err)) from err
            raise CollectiveError(f"{self.what} failed: {type(err).__name__}: {err}") from err
        return self._result

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self.is_completed() else "pending"
        return f"<Work {self.what} {state}>"


def wait_all(works: Sequence[Work], timeout: float | None = None) -> list[Any]:
    """Wait for every handle in order; returns their results."""
    return [w.wait(timeout) for w in works]


class ProcessGroup(abc.ABC):
    """One rank's view of a group: its rank, the group's size, its device, and the collectives.

    Backends set ``rank``, ``world_size``, ``device``, ``ranks`` (the members' ranks in the
    group this one was split from, or ``range(world_size)`` for a root group) and implement the
    ``_``-prefixed methods, each returning a Work.
    """

    rank: int
    world_size: int
    device: Device
    ranks: tuple[int, ...]
    backend: str = "?"

    # -- what a backend implements --------------------------------------------------------
    @property
    @abc.abstractmethod
    def timeout(self) -> float:
        """Seconds every wait inside a collective may take before the group is aborted."""

    @abc.abstractmethod
    def _all_reduce(self, tensor: Tensor, op: str, label: str | None) -> Work: ...

    @abc.abstractmethod
    def _broadcast(self, tensor: Tensor, src: int, label: str | None) -> Work: ...

    @abc.abstractmethod
    def _all_gather(self, tensor: Tensor, label: str | None) -> Work: ...

    @abc.abstractmethod
    def _all_gather_into(self, output: Tensor, tensor: Tensor, label: str | None) -> Work: ...

    @abc.abstractmethod
    def _reduce_scatter(self, tensor: Tensor, op: str, label: str | None) -> Work: ...

    @abc.abstractmethod
    def _reduce_scatter_into(self, output: Tensor, tensor: Tensor, op: str, label: str | None) -> Work: ...

    @abc.abstractmethod
    def _send(self, tensor: Tensor, dst: int, tag: int) -> Work: ...

    @abc.abstractmethod
    def _recv(self, tensor: Tensor | None, src: int, tag: int) -> Work: ...

    @abc.abstractmethod
    def _barrier(self, label: str | None) -> Work: ...

    @abc.abstractmethod
    def _split(self, ranks: tuple[int, ...]) -> ProcessGroup | None: ...

    @abc.abstractmethod
    def abort(self, reason: str) -> None:
        """Mark the group broken: every rank waiting in (or later entering) a collective raises."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget a failure and everything pending, so the group can be used again."""

    @property
    @abc.abstractmethod
    def broken(self) -> str | None:
        """Why the group is broken, or None."""

    # -- validation shared by every backend -----------------------------------------------
    def _check(self, tensor: Tensor, what: str) -> None:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{what}: expected a wgpar.Tensor, got {type(tensor).__name__}")
        if tensor.device is not self.device:
            raise ValueError(f"{what} on rank {self.rank}: the tensor of shape {tensor.shape} is on "
                             f"{tensor.device}, but this rank owns {self.device}")

    def _check_peer(self, peer: int, what: str) -> int:
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < self.world_size:
            raise ValueError(f"{what} on rank {self.rank}: peer rank {peer!r} out of range for a group of "
                             f"{self.world_size}")
        return peer

    @staticmethod
    def _finish(work: Work, async_op: bool):
        return work if async_op else work.wait()

    # -- collectives ----------------------------------------------------------------------
    def all_reduce(self, tensor: Tensor, op: str = "sum", *, async_op: bool = False, label: str | None = None):
        """Reduce ``tensor`` over ranks (sum, mean, max, min, prod) and write the result into it, in place.

        Arguments:
            tensor: this rank's tensor; same shape and dtype on every rank.
            op: the reduction ("avg" is "mean"); NaN propagates. "mean" needs a float tensor: on an
                integer (or bool) tensor it raises TypeError before any communication (the group stays
                usable), since an integer mean must choose its rounding; reduce with "sum" and divide by
                ``world_size``, or reduce a float copy (``tensor.float()``).
            async_op: return a Work instead of waiting.
            label: part of the collective's kind, checked across ranks (e.g. a bucket's name).
        Returns ``tensor`` (or a Work whose ``wait()`` returns it).
        """
        self._check(tensor, "all_reduce")
        op = check_reduce_op(op, "all_reduce")
        return self._finish(self._all_reduce(tensor, op, label), async_op)

    def broadcast(self, tensor: Tensor, src: int = 0, *, async_op: bool = False, label: str | None = None):
        """Overwrite ``tensor`` on every rank with rank ``src``'s values (same shape and dtype everywhere)."""
        self._check(tensor, "broadcast")
        self._check_peer(src, "broadcast")
        return self._finish(self._broadcast(tensor, src, label), async_op)

    def all_gather(self, tensor: Tensor, *, async_op: bool = False, label: str | None = None):
        """Every rank's tensor (shapes may differ, dtypes may not), as new tensors on this rank's device."""
        self._check(tensor, "all_gather")
        return self._finish(self._all_gather(tensor, label), async_op)

    def all_gather_into(self, output: Tensor, tensor: Tensor, *, async_op: bool = False,
                        label: str | None = None):
        """Gather every rank's ``tensor`` into ``output`` (contiguous, ``world_size * tensor.numel()``
        elements, the same dtype), rank r's values at elements ``[r * n, (r + 1) * n)``.

        One collective for many parameters: flatten them into ``tensor`` (FSDP gathers a unit so).
        """
        self._check(tensor, "all_gather_into")
        self._check(output, "all_gather_into")
        if output.dtype is not tensor.dtype:
            raise TypeError(f"all_gather_into on rank {self.rank}: output is {output.dtype.name}, input is "
                            f"{tensor.dtype.name}")
        if output.numel() != self.world_size * tensor.numel():
            raise ValueError(f"all_gather_into on rank {self.rank}: output of shape {output.shape} "
                             f"({output.numel()} elements) cannot hold {self.world_size} ranks x "
                             f"{tensor.numel()} elements")
        if not output.is_contiguous():
            raise ValueError(f"all_gather_into on rank {self.rank}: output of shape {output.shape} must be "
                             "contiguous")
        return self._finish(self._all_gather_into(output, tensor, label), async_op)

    def reduce_scatter(self, tensor: Tensor, op: str = "sum", *, async_op: bool = False,
                       label: str | None = None):
        """Reduce over ranks, then return this rank's part of dim 0 (split as evenly as possible)."""
        self._check(tensor, "reduce_scatter")
        if tensor.ndim == 0:
            raise ValueError("reduce_scatter needs a tensor with at least one dimension")
        op = check_reduce_op(op, "reduce_scatter")
        return self._finish(self._reduce_scatter(tensor, op, label), async_op)

    def reduce_scatter_into(self, output: Tensor, tensor: Tensor, op: str = "sum", *, async_op: bool = False,
                            label: str | None = None):
        """Reduce ``tensor`` (``world_size * output.numel()`` elements) over ranks and write this rank's
        chunk (elements ``[rank * n, (rank + 1) * n)`` of the flattened result) into ``output``."""
        self._check(tensor, "reduce_scatter_into")
        self._check(output, "reduce_scatter_into")
        op = check_reduce_op(op, "reduce_scatter_into")
        if output.dtype is not tensor.dtype:
            raise TypeError(f"reduce_scatter_into on rank {self.rank}: output is {output.dtype.name}, input is "
                            f"{tensor.dtype.name}")
        if tensor.numel() != self.world_size * output.numel():
            raise ValueError(f"reduce_scatter_into on rank {self.rank}: input of shape {tensor.shape} "
                             f"({tensor.numel()} elements) is not {self.world_size} ranks x output of shape "
                             f"{output.shape}")
        return self._finish(self._reduce_scatter_into(output, tensor, op, label), async_op)

    def send(self, tensor: Tensor, dst: int, tag: int = 0, *, async_op: bool = False):
        """Send ``tensor`` to rank ``dst``. Completes once the message is deposited (the values were
        read in stream order at the call), without waiting for the receiver."""
        self._check(tensor, "send")
        if self._check_peer(dst, "send") == self.rank:
            raise ValueError(f"send on rank {self.rank}: a rank cannot send to itself")
        return self._finish(self._send(tensor, dst, int(tag)), async_op)

    def recv(self, tensor: Tensor | None, src: int, tag: int = 0, *, async_op: bool = False):
        """Receive the next message from rank ``src`` with ``tag`` into ``tensor`` (its shape and dtype
        must match the sender's: a mismatch raises naming both), or, with ``tensor=None``, into a new
        tensor of the sender's shape and dtype. Returns the tensor (or a Work giving it)."""
        if tensor is not None:
            self._check(tensor, "recv")
        if self._check_peer(src, "recv") == self.rank:
            raise ValueError(f"recv on rank {self.rank}: a rank cannot receive from itself")
        return self._finish(self._recv(tensor, src, int(tag)), async_op)

    def barrier(self, *, async_op: bool = False, label: str | None = None):
        """Return once every rank has arrived."""
        return self._finish(self._barrier(label), async_op)

    def split(self, ranks: Sequence[int]) -> ProcessGroup | None:
        """A sub-group of the ranks listed (in that order): every rank of this group calls it with the
        same list (ranks that disagree raise); members get their view of the sub-group, the others None.

        Sub-groups have their own collectives, independent of the parent's and of each other.
        """
        try:
            members = tuple(int(r) for r in ranks)
        except TypeError:
            raise TypeError(f"split: ranks must be a sequence of ints, got {ranks!r}") from None
        if not members or len(set(members)) != len(members) or not all(0 <= r < self.world_size for r in members):
            raise ValueError(f"split: ranks must be distinct ranks of this group of {self.world_size}, "
                             f"got {list(ranks)}")
        return self._split(members)

    # -- traffic --------------------------------------------------------------------------
    def traffic(self) -> dict[str, int]:
        """What this rank moved through the host since the last ``reset_traffic``: ``d2h_bytes``
        (device to host), ``h2d_bytes`` (host to device) and ``collectives`` (calls, p2p included)."""
        return dict(self._traffic())

    def reset_traffic(self) -> None:
        """Set this rank's ``traffic()`` counts back to zero."""
        t = self._traffic()
        for k in t:
            t[k] = 0

    def _traffic(self) -> dict[str, int]:
        counts = self.__dict__.get("_traffic_counts")
        if counts is None:
            counts = self.__dict__["_traffic_counts"] = {"d2h_bytes": 0, "h2d_bytes": 0, "collectives": 0}
        return counts

    def _count(self, d2h: int = 0, h2d: int = 0, calls: int = 0) -> None:
        """Backends call this for every transfer they make (a dict update: cheap next to a transfer)."""
        t = self._traffic()
        t["d2h_bytes"] += d2h
        t["h2d_bytes"] += h2d
        t["collectives"] += calls

    # -- conveniences ---------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
                f"device={self.device})")


def describe_meta(meta: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in meta.items())


def check_agreement(kind: str, metas: dict[int, dict[str, Any]]) -> None:
    """Raise ValueError naming the ranks and the field when the ranks' metadata differ."""
    ranks = sorted(metas)
    first = metas[ranks[0]]
    for key in first:
        values = {r: metas[r].get(key) for r in ranks}
        if len(set(map(repr, values.values()))) > 1:
            by_value: dict[str, list[int]] = {}
            for r, v in values.items():
                by_value.setdefault(repr(v), []).append(r)
            desc = "; ".join(f"rank(s) {rs}: {v}" for v, rs in by_value.items())
            raise ValueError(f"{kind}: ranks disagree on {key} ({desc})")


