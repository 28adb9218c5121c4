"""PipelineExecutor (rumus's name): the single-controller pipeline over a MultiAdapterContext.

The driver thread holds the model; the executor cuts it into stages, puts stage s on the device of
the rank the schedule gives it, and each ``step`` hands every rank's PipelineSchedule to that
rank's persistent thread (``MultiAdapterContext.run``), which is what ``run_spmd`` would run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...nn.module import Module
from ...tensor import Tensor
from ..context import MultiAdapterContext
from .api import PipelineSchedule
from .schedules import Schedule, build
from .stage import PipelineStage, split_module


class PipelineExecutor:
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
    """

    def __init__(self, model: Module | Sequence[Module], context: MultiAdapterContext, n_microbatches: int,
                 schedule: str | Schedule = "1f1b", loss_fn: Callable | None = None,
                 boundaries: Sequence[int] | None = None, stages_per_rank: int = 2, seed: int | None = None,
                 profile: bool = False) -> None:
        p = context.world_size
        if isinstance(schedule, str):
            schedule = build(schedule, p, n_microbatches, stages_per_rank)
        self.context = context
        self.schedule = schedule
        parts = split_module(model, schedule.num_stages, boundaries)
        self.stages = [PipelineStage(m, s, schedule.num_stages, context.devices[schedule.rank_of(s)])
                       for s, m in enumerate(parts)]
        by_rank = [[st for st in self.stages if schedule.rank_of(st.stage_index) == r] for r in range(p)]
        self.ranks: list[PipelineSchedule] = [
            PipelineSchedule(by_rank[r], context.comm(r), n_microbatches, schedule, loss_fn, seed=seed,
                             profile=profile)
            for r in range(p)]
        self._last_rank = schedule.rank_of(schedule.num_stages - 1)

    @property
    def modules(self) -> list[Module]:
        """Each stage's module, in stage order."""
        return [s.module for s in self.stages]

    def parameters(self):
        for s in self.stages:
            yield from s.parameters()

    def optimizers(self, factory: Callable) -> list:
        """One optimizer per rank over its stages' parameters: ``factory(parameters)``."""
        return [factory(list(r.parameters())) for r in self.ranks]

    def zero_grad(self) -> None:
        for m in self.modules:
            m.zero_grad()

    def train(self, mode: bool = True) -> PipelineExecutor:
        for m in self.modules:
            m.train(mode)
        return self

    def step(self, x: Any, target: Any = None, losses: list | None = None) -> Tensor:
        """Forward and backward of one batch through the pipeline; returns the batch's mean loss (0-d,
        on the last stage's device). Gradients accumulate in the stages' parameters."""
        def work(r: int):
            pipe = self.ranks[r]
            return pipe.step(x if pipe.has_first else None, target if pipe.has_last else None,
                             losses if pipe.has_last else None)

        return self.context.run(work)[self._last_rank]

    def train_step(self, x: Any, target: Any, optimizers: Sequence) -> Tensor:
        """zero_grad, step, then every rank's optimizer step, each on its rank's thread; returns the loss."""
        if len(optimizers) != len(self.ranks):
            raise ValueError(f"train_step: needs one optimizer per rank ({len(self.ranks)}), got {len(optimizers)}")

        def work(r: int):
            pipe, opt = self.ranks[r], optimizers[r]
            opt.zero_grad()
            loss = pipe.step(x if pipe.has_first else None, target if pipe.has_last else None)
            opt.step()
            return loss

        return self.context.run(work)[self._last_rank]

    def last_traces(self) -> list:
        return [r.last_trace for r in self.ranks]

    def measured_bubble(self) -> float:
        """Idle share of the last step over all ranks (use ``profile=True``)."""
        total = max(r.last_step_seconds for r in self.ranks)
        busy = sum(t.end - t.start for r in self.ranks for t in r.last_trace)
        return 1.0 - busy / (len(self.ranks) * total) if total > 0 else 0.0

    def __repr__(self) -> str:
        return (f"PipelineExecutor({self.schedule.name}, stages={len(self.stages)}, ranks={len(self.ranks)}, "
                f"microbatches={self.schedule.num_microbatches})")
