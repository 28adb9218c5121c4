"""Running one rank's part of a pipeline schedule for one step, on that rank's ProcessGroup only.

Each micro-batch's forward on a stage records into its own tape; its backward later runs from the
kept output with the gradient the next stage sent (``backward_with_grad``, or ``backward_input`` and
then the deferred weight half for I/W schedules), and the micro-batch's graph and activations are
released right after. Activations and their gradients go to the neighbouring stages with
``group.send(async_op=True)`` as soon as they exist.

Receives are posted ahead, asynchronously, but never past an action that sends: a backend may
complete a rank's transfers in the order they were posted, so a receive posted before a send could
hold that send back. Posted this way, transfers complete in the order of the rank's action list,
the model the schedule was validated against (sends do not block, receives do), so a valid
schedule cannot deadlock on any backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import memory as _memory
from ... import ops
from ...autograd.engine import DeferredGrad, backward_input, backward_with_grad
from ...autograd.graph import Tape, current_tape, install_tape, take_tape
from ...creation import rng_stream
from ...runtime import memory_history as _hist
from ...runtime import profiling
from ...tensor import Tensor
from ..errors import CollectiveError
from ..group import ProcessGroup, Work
from .errors import PipelineAbortedError, PipelineError, PipelineShapeError, PipelineStageError
from .schedules import Action, Schedule
from .stage import PipelineStage


@dataclass
class TraceEntry:
    """One action as it ran: host times (seconds from the step's start; with ``profile`` the device
    finished the action's work before ``end``); then: the micro-batches this rank held, its receives
    posted ahead (each may already hold its tensor), its device's allocated bytes."""

    action: Action
    start: float
    end: float
    live: int
    receives_posted: int
    allocated_bytes: int


class _Micro:
    """What a stage keeps of one micro-batch between its forward and its backward."""

    __slots__ = ("x", "out", "tape", "deferred")

    def __init__(self, x: Tensor | None, out: Tensor, tape: Tape) -> None:
        self.x = x
        self.out = out
        self.tape = tape
        self.deferred: DeferredGrad | None = None

    def release(self) -> None:
        if self.deferred is not None:
            self.deferred.release()
        self.tape.release()
        self.x = self.out = self.deferred = None


class StageRunner:
    """Runs rank ``group.rank``'s actions of ``schedule`` over its ``stages`` (stage index -> stage)."""

    def __init__(self, schedule: Schedule, stages: dict[int, PipelineStage], group: ProcessGroup) -> None:
        self.schedule = schedule
        self.stages = stages
        self.group = group
        self.rank = group.rank
        self.actions = schedule.actions[self.rank]
        self.last = schedule.num_stages - 1
        self.current: Action | None = None  # the action running now and since when (read by PipelineExecutor)
        self.current_since = 0.0
        self.cancelled: str | None = None  # set while a step this rank never finished is still running
        # _horizon[i]: the first action at or after i that sends (receives are posted up to it).
        n = len(self.actions)
        self._horizon = [n - 1] * (n + 1)
        for i in range(n - 1, -1, -1):
            self._horizon[i] = i if self._sends(self.actions[i]) else self._horizon[i + 1]

    # -- who talks to whom ---------------------------------------------------------------
    def _tag(self, boundary: int, mb: int, grad: bool) -> int:
        """One tag per message of a step (boundary b lies between stages b and b + 1)."""
        return 2 * (mb * self.schedule.num_stages + boundary) + int(grad)

    def _peer(self, stage: int) -> int | None:
        """The rank of ``stage``, or None when it is this rank (a local hand-over, no transfer)."""
        r = self.schedule.rank_of(stage)
        return None if r == self.rank else r

    def _source(self, a: Action) -> tuple[int, int] | None:
        """(rank, tag) that ``a`` receives from, if it receives over the group."""
        if a.kind == "F" and a.stage > 0:
            peer = self._peer(a.stage - 1)
            return None if peer is None else (peer, self._tag(a.stage - 1, a.mb, False))
        if a.kind in "BI" and a.stage < self.last:
            peer = self._peer(a.stage + 1)
            return None if peer is None else (peer, self._tag(a.stage, a.mb, True))
        return None

    def _sends(self, a: Action) -> bool:
        if a.kind == "F":
            return a.stage < self.last and self._peer(a.stage + 1) is not None
        if a.kind in "BI":
            return a.stage > 0 and self._peer(a.stage - 1) is not None
        return False

    # -- one step -------------------------------------------------------------------------
    def run(self, inputs: Sequence | None, targets: Sequence | None, weights: Sequence[float],
            loss_fn: Callable | None, rng_key: Sequence[int], losses: list | None, profile: bool,
            on_stage_done: Callable[[int], None] | None = None) -> tuple[Tensor | None, list[TraceEntry]]:
        """Run this rank's actions once. Returns the weighted sum of the last stage's micro-batch losses
        (the batch's mean loss; None on ranks without the last stage) and the trace."""
        step = _Step(self, inputs, targets, weights, loss_fn, rng_key, losses, profile)
        remaining = {s: sum(1 for a in self.actions if a.stage == s and a.kind in "BW") for s in self.stages}
        saved_tape = current_tape()
        t0 = time.perf_counter()
        current: Action | None = None
        self.cancelled = None
        try:
            step.post_receives(0)
            for i, a in enumerate(self.actions):
                self.check_live()
                current = self.current = a
                self.current_since = time.perf_counter()
                # Each action in its own call: its temporaries die with it, so the memory a step holds
                # between actions is the micro-batches in flight and nothing else.
                start = step.run(i, a) - t0
                if a.kind in "BW":
                    remaining[a.stage] -= 1
                    if remaining[a.stage] == 0 and on_stage_done is not None:
                        on_stage_done(a.stage)  # every gradient of this stage is final
                step.trace.append(TraceEntry(a, start, time.perf_counter() - t0, len(step.state), len(step.recvs),
                                             _memory.memory_stats(self.group.device)["allocated_bytes"]))
                step.post_receives(i + 1)
            current = None
            for w in step.sends:
                w.wait()
            total = None
            for loss in step.totals:
                total = loss if total is None else ops.binary("add", total, loss)
            return total, step.trace
        except Exception as exc:
            raise self._fail(exc, current) from exc
        finally:
            self.current = None
            step.close()
            if current_tape() is not saved_tape:
                take_tape()
                if saved_tape is not None:
                    install_tape(saved_tape)

    def check_live(self) -> None:
        """Raise if this step was given up on (its rank was reported stuck): the group may have been reset
        for new steps since, so a late step must neither communicate nor touch gradients again."""
        if self.cancelled is not None:
            raise PipelineAbortedError(self.cancelled)

    def _forward(self, stage: PipelineStage, a: Action, x, targets, weights, loss_fn, rng_key, losses) -> _Micro:
        if a.stage == 0:
            x = _to_device(x, stage.device)
        else:
            if not x.dtype.is_float:
                raise PipelineShapeError(f"stage {a.stage} received {x.dtype.name} activations for micro-batch "
                                         f"{a.mb}; activations between stages must be float tensors")
            stage.check_input(x, a.mb)
            x.requires_grad_(True)  # a leaf: its .grad is what goes back to the previous stage
            x._storage.tag(_hist.PIPELINE_ACTIVATION)  # kept until this micro-batch's backward
        tape = install_tape()
        try:
            # What the micro-batch's forward allocates (what its tape keeps, its output) lives until its
            # backward: on the memory timeline, activations in flight.
            with rng_stream([*rng_key, a.stage, a.mb]), _hist.category(_hist.PIPELINE_ACTIVATION):
                out = stage.module(x)
            if not isinstance(out, Tensor):
                raise PipelineError(f"stage {a.stage} returned a {type(out).__name__} for micro-batch {a.mb}; a "
                                    "stage must return one tensor")
            if a.stage == self.last:
                with _hist.category(_hist.PIPELINE_ACTIVATION):
                    out = self._loss(a, out, targets, weights, loss_fn, losses)
        finally:
            take_tape()
        return _Micro(x if a.stage > 0 else None, out, tape)

    def _loss(self, a: Action, out: Tensor, targets, weights, loss_fn, losses) -> Tensor:
        if loss_fn is None:
            raise PipelineError("the last stage needs a loss_fn to train")
        target = targets[a.mb] if targets is not None else None
        if target is not None and hasattr(target, "shape") and len(target.shape) and out.ndim and \
                target.shape[0] != out.shape[0]:
            raise PipelineShapeError(f"stage {a.stage}: micro-batch {a.mb} has {out.shape[0]} rows but its target "
                                     f"has {target.shape[0]}; the input and the target must have the same length")
        target = _to_device(target, out.device)
        loss = loss_fn(out) if target is None else loss_fn(out, target)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise PipelineError(f"loss_fn must return a scalar tensor, got "
                                f"{getattr(loss, 'shape', type(loss).__name__)} for micro-batch {a.mb}")
        if losses is not None:
            losses.append(loss.detach())
        # Mean semantics: micro-batch i's mean loss weighs n_i / N, so the sum is the batch's mean loss.
        return loss * weights[a.mb]

    def _backward(self, stage: PipelineStage, a: Action, rec: _Micro, grad: Tensor | None) -> Tensor | None:
        out = rec.out
        if grad is not None and (grad.shape != out.shape or grad.dtype is not out.dtype):
            raise PipelineShapeError(f"stage {a.stage} produced {out.dtype.name} {out.shape} for micro-batch "
                                     f"{a.mb} but stage {a.stage + 1} sent back a gradient of {grad.dtype.name} "
                                     f"{grad.shape}")
        wants_input = rec.x is not None
        if out.requires_grad:
            if a.kind == "B":
                if grad is None:
                    out.backward()
                else:
                    backward_with_grad(out, grad)
            else:
                rec.deferred = backward_input(out, grad, [rec.x] if wants_input else [])
        if not wants_input:
            return None
        g_in = rec.x.grad
        if g_in is None:  # the output does not depend on the input
            g_in = ops.fill(rec.x.shape, 0.0, rec.x.dtype, rec.x.device)
        rec.x = rec.out = None  # the graph (kept by its nodes, the tape, a deferred W) holds what is left
        return g_in

    def _fail(self, exc: Exception, a: Action | None) -> Exception:
        where = f"stage {a.stage} on rank {self.rank}, {a.describe()}" if a is not None else (
            f"rank {self.rank} (stages {sorted(self.stages)}) after its last action")
        if isinstance(exc, CollectiveError):
            return PipelineAbortedError(f"{where}: stopped: {exc}")
        msg = f"{where}: {type(exc).__name__}: {exc}"
        try:
            self.group.abort(msg)  # the other stages stop now instead of at their timeout
        except Exception:  # noqa: BLE001  (the original error matters more)
            pass
        if isinstance(exc, PipelineShapeError):
            return PipelineShapeError(msg)
        return PipelineStageError(msg)


class _Step:
    """One step's state on one rank: micro-batches in flight, posted receives, sends in flight."""

    def __init__(self, runner: StageRunner, inputs, targets, weights, loss_fn, rng_key, losses, sync: bool) -> None:
        self.runner = runner
        self.sync = sync  # wait for the device after each action (``profile``)
        self.inputs, self.targets, self.weights = inputs, targets, weights
        self.loss_fn, self.rng_key, self.losses = loss_fn, rng_key, losses
        self.state: dict[tuple[int, int], _Micro] = {}
        self.local: dict[tuple[str, int, int], Tensor] = {}  # hand-overs between stages of this rank
        self.recvs: dict[int, Work] = {}
        self.sends: list[Work] = []
        self.totals: list[Tensor] = []
        self.trace: list[TraceEntry] = []
        self.posted = 0

    def post_receives(self, nxt: int) -> None:
        """Post the receives of the actions from ``nxt`` up to the first one that sends, inclusive."""
        r = self.runner
        r.check_live()
        while self.posted <= r._horizon[nxt]:
            src = r._source(r.actions[self.posted])
            if src is not None:
                self.recvs[self.posted] = r.group.recv(None, src[0], src[1], async_op=True)
            self.posted += 1

    def _received(self, i: int, a: Action) -> Tensor:
        self.runner.check_live()
        if i in self.recvs:
            return self.recvs.pop(i).wait()
        return self.local.pop(("act" if a.kind == "F" else "grad", a.stage, a.mb))

    def _send(self, t: Tensor, to_stage: int, mb: int, grad: bool) -> None:
        r = self.runner
        r.check_live()
        peer = r._peer(to_stage)
        if peer is None:
            self.local[("grad" if grad else "act", to_stage, mb)] = t
        else:
            boundary = to_stage if grad else to_stage - 1
            self.sends.append(r.group.send(t, peer, r._tag(boundary, mb, grad), async_op=True))

    def run(self, i: int, a: Action) -> float:
        """Run action ``i``; returns when its work started (after its input arrived), perf_counter time."""
        r = self.runner
        stage = r.stages[a.stage]
        key = (a.stage, a.mb)
        if a.kind == "F":
            x = self.inputs[a.mb] if a.stage == 0 else self._received(i, a)
        elif a.kind in "BI":
            grad = None if a.stage == r.last else self._received(i, a)
        start = time.perf_counter()
        # Under a profile, the action as it ran, named as in the schedule, from its input's arrival (a wait
        # for it is idle time, as in the schedule's model) to the end of its work (of the device's too with
        # ``sync``): pipeline/timeline.py draws these against the schedule.
        with profiling.span(str(a), "pipeline", rank=r.rank, stage=a.stage, mb=a.mb, kind=a.kind):
            if a.kind == "F":
                rec = self.state[key] = r._forward(stage, a, x, self.targets, self.weights, self.loss_fn,
                                                   self.rng_key, self.losses)
                if a.stage == r.last:
                    self.totals.append(rec.out.detach())
                else:
                    self._send(rec.out.detach(), a.stage + 1, a.mb, grad=False)
            elif a.kind in "BI":
                g_in = r._backward(stage, a, self.state[key], grad)
                if a.stage > 0:
                    self._send(g_in, a.stage - 1, a.mb, grad=True)
                if a.kind == "B":
                    self.state.pop(key).release()
            else:  # W
                rec = self.state.pop(key)
                if rec.deferred is not None:
                    rec.deferred.run()
                rec.release()
            if self.sync:
                _memory.synchronize(r.group.device)
        return start

    def close(self) -> None:
        for rec in self.state.values():
            rec.release()
        self.state.clear()
        self.recvs.clear()
        self.local.clear()


def _to_device(value: Any, device) -> Any:
    if isinstance(value, Tensor):
        return value if value.device is device else ops.to_device(value, device)
    if isinstance(value, np.ndarray):
        return Tensor.from_numpy(value, device=device)
    return value
