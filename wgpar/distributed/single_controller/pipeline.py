"""PipelineExecutor (rumus's name): the single-controller pipeline over a MultiAdapterContext.

The driver thread holds the model; the executor cuts it into stages, puts stage s on the device of
the rank the schedule gives it, and each ``step`` hands every rank's PipelineSchedule to that
rank's persistent thread (``MultiAdapterContext.run``), which is what ``run_spmd`` would run.

A stage that never returns holds its rank's thread: work handed to that thread later would only queue
behind it. The executor keeps track of which ranks are inside a step, reports a rank still there when
a step gives up (naming its stage and action), refuses new steps at once while it stays there, and
makes the late step stop before it communicates again once it does return (the group may have been
reset for new steps by then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ... import ops
from ...autograd.autocast_mode import autocast as _autocast
from ...autograd.grad_mode import no_grad
from ...nn.module import Module
from ...nn.utils import clip_grad_norm_
from ...tensor import Tensor
from ..errors import RankError
from ..pipeline.api import PipelineSchedule
from ..pipeline.errors import PipelineError
from ..pipeline.schedules import Schedule, ScheduleError, build
from ..pipeline.stage import PipelineStage, split_module
from .context import MultiAdapterContext
from .driver import Driver, batch_sizes, split_batch


class PipelineExecutor(Driver):
    """Train ``model`` (an nn.Sequential or a list of blocks) as a pipeline over ``context``'s ranks.

    Arguments:
        model: the blocks, applied in order; they are moved to their stages' devices.
        context: a MultiAdapterContext; one rank per pipeline rank.
        n_microbatches: micro-batches per step.
        schedule: "gpipe", "1f1b", "interleaved", "zb" or a Schedule.
        loss_fn: ``loss_fn(output, target)`` on the last stage (a scalar mean).
        boundaries: where stages start (block indices), instead of balancing by parameter count.
        stages_per_rank: stages per rank for "interleaved" (default 2).
        seed, profile: as for PipelineSchedule.
        step_timeout: seconds a step may run before the ranks that have not returned are reported stuck
            (default: the context's, twice its collective timeout plus a minute for GPU work).
        copies: parameters that copy another rank's (a tied weight's second copy, untied so that each
            stage holds its own, whose gradients ``after_backward`` sums): clipping counts them once.
    """

    def __init__(self, model: Module | Sequence[Module], context: MultiAdapterContext, n_microbatches: int,
                 schedule: str | Schedule = "1f1b", loss_fn: Callable | None = None,
                 boundaries: Sequence[int] | None = None, stages_per_rank: int = 2, seed: int | None = None,
                 profile: bool = False, step_timeout: float | None = None, copies: Sequence[Tensor] = ()) -> None:
        p = context.world_size
        if isinstance(schedule, str):
            schedule = build(schedule, p, n_microbatches, stages_per_rank)
        elif not isinstance(schedule, Schedule):
            raise TypeError(f"PipelineExecutor: schedule must be a name or a Schedule, got {type(schedule).__name__}")
        if schedule.num_ranks != p:
            raise ScheduleError(f"PipelineExecutor: the schedule {schedule.name!r} is for {schedule.num_ranks} ranks "
                                f"but the context has {p}; build it for {p} ranks (or use a context of "
                                f"{schedule.num_ranks})")
        if step_timeout is not None and not (isinstance(step_timeout, (int, float)) and step_timeout > 0):
            raise ValueError(f"PipelineExecutor: step_timeout must be a positive number of seconds, got "
                             f"{step_timeout!r}")
        super().__init__(context)
        self.schedule = schedule
        self.step_timeout = step_timeout
        self._busy: dict[int, float] = {}  # rank -> when its current step began
        self._busy_lock = threading.Lock()
        parts = split_module(model, schedule.num_stages, boundaries)
        _refuse_shared_across_ranks(parts, schedule)
        self.stages = [PipelineStage(m, s, schedule.num_stages, context.devices[schedule.rank_of(s)])
                       for s, m in enumerate(parts)]
        by_rank = [[st for st in self.stages if schedule.rank_of(st.stage_index) == r] for r in range(p)]
        self.ranks: list[PipelineSchedule] = [
            PipelineSchedule(by_rank[r], context.comm(r), n_microbatches, schedule, loss_fn, seed=seed,
                             profile=profile)
            for r in range(p)]
        self._last_rank = schedule.rank_of(schedule.num_stages - 1)
        self._copies = {id(p) for p in copies}

    @property
    def modules(self) -> list[Module]:
        """Each stage's module, in stage order."""
        return [s.module for s in self.stages]

    def parameters(self):
        """The parameters of every stage, in stage order."""
        for s in self.stages:
            yield from s.parameters()

    def _parameters(self, rank: int):
        return list(self.ranks[rank].parameters())

    def step(self, x: Any, target: Any = None, losses: list | None = None) -> Tensor:
        """Forward and backward of one batch through the pipeline; returns the batch's mean loss (0-d,
        on the last stage's device). Gradients accumulate in the stages' parameters."""
        def work(r: int):
            pipe = self.ranks[r]
            return pipe.step(x if pipe.has_first else None, target if pipe.has_last else None,
                             losses if pipe.has_last else None)

        return self._run(work)[self._last_rank]

    def train_step(self, x: Any, target: Any, optimizers: Sequence, *, accumulate: int = 1, scaler=None,
                   autocast: bool = False, max_norm: float | None = None,
                   after_backward: Callable[[int], None] | None = None) -> Tensor:
        """zero_grad, ``step`` per micro-batch, then every rank's optimizer step, each on its rank's thread;
        returns the batch's mean loss. The keywords are ``Driver.train_step``'s (the loss is ``loss_fn``)."""
        return self._train_step(x, target, None, optimizers, accumulate=accumulate, scaler=scaler,
                                autocast=autocast, max_norm=max_norm, after_backward=after_backward)

    def _micro_batches(self, x, y, accumulate: int) -> list[list[tuple]]:
        sizes = batch_sizes(x, accumulate, "PipelineExecutor.train_step")
        xs = split_batch(x, sizes, "PipelineExecutor.train_step: x")
        ys = split_batch(y, sizes, "PipelineExecutor.train_step: target")
        return [[(xi, yi, n / sum(sizes)) for xi, yi, n in zip(xs, ys, sizes)]] * self.world_size

    def _accumulate(self, rank: int, micro: list[tuple], loss_fn, scale: float, amp: bool):
        pipe, total = self.ranks[rank], None
        for xi, yi, weight in micro:  # the loss scale rides on the pipeline's weights: it runs its own backward
            with _autocast(enabled=amp):
                loss = pipe.step(xi if pipe.has_first else None, yi if pipe.has_last else None, scale=scale * weight)
            if loss is not None:
                with no_grad():
                    total = loss if total is None else ops.binary("add", total, loss)
        if total is None or scale == 1.0:
            return total
        with no_grad():
            return ops.binary("mul", total, 1.0 / scale)  # a power of two (GradScaler's): exact

    def _result(self, per_rank: list) -> Tensor:
        return per_rank[self._last_rank]

    def _clip(self, rank: int, max_norm: float) -> None:
        params = self._parameters(rank)
        clip_grad_norm_(params, max_norm, group=self.context.comm(rank),
                        replicated=[p for p in params if id(p) in self._copies])

    @property
    def stuck(self) -> dict[int, str]:
        """The ranks still inside a step that already failed, each with where it is (empty normally)."""
        with self._busy_lock:
            return {r: self._where(r) for r in self._busy}

    def _where(self, r: int) -> str:
        runner = self.ranks[r]._runner
        a = runner.current
        stages = sorted(self.ranks[r].stages)
        who = f"rank {r} (stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))})"
        if a is None:
            return f"{who}, outside its actions"
        return f"{who} in {a.describe()} for {time.perf_counter() - runner.current_since:.1f} s"

    def _run(self, work: Callable, *per_rank) -> list:
        stuck = self.stuck
        if stuck:
            raise PipelineError("PipelineExecutor: " + "; ".join(
                w.replace(" in ", " is still running ", 1) for w in stuck.values()) +
                ", from an earlier step that failed; its thread has not returned, so no step can run on this "
                "context until it does (then call context.reset()), or close the context")

        def tracked(r: int, *args):
            with self._busy_lock:
                self._busy[r] = time.perf_counter()
            try:
                return work(r, *args)
            finally:
                with self._busy_lock:
                    del self._busy[r]

        try:
            return self.context.run(tracked, *per_rank, timeout=self.step_timeout)
        except RankError as exc:
            stuck = self.stuck
            if not stuck:
                raise
            for r, where in stuck.items():  # when it returns, it must not talk to a group reset since
                self.ranks[r]._runner.cancelled = f"{where}: the step was given up on"
            raise PipelineError("PipelineExecutor: " + "; ".join(f"{w} and has not returned" for w in stuck.values())
                                + " (a stage that never returns); the other ranks stopped. The context "
                                "cannot run steps until it returns") from exc

    def last_traces(self) -> list:
        """Each rank's trace of its last step (its actions with start and end times), in rank order."""
        return [r.last_trace for r in self.ranks]

    def measured_bubble(self) -> float:
        """Idle share of the last step over all ranks (use ``profile=True``)."""
        total = max(r.last_step_seconds for r in self.ranks)
        busy = sum(t.end - t.start for r in self.ranks for t in r.last_trace)
        return 1.0 - busy / (len(self.ranks) * total) if total > 0 else 0.0

    def __repr__(self) -> str:
        return (f"PipelineExecutor({self.schedule.name}, stages={len(self.stages)}, ranks={len(self.ranks)}, "
                f"microbatches={self.schedule.num_microbatches})")


def _refuse_shared_across_ranks(parts: list[Module], schedule: Schedule) -> None:
    """A parameter used by stages on two ranks cannot live on both devices (a GPT's tied embedding and
    output layer): name it and say how to split it, instead of failing inside an op at the first step."""
    seen: dict[int, tuple[int, str]] = {}
    for s, part in enumerate(parts):
        for name, p in part.named_parameters():
            first = seen.setdefault(id(p), (s, name))
            if schedule.rank_of(first[0]) != schedule.rank_of(s):
                raise ValueError(
                    f"PipelineExecutor: stage {first[0]}'s {first[1]!r} (rank {schedule.rank_of(first[0])}) and "
                    f"stage {s}'s {name!r} (rank {schedule.rank_of(s)}) are one parameter (tied weights), which "
                    "cannot be on two devices: give the later stage its own copy (for a GPT: "
                    "wgpar.models.gpt.untie(blocks[-1])) and sum the two copies' gradients after each step "
                    "(step(), then add them, then the optimizers; examples/train_gpt.py --parallel pipeline), or "
                    "put both stages on one rank (boundaries= / a Schedule)")
