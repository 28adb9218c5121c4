"""Pipeline schedules as data: per rank, the ordered list of actions it runs in one training step.

An action is the forward (F), backward (B), input-gradient backward (I) or weight-gradient backward
(W) of one micro-batch on one stage, written like PyTorch's pipelining: ``"1F0"`` is the forward of
micro-batch 0 on stage 1. Builders are pure functions (``gpipe``, ``one_f_one_b``,
``interleaved_1f1b``, ``zero_bubble``); ``Schedule.from_actions`` takes a user's lists. Every
schedule is validated before it runs, against the runtime's communication model: a rank runs its
list in order; a send never blocks; a receive blocks until the matching send ran. So a schedule is
valid when every micro-batch's forward runs before its backward and, in that model, every rank
reaches the end of its list. The same model, with a cost per kind of action, gives the bubble
fraction and the text timeline.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

KINDS = {"F": "forward", "B": "backward", "I": "input-gradient backward", "W": "weight-gradient backward"}
DEFAULT_COSTS = {"F": 1, "B": 2, "I": 1, "W": 1}


def _costs(costs: Mapping[str, float] | None) -> dict[str, float]:
    """DEFAULT_COSTS updated by ``costs``, each a finite number >= 0 of a known kind."""
    for kind, c in (costs or {}).items():
        if kind not in DEFAULT_COSTS:
            raise ValueError(f"costs: unknown action kind {kind!r}; the kinds are {', '.join(DEFAULT_COSTS)}")
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or not 0 <= c < float("inf"):
            raise ValueError(f"costs[{kind!r}] must be a finite number >= 0, got {c!r}")
    return {**DEFAULT_COSTS, **(costs or {})}
_ACTION = re.compile(r"^\s*(\d+)\s*([FBIW])\s*(\d+)\s*$")


class ScheduleError(ValueError):
    """A schedule that cannot run: a missing or repeated action, a backward before its forward, a deadlock."""


@dataclass(frozen=True)
class Action:
    """One unit of a schedule: ``kind`` ("F", "B", "I" or "W") of micro-batch ``mb`` on ``stage``."""

    stage: int
    kind: str
    mb: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(f"action kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @classmethod
    def parse(cls, spec: str | Action) -> Action:
        """``"1F0"`` -> Action(stage=1, kind="F", mb=0) (an Action is returned as is)."""
        if isinstance(spec, Action):
            return spec
        m = _ACTION.match(str(spec))
        if m is None:
            raise ScheduleError(f"cannot read action {spec!r}: write <stage><F|B|I|W><micro-batch>, e.g. '1F0'")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))

    def describe(self) -> str:
        """The action in words, e.g. its kind, micro-batch and stage."""
        return f"{self} ({KINDS[self.kind]} of micro-batch {self.mb} on stage {self.stage})"

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


@dataclass
class Timed:
    action: Action
    start: float
    end: float


class Schedule:
    """Per rank, the actions it runs in one step; stage s runs on rank ``stage_to_rank[s]``.

    Arguments:
        actions: one list per rank of Actions (or strings like "1F0").
        num_microbatches: micro-batches per step.
        stage_to_rank: the rank of each stage (default: found from where each stage's actions are).
        name: shown in the timeline and errors.
    Raises ScheduleError (naming the rank, the stage and the action) if the schedule cannot run.
    """

    def __init__(self, actions: Sequence[Iterable[Action | str]], num_microbatches: int,
                 stage_to_rank: Sequence[int] | None = None, name: str = "custom") -> None:
        self.name = name
        self.actions: list[list[Action]] = [[Action.parse(a) for a in rank] for rank in actions]
        if not self.actions:
            raise ScheduleError(f"{name}: a schedule needs at least one rank")
        if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise ScheduleError(f"{name}: num_microbatches must be a positive int, got {num_microbatches!r}")
        self.num_microbatches = num_microbatches
        self.stage_to_rank = tuple(stage_to_rank) if stage_to_rank is not None else self._find_ranks()
        self.num_stages = len(self.stage_to_rank)
        self.validate()

    @classmethod
    def from_actions(cls, actions: Sequence[Iterable[Action | str]], num_microbatches: int,
                     stage_to_rank: Sequence[int] | None = None, name: str = "custom") -> Schedule:
        """A user-written schedule, validated like the built ones (see the class)."""
        return cls(actions, num_microbatches, stage_to_rank, name)

    @property
    def num_ranks(self) -> int:
        """The number of ranks the schedule runs on."""
        return len(self.actions)

    @property
    def split_backward(self) -> bool:
        """Whether backward runs as separate input-gradient (I) and weight-gradient (W) actions."""
        return any(a.kind in "IW" for rank in self.actions for a in rank)

    def stages_of(self, rank: int) -> list[int]:
        """The stages rank ``rank`` runs, in order."""
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def rank_of(self, stage: int) -> int:
        """The rank that runs ``stage``.

        Arguments:
            stage: a stage index.
        """
        return self.stage_to_rank[stage]

    # -- validation -----------------------------------------------------------------------
    def _find_ranks(self) -> tuple[int, ...]:
        where: dict[int, int] = {}
        for r, acts in enumerate(self.actions):
            for a in acts:
                other = where.setdefault(a.stage, r)
                if other != r:
                    raise ScheduleError(f"{self.name}: stage {a.stage} has actions on rank {other} and on rank {r} "
                                        f"({a}); a stage runs on one rank")
        if not where:
            raise ScheduleError(f"{self.name}: the schedule has no actions")
        missing = [s for s in range(max(where) + 1) if s not in where]
        if missing:
            raise ScheduleError(f"{self.name}: stage(s) {missing} appear on no rank")
        return tuple(where[s] for s in range(len(where)))

    def validate(self) -> Schedule:
        """Check the schedule can run (see the module); raises ScheduleError naming the rank and action."""
        n, m = self.num_stages, self.num_microbatches
        if len(self.stage_to_rank) < 1 or any(not 0 <= r < self.num_ranks for r in self.stage_to_rank):
            raise ScheduleError(f"{self.name}: stage_to_rank {list(self.stage_to_rank)} must name ranks "
                                f"0..{self.num_ranks - 1}")
        where: dict[Action, tuple[int, int]] = {}
        for r, acts in enumerate(self.actions):
            for i, a in enumerate(acts):
                if not 0 <= a.stage < n:
                    raise ScheduleError(f"{self.name}: rank {r} lists {a} at position {i}, but the pipeline has "
                                        f"stages 0..{n - 1}")
                if not 0 <= a.mb < m:
                    raise ScheduleError(f"{self.name}: rank {r} lists {a.describe()} at position {i}, but a step "
                                        f"has micro-batches 0..{m - 1}")
                if self.stage_to_rank[a.stage] != r:
                    raise ScheduleError(f"{self.name}: rank {r} lists {a.describe()} at position {i}, but stage "
                                        f"{a.stage} runs on rank {self.stage_to_rank[a.stage]}")
                if a in where:
                    raise ScheduleError(f"{self.name}: rank {r} lists {a.describe()} twice (positions "
                                        f"{where[a][1]} and {i})")
                where[a] = (r, i)
        self._where = where
        for s in range(n):
            r = self.stage_to_rank[s]
            for mb in range(m):
                have = {k for k in KINDS if Action(s, k, mb) in where}
                if "F" not in have:
                    raise ScheduleError(f"{self.name}: rank {r} never runs {Action(s, 'F', mb).describe()}")
                if "B" in have and have & {"I", "W"}:
                    raise ScheduleError(f"{self.name}: rank {r} runs micro-batch {mb} on stage {s} both as one "
                                        "backward (B) and split (I/W); use one or the other")
                if "B" not in have and have & {"I", "W"} != {"I", "W"}:
                    need = "the backward (B, or I and W)" if not have & {"I", "W"} else (
                        "its weight-gradient half (W)" if "I" in have else "its input-gradient half (I)")
                    raise ScheduleError(f"{self.name}: rank {r} never runs {need} of micro-batch {mb} on stage {s}")
                f_pos = where[Action(s, "F", mb)][1]
                first_bw = Action(s, "B" if "B" in have else "I", mb)
                if where[first_bw][1] < f_pos:
                    raise ScheduleError(f"{self.name}: rank {r} runs {first_bw.describe()} at position "
                                        f"{where[first_bw][1]}, before its forward {Action(s, 'F', mb)} at position "
                                        f"{f_pos}")
                if "W" in have and where[Action(s, "W", mb)][1] < where[Action(s, "I", mb)][1]:
                    raise ScheduleError(f"{self.name}: rank {r} runs {Action(s, 'W', mb).describe()} before its "
                                        f"input-gradient half {Action(s, 'I', mb)}")
        for r, acts in enumerate(self.actions):
            if not acts:  # its PipelineSchedule would hold no stage and take no part in the step
                raise ScheduleError(f"{self.name}: rank {r} has no actions; every rank runs at least one stage "
                                    f"(give it a stage, or build the schedule for {self.num_ranks - 1} ranks)")
        self.simulate()  # raises on a deadlock
        return self

    def _needs(self, a: Action) -> Action | None:
        """The action on the neighbouring stage whose message ``a`` receives (None: nothing to receive)."""
        if a.kind == "F":
            return Action(a.stage - 1, "F", a.mb) if a.stage > 0 else None
        if a.kind in "BI" and a.stage < self.num_stages - 1:
            whole = Action(a.stage + 1, "B", a.mb)
            return whole if whole in self._where else Action(a.stage + 1, "I", a.mb)
        return None

    # -- the model: blocking receives, non-blocking sends -----------------------------------
    def simulate(self, costs: Mapping[str, float] | None = None) -> list[list[Timed]]:
        """Start and end of every action, per rank, with ``costs`` per kind (default F=1, B=2, I=W=1)
        and free communication. Raises ScheduleError naming each stuck rank if the schedule deadlocks."""
        cost = _costs(costs)
        end: dict[Action, float] = {}
        out: list[list[Timed]] = [[] for _ in self.actions]
        pc = [0] * self.num_ranks
        free = [0.0] * self.num_ranks
        progress = True
        while progress:
            progress = False
            for r, acts in enumerate(self.actions):
                while pc[r] < len(acts):
                    a = acts[pc[r]]
                    dep = self._needs(a)
                    if dep is not None and dep not in end:
                        break
                    start = max(free[r], end[dep] if dep is not None else 0.0)
                    free[r] = end[a] = start + cost[a.kind]
                    out[r].append(Timed(a, start, free[r]))
                    pc[r] += 1
                    progress = True
        stuck = [r for r in range(self.num_ranks) if pc[r] < len(self.actions[r])]
        if stuck:
            why = []
            for r in stuck:
                a = self.actions[r][pc[r]]
                dep = self._needs(a)
                what = "activations" if a.kind == "F" else "gradient"
                where = "itself, later in its own list" if self.stage_to_rank[dep.stage] == r else (
                    f"rank {self.stage_to_rank[dep.stage]}, not run yet")
                why.append(f"rank {r} waits at position {pc[r]}, {a.describe()}, for the {what} from {dep} ({where})")
            raise ScheduleError(f"{self.name}: the schedule deadlocks: " + "; ".join(why))
        return out

    # -- reports --------------------------------------------------------------------------
    def makespan(self, costs: Mapping[str, float] | None = None) -> float:
        """The simulated time of the whole schedule (see ``simulate``).

        Arguments:
            costs: the cost of each action kind (default F=1, B=2, I=W=1).
        """
        return max((t.end for rank in self.simulate(costs) for t in rank), default=0.0)

    def bubble_fraction(self, costs: Mapping[str, float] | None = None) -> float:
        """Share of rank-time spent idle in one step (the simulated model, default F=1, B=2, I=W=1)."""
        timed = self.simulate(costs)
        span = max(t.end for rank in timed for t in rank)
        busy = sum(t.end - t.start for rank in timed for t in rank)
        return 1.0 - busy / (self.num_ranks * span) if span > 0 else 0.0

    def peak_activations(self) -> dict[int, int]:
        """Per stage, the most micro-batches whose activations it holds at once (from a forward until
        its backward, or its weight-gradient half when backward is split)."""
        peak = dict.fromkeys(range(self.num_stages), 0)
        for acts in self.actions:
            live = dict.fromkeys(range(self.num_stages), 0)
            for a in acts:
                if a.kind == "F":
                    live[a.stage] += 1
                    peak[a.stage] = max(peak[a.stage], live[a.stage])
                elif a.kind in "BW":
                    live[a.stage] -= 1
        return peak

    def peak_activations_per_rank(self) -> list[int]:
        """Per rank, the most micro-batch-stages whose activations it holds at once (all its stages)."""
        out = []
        for acts in self.actions:
            live = best = 0
            for a in acts:
                live += 1 if a.kind == "F" else -1 if a.kind in "BW" else 0
                best = max(best, live)
            out.append(best)
        return out

    def timeline(self, costs: Mapping[str, float] | None = None) -> str:
        """One row per rank, one column per time unit (default F=1, B=2, I=W=1): which action runs, '.'
        for idle. Labels name the stage too when a rank runs several stages."""
        cost = _costs(costs)
        timed = self.simulate(cost)
        multi = self.num_stages > self.num_ranks

        def label(a: Action) -> str:
            return str(a) if multi else f"{a.kind}{a.mb}"

        unit = min(cost[a.action.kind] for rank in timed for a in rank)
        span = max(t.end for rank in timed for t in rank)
        cols = round(span / unit)
        width = max(len(label(t.action)) for rank in timed for t in rank) + 1
        head = f"{self.name}: {self.num_stages} stages on {self.num_ranks} ranks, {self.num_microbatches} " \
               f"micro-batches; " + ", ".join(f"{k}={cost[k]:g}" for k in ("F", "B", "I", "W")
                                              if any(a.kind == k for r in self.actions for a in r)) + \
               f" time units; bubble {self.bubble_fraction(cost):.1%}"
        name_w = len(f"rank {self.num_ranks - 1}") + 2
        rows = [head, "time".ljust(name_w) + "".join(str(c).ljust(width) for c in range(cols)).rstrip()]
        for r, rank in enumerate(timed):
            cells = ["."] * cols
            for t in rank:
                for c in range(round(t.start / unit), round(t.end / unit)):
                    cells[c] = label(t.action)
            rows.append(f"rank {r}".ljust(name_w) + "".join(c.ljust(width) for c in cells).rstrip())
        return "\n".join(rows)

    def __repr__(self) -> str:
        return (f"Schedule({self.name!r}, stages={self.num_stages}, ranks={self.num_ranks}, "
                f"microbatches={self.num_microbatches})")

    def __str__(self) -> str:
        return "\n".join(f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(self.actions))


def _check(num_stages: int, num_microbatches: int, what: str) -> None:
    for name, v in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScheduleError(f"{what}: {name} must be a positive int, got {v!r}")


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """Every forward, then every backward: stage s holds all micro-batches' activations at its peak.

    Arguments:
        num_stages: pipeline stages, one per rank.
        num_microbatches: micro-batches per step.
    """
    _check(num_stages, num_microbatches, "gpipe")
    m = num_microbatches
    acts = [[Action(s, "F", i) for i in range(m)] + [Action(s, "B", i) for i in range(m)]
            for s in range(num_stages)]
    return Schedule(acts, m, range(num_stages), "GPipe")


def one_f_one_b(num_stages: int, num_microbatches: int) -> Schedule:
    """1F1B: stage s runs num_stages - s - 1 warm-up forwards, then alternates one forward and one
    backward, then drains: it holds at most num_stages - s micro-batches (GPipe's bubble, less memory).

    Arguments:
        num_stages: pipeline stages, one per rank.
        num_microbatches: micro-batches per step (fewer than stages works).
    """
    _check(num_stages, num_microbatches, "one_f_one_b")
    m = num_microbatches
    acts = []
    for s in range(num_stages):
        warm = min(m, num_stages - s - 1)
        seq = [Action(s, "F", i) for i in range(warm)]
        for i in range(m - warm):
            seq += [Action(s, "F", warm + i), Action(s, "B", i)]
        seq += [Action(s, "B", i) for i in range(m - warm, m)]
        acts.append(seq)
    return Schedule(acts, m, range(num_stages), "1F1B")


def interleaved_1f1b(num_ranks: int, num_microbatches: int, stages_per_rank: int = 2) -> Schedule:
    """Interleaved 1F1B (Megatron-LM): the model is cut into num_ranks * stages_per_rank stages, stage s
    on rank s % num_ranks, so each rank runs several thinner stages and the bubble shrinks by about
    stages_per_rank. Micro-batches go in groups of num_ranks through a rank's stages in turn.

    Arguments:
        num_ranks: pipeline ranks.
        num_microbatches: micro-batches per step (any number; fewer than ranks works).
        stages_per_rank: model chunks per rank.
    """
    _check(num_ranks, num_microbatches, "interleaved_1f1b")
    if isinstance(stages_per_rank, bool) or not isinstance(stages_per_rank, int) or stages_per_rank < 1:
        raise ScheduleError(f"interleaved_1f1b: stages_per_rank must be a positive int, got {stages_per_rank!r}")
    p, m, v = num_ranks, num_microbatches, stages_per_rank
    stage_to_rank = [s % p for s in range(p * v)]
    orders = []
    for r in range(p):
        fwd, bwd = [], []
        for g0 in range(0, m, p):  # groups of p micro-batches, each through every chunk in turn
            group = range(g0, min(m, g0 + p))
            for c in range(v):
                fwd += [Action(c * p + r, "F", i) for i in group]
                bwd += [Action((v - 1 - c) * p + r, "B", i) for i in group]
        orders.append((fwd, bwd))

    def build(warmups: list[int]) -> list[list[Action]]:
        acts = []
        for (fwd, bwd), warm in zip(orders, warmups):
            seq = fwd[:warm]
            for i in range(len(fwd) - warm):
                seq += [fwd[warm + i], bwd[i]]
            acts.append(seq + bwd[len(fwd) - warm:])
        return acts

    # Megatron's warm-up; where a ragged last group leaves a rank short of work to overlap, warm up
    # further (all forwards first always runs).
    total = m * v
    warmups = [min(total, (p - r - 1) * 2 + (v - 1) * p) for r in range(p)]
    while True:
        try:
            return Schedule(build(warmups), m, stage_to_rank, f"interleaved 1F1B x{v}")
        except ScheduleError as exc:
            if "deadlocks" not in str(exc) or all(w == total for w in warmups):
                raise
            warmups = [min(total, w + 1) for w in warmups]


def zero_bubble(num_stages: int, num_microbatches: int, max_inflight: int | Sequence[int] | None = None) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): backward split into its input-gradient
    half (I, on the critical path) and its weight-gradient half (W, run where the stage would idle).

    Built by list scheduling with unit costs: at each step a stage runs an I whose gradient has
    arrived, else a forward if its memory bound allows, else a deferred W. A micro-batch counts
    against the bound from its forward until its W (the W keeps each matmul's input and output
    gradient). The default bound is 1F1B's, num_stages - s on stage s: the same peak memory as
    1F1B and a smaller bubble. ``max_inflight = [2 * num_stages - s - 1 for s in ...]`` reaches the
    paper's bubble, (p - 1) / (3m + p - 1) of the step, holding up to about twice as many.

    Arguments:
        num_stages: pipeline stages, one per rank.
        num_microbatches: micro-batches per step.
        max_inflight: micro-batches a stage may hold (one int for all, or one per stage).
    """
    _check(num_stages, num_microbatches, "zero_bubble")
    p, m = num_stages, num_microbatches
    if max_inflight is None:
        limit = [p - s for s in range(p)]
    else:
        limit = [max_inflight] * p if isinstance(max_inflight, int) else [int(x) for x in max_inflight]
        if len(limit) != p or any(x < 1 for x in limit):
            raise ScheduleError(f"zero_bubble: max_inflight must be a positive int or one per stage ({p}), got "
                                f"{max_inflight!r}")
    acts: list[list[Action]] = [[] for _ in range(p)]
    done: dict[Action, int] = {}  # action -> time step it finished
    next_f = [0] * p
    next_i = [0] * p  # I runs in micro-batch order (its gradients arrive in that order)
    waiting_w: list[list[int]] = [[] for _ in range(p)]
    live = [0] * p
    t = 0
    while sum(len(a) for a in acts) < 3 * m * p:
        finished = []
        for s in range(p):
            i = next_i[s]
            grad_in = s == p - 1 or done.get(Action(s + 1, "I", i), t) < t
            if i < next_f[s] and grad_in:
                a = Action(s, "I", i)
                next_i[s] += 1
                waiting_w[s].append(i)
            elif next_f[s] < m and live[s] < limit[s] and (s == 0 or done.get(Action(s - 1, "F", next_f[s]), t) < t):
                a = Action(s, "F", next_f[s])
                next_f[s] += 1
                live[s] += 1
            elif waiting_w[s]:
                a = Action(s, "W", waiting_w[s].pop(0))
                live[s] -= 1
            else:
                continue
            acts[s].append(a)
            finished.append(a)
        if not finished:  # cannot happen with the rules above; guards the loop
            raise ScheduleError(f"zero_bubble({p}, {m}): list scheduling stalled at step {t}")
        for a in finished:
            done[a] = t
        t += 1
    return Schedule(acts, m, range(p), "ZB-H1")


BUILDERS = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_1f1b, "zb": zero_bubble}


def build(name: str, num_ranks: int, num_microbatches: int, stages_per_rank: int = 2) -> Schedule:
    """A schedule by name: "gpipe", "1f1b", "interleaved" (``stages_per_rank`` stages per rank) or "zb"."""
    key = name.lower().replace("-", "").replace("_", "")
    key = {"zerobubble": "zb", "zbh1": "zb", "onefoneb": "1f1b", "interleaved1f1b": "interleaved"}.get(key, key)
    if key not in BUILDERS:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(BUILDERS)}")
    if key == "interleaved":
        return interleaved_1f1b(num_ranks, num_microbatches, stages_per_rank)
    return BUILDERS[key](num_ranks, num_microbatches)
