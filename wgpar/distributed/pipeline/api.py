"""PipelineSchedule: one rank's side of pipeline-parallel training (SPMD: every rank builds its own).

    stage = PipelineStage(my_part, group.rank, group.world_size, group.device)
    pipe = PipelineSchedule(stage, group, n_microbatches=8, schedule="1f1b", loss_fn=F.cross_entropy)
    loss = pipe.step(x if group.rank == 0 else None, target=y if last else None)

``step`` splits the batch along dim 0 into micro-batches (as evenly as possible; the last ones may
be a row shorter), runs this rank's actions of the schedule, and leaves in every parameter's
``.grad`` the gradient of the whole batch's mean loss: micro-batch i's loss is weighted by n_i / N.
With ``dp_group`` (stages x data parallel), each stage's gradients are then summed over the replicas
of that stage, launched as soon as the stage's last backward ran.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import creation
from ...amp.grad_scaler import MODEL_GROUP_ATTR
from ...tensor import Tensor
from ..group import ProcessGroup, Work, split_sizes
from .errors import PipelineError
from .runtime import StageRunner, TraceEntry
from .schedules import Schedule, ScheduleError, build
from .stage import PipelineStage


class PipelineSchedule:
    """Run a pipeline schedule on this rank: ``step(x, target=None, losses=None)``.

    Arguments:
        stages: this rank's stage, or its stages (interleaved schedules), each a PipelineStage on
            ``group.device``.
        group: this rank's ProcessGroup; stage s runs on rank ``schedule.rank_of(s)`` of it.
        n_microbatches: micro-batches per step.
        schedule: "gpipe", "1f1b", "interleaved" (as many stages per rank as given here), "zb"
            (ZB-H1), or a Schedule (e.g. ``Schedule.from_actions``) for n_microbatches.
        loss_fn: ``loss_fn(output, target)`` (or ``loss_fn(output)`` without targets) on the last
            stage: a scalar mean over the micro-batch.
        seed: micro-batch i's forward on stage s in step t (counted from 0) draws its random numbers
            (dropout) from ``wgpar.rng_stream([seed, t, s, i])``; default: drawn from wgpar's generator.
        dp_group: with stages replicated (2-D), this rank's group of the replicas of its stages;
            gradients are summed over it (weight each replica's share with ``step(scale=...)``;
            zero the gradients before each step, or already summed ones are summed again).
        profile: synchronise the device after every action, so that ``last_trace`` times include
            the GPU's work (for measuring the bubble; costs a wait per action).
    """

    def __init__(self, stages: PipelineStage | Sequence[PipelineStage], group: ProcessGroup, n_microbatches: int,
                 schedule: str | Schedule = "1f1b", loss_fn: Callable | None = None, seed: int | None = None,
                 dp_group: ProcessGroup | None = None, profile: bool = False) -> None:
        stages = [stages] if isinstance(stages, PipelineStage) else list(stages)
        if not stages or not all(isinstance(s, PipelineStage) for s in stages):
            raise TypeError("PipelineSchedule: stages must be one PipelineStage or a list of them")
        if isinstance(schedule, str):
            schedule = build(schedule, group.world_size, n_microbatches, stages_per_rank=len(stages))
        elif not isinstance(schedule, Schedule):
            raise TypeError(f"PipelineSchedule: schedule must be a name or a Schedule, got {type(schedule).__name__}")
        if schedule.num_microbatches != n_microbatches:
            raise ScheduleError(f"PipelineSchedule: the schedule is for {schedule.num_microbatches} micro-batches, "
                                f"not {n_microbatches}")
        if schedule.num_ranks != group.world_size:
            raise ScheduleError(f"PipelineSchedule: the schedule has {schedule.num_ranks} ranks but the group has "
                                f"{group.world_size}")
        mine = sorted(s.stage_index for s in stages)
        if mine != schedule.stages_of(group.rank):
            raise ScheduleError(f"PipelineSchedule: rank {group.rank} holds stage(s) {mine} but the schedule runs "
                                f"stage(s) {schedule.stages_of(group.rank)} on it")
        for s in stages:
            if s.num_stages != schedule.num_stages:
                raise ScheduleError(f"PipelineSchedule: stage {s.stage_index} was made for {s.num_stages} stages, "
                                    f"the schedule has {schedule.num_stages}")
            if s.device is not group.device:
                raise ValueError(f"PipelineSchedule: stage {s.stage_index} is on {s.device} but rank {group.rank} "
                                 f"owns {group.device}")
        self.stages = {s.stage_index: s for s in stages}
        self.group = group
        for s in stages:  # a GradScaler then skips on every stage when one stage saw an inf
            for p in s.parameters():
                setattr(p, MODEL_GROUP_ATTR, group)
        self.schedule = schedule
        self.n_microbatches = n_microbatches
        self.loss_fn = loss_fn
        self.seed = int(creation.generator().integers(1 << 62)) if seed is None else int(seed)
        self.dp_group = dp_group
        self.profile = profile
        self.steps = 0
        self.last_trace: list[TraceEntry] = []
        self.last_step_seconds = 0.0
        self._runner = StageRunner(schedule, self.stages, group)
        self._agreed = False

    @property
    def has_first(self) -> bool:
        """Whether this rank holds stage 0 (which takes the inputs)."""
        return 0 in self.stages

    @property
    def has_last(self) -> bool:
        """Whether this rank holds the last stage (which computes the loss)."""
        return self.schedule.num_stages - 1 in self.stages

    def parameters(self):
        """The parameters of this rank's stages, in stage order."""
        for s in sorted(self.stages):
            yield from self.stages[s].parameters()

    def _agree(self) -> None:
        """Every rank must run the same schedule: a mismatch would only show as a timeout."""
        me = zlib.crc32(f"{self.schedule}|{self.schedule.stage_to_rank}".encode()) & 0x7FFFFFFF
        got = self.group.all_gather(Tensor.from_numpy(np.array([me], np.int32), device=self.group.device),
                                    label="pipeline schedule")
        values = [int(t.numpy()[0]) for t in got]
        if len(set(values)) > 1:
            odd = [r for r, v in enumerate(values) if v != values[self.group.rank]]
            raise ScheduleError(f"PipelineSchedule: rank {self.group.rank}'s schedule differs from rank(s) {odd}'s "
                                f"(this rank runs: {self.schedule.name}, {self.n_microbatches} micro-batches)")
        self._agreed = True

    def _split(self, value: Any, what: str) -> tuple[list, list[int]]:
        n = len(value)
        if n < self.n_microbatches:
            raise PipelineError(f"PipelineSchedule.step: a batch of {n} rows ({what}) cannot make "
                                f"{self.n_microbatches} micro-batches")
        sizes = split_sizes(n, self.n_microbatches)
        bounds = np.cumsum([0, *sizes]).tolist()
        return [value[bounds[i]:bounds[i + 1]] for i in range(self.n_microbatches)], sizes

    def step(self, x: Any = None, target: Any = None, losses: list | None = None, scale: float = 1.0) -> Tensor | None:
        """One training step's forward and backward (no optimizer step): gradients accumulate into
        ``.grad`` as one backward of the batch's mean loss would (``zero_grad`` first, as usual).

        Arguments:
            x: the batch (array or tensor, dim 0 the batch); needed on the rank holding stage 0.
            target: the targets (same length); on the rank holding the last stage, if loss_fn takes them.
            losses: a list that gets each micro-batch's loss (0-d tensors, unweighted) on the last stage.
            scale: multiplies the loss (2-D: a replica's share of the global batch).
        Returns the batch's mean loss (a 0-d tensor, times ``scale``) on the rank holding the last
        stage, None elsewhere.
        """
        if not self._agreed:
            self._agree()
        inputs = targets = None
        sizes: list[int] | None = None
        if self.has_first:
            if x is None:
                raise PipelineError(f"PipelineSchedule.step on rank {self.group.rank}: this rank holds stage 0 and "
                                    "needs the batch x")
            inputs, sizes = self._split(x, "x")
        if self.has_last:
            if target is not None:
                targets, tsizes = self._split(target, "target")
                if sizes is not None and tsizes != sizes:
                    raise PipelineError(f"PipelineSchedule.step: x has {len(x)} rows but target has {len(target)}")
                sizes = tsizes
            elif sizes is None:
                raise PipelineError(f"PipelineSchedule.step on rank {self.group.rank}: this rank holds only the last "
                                    "stage and needs target to know the micro-batch sizes")
        total = sum(sizes) if sizes is not None else 0
        weights = [scale * n / total for n in sizes] if sizes is not None else []
        works: list[Work] = []

        def stage_done(s: int) -> None:
            if self.dp_group is not None:
                works.extend(self._reduce_grads(s))

        t0 = time.perf_counter()
        loss, trace = self._runner.run(inputs, targets, weights, self.loss_fn, (self.seed, self.steps), losses,
                                       self.profile, stage_done)
        for w in works:
            w.wait()
        # Every rank finishes the step before any returns: a stage that failed after its neighbours
        # had all they needed stops them here, so no rank steps its optimizer alone.
        self.group.barrier(label="pipeline step")
        self.last_step_seconds = time.perf_counter() - t0
        self.last_trace = trace
        self.steps += 1
        return loss

    def _reduce_grads(self, stage: int) -> list[Work]:
        out = []
        for i, p in enumerate(self.stages[stage].parameters()):
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = Tensor.empty(p.shape, p.dtype, p.device).zero_()
            out.append(self.dp_group.all_reduce(p.grad, "sum", async_op=True, label=f"stage{stage}.param{i}"))
        return out

    def measured_bubble(self) -> float:
        """This rank's idle share of the last step: 1 - (time in actions) / (step time). Meaningful with
        ``profile=True`` (otherwise the host runs ahead of the device)."""
        busy = sum(t.end - t.start for t in self.last_trace)
        return 1.0 - busy / self.last_step_seconds if self.last_step_seconds > 0 else 0.0

    def __repr__(self) -> str:
        return (f"PipelineSchedule(rank={self.group.rank}, stages={sorted(self.stages)}, "
                f"schedule={self.schedule.name}, microbatches={self.n_microbatches})")
