"""Learning-rate schedules with PyTorch's semantics and state_dict layout (``torch.optim.lr_scheduler``).

A scheduler rewrites ``group["lr"]`` of its optimizer's parameter groups on every ``step()`` (call it
after ``optimizer.step()``); the optimizers read ``group["lr"]`` on the host each step, so a schedule
costs no device work. The formulas, the order of operations (recursive updates, so the floats round as
torch's do) and ``state_dict()`` (every attribute but the optimizer) follow torch 2.x, so a schedule
checkpointed here resumes exactly, and a torch-trained schedule's state loads. ``LinearLR`` then
``CosineAnnealingLR`` in a ``SequentialLR`` is the warm-up + cosine of GPT training.

Also here: ``StepLR``, ``MultiStepLR``, ``ExponentialLR``, ``OneCycleLR`` (which also cycles SGD's
momentum or Adam's beta1), ``CosineAnnealingWarmRestarts``, ``ChainedScheduler`` (several schedules'
factors at once) and ``ReduceLROnPlateau`` (``step(metric)``: lowers the lr when the metric stalls).
"""

from __future__ import annotations

import math
import numbers
import types
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .optimizer import Optimizer


def _check_optimizer(optimizer) -> Optimizer:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
    return optimizer


class LRScheduler:
    """Base class: subclasses implement ``get_lr()``, the next learning rate of each parameter group.

    Arguments:
        optimizer: the optimizer whose ``group["lr"]`` values this scheduler sets.
        last_epoch: the index of the last step taken; -1 (default) starts a new schedule and records each
            group's current lr as its ``initial_lr``; a resumed schedule needs ``initial_lr`` in every group.
    """

    _get_lr_called_within_step: bool = False
    _is_initial: bool = False

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        self.optimizer = _check_optimizer(optimizer)
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming a "
                                   f"scheduler with last_epoch={last_epoch}: load the optimizer's state first")
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self) -> list[float]:
        """The learning rates of this step, one per param group; subclasses implement it (``step`` calls it),
        as in torch."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr()")

    def get_last_lr(self) -> list[float]:
        """The learning rates this scheduler set last, one per parameter group."""
        return self._last_lr

    def step(self) -> None:
        """Advance the schedule by one step and write the new learning rates into the optimizer."""
        self._step_count += 1
        self._update_lr()

    def _update_lr(self, epoch: int | None = None) -> None:
        self._get_lr_called_within_step = True
        try:
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Every attribute but the optimizer (torch's layout)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (load the optimizer's state too: the current lr lives there)."""
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """lr = initial lr * ``lr_lambda(step)``.

    Arguments:
        optimizer: the optimizer.
        lr_lambda: a function of the step index, or a list with one per parameter group.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
                 last_epoch: int = -1) -> None:
        self.optimizer = _check_optimizer(optimizer)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != len(optimizer.param_groups):
                raise ValueError(f"Expected {len(optimizer.param_groups)} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * len(optimizer.param_groups)
        super().__init__(optimizer, last_epoch)

    def state_dict(self) -> dict[str, Any]:
        """As torch: the lambdas are saved only when they are callable objects (their ``__dict__``)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the scheduler from ``state_dict()``; the lambdas themselves are not saved, only the
        attributes of callable objects among them (as in torch).

        Arguments:
            state_dict: what ``state_dict()`` returned.
        """
        state = dict(state_dict)
        lambdas = state.pop("lr_lambdas")
        self.__dict__.update(state)
        for fn, saved in zip(self.lr_lambdas, lambdas):
            if saved is not None:
                fn.__dict__.update(saved)

    def get_lr(self) -> list[float]:
        """The learning rates of this step: each group's initial lr times its lambda of ``last_epoch``."""
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs, strict=True)]


class LinearLR(LRScheduler):
    """Multiply the lr by a factor going linearly from ``start_factor`` to ``end_factor`` over
    ``total_iters`` steps (a linear warm-up with ``start_factor`` small), then keep it.

    Arguments:
        optimizer: the optimizer.
        start_factor: the factor at step 0, in (0, 1].
        end_factor: the factor from step ``total_iters`` on, in [0, 1].
        total_iters: steps of the ramp.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """The learning rates of this step, one per param group, computed from the current ones (torch's
        chainable ``get_lr``); ``step`` calls it."""
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return [g["lr"] for g in groups]
        span = self.end_factor - self.start_factor
        return [g["lr"] * (1.0 + span / (self.total_iters * self.start_factor + (self.last_epoch - 1) * span))
                for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        span = self.end_factor - self.start_factor
        return [base * (self.start_factor + span * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial lr to ``eta_min`` over ``T_max`` steps (torch's recursive form).

    Arguments:
        optimizer: the optimizer.
        T_max: steps of one half cosine.
        eta_min: the lowest lr.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """The learning rates of this step, one per param group, computed from the current ones (torch's
        chainable ``get_lr``); ``step`` calls it."""
        groups = self.optimizer.param_groups
        if self._is_initial:
            return [g["lr"] for g in groups]
        if self._step_count == 1 and self.last_epoch > 0:
            return [self.eta_min + (base - self.eta_min) * (1 + math.cos(self.last_epoch * math.pi / self.T_max)) / 2
                    for base in self.base_lrs]
        if (self.last_epoch - 1 - self.T_max) % (2 * self.T_max) == 0:
            return [g["lr"] + (base - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base, g in zip(self.base_lrs, groups, strict=True)]
        return [(1 + math.cos(math.pi * self.last_epoch / self.T_max))
                / (1 + math.cos(math.pi * (self.last_epoch - 1) / self.T_max)) * (g["lr"] - self.eta_min) + self.eta_min
                for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class _OfSchedulers(LRScheduler):
    """A scheduler made of others (``self._schedulers``): its state holds each one's ``state_dict()``."""

    _schedulers: list[LRScheduler]

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state with each child scheduler's ``state_dict()`` (the optimizer left out), as torch's."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from ``state_dict()``, the child schedulers included.

        Arguments:
            state_dict: what ``state_dict()`` returned.
        """
        state = dict(state_dict)
        nested = state.pop("_schedulers")
        self.__dict__.update(state)
        for s, saved in zip(self._schedulers, nested, strict=True):
            s.load_state_dict(saved)


class SequentialLR(_OfSchedulers):
    """Run ``schedulers`` one after another, switching at the ``milestones`` (step indices).

    Arguments:
        optimizer: the optimizer all the schedulers belong to.
        schedulers: the schedules, in order.
        milestones: ``len(schedulers) - 1`` increasing step indices where the next schedule starts.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        if len(schedulers) < 1:
            raise ValueError("SequentialLR expects at least one scheduler, but got no scheduler.")
        for i, s in enumerate(schedulers):
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(f"SequentialLR expects all schedulers to belong to the same optimizer, but the "
                                 f"scheduler {type(s).__name__} at index {i} has another one")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("Sequential Schedulers expects number of schedulers provided to be one more than the "
                             f"number of milestone points, but got number of schedulers {len(schedulers)} and the "
                             f"number of milestones to be equal to {len(milestones)}")
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # undo what the schedulers' own first steps did
            group["lr"] = group["initial_lr"]
        _undo_first_step(self._schedulers)
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = self._schedulers[idx].get_last_lr()

    def step(self) -> None:
        """Advance one step: the scheduler whose milestone range holds the new step steps (one just reached
        starts from its initial lr)."""
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()



def _undo_first_step(schedulers: Sequence[LRScheduler]) -> None:
    """Take back the step each scheduler took when it was built (nested SequentialLRs recursively, as torch)."""
    for s in schedulers:
        if hasattr(s, "_schedulers"):
            _undo_first_step(s._schedulers)
        else:
            s.last_epoch -= 1


class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` steps: lr = initial lr * gamma ** (step // step_size).

    Arguments:
        optimizer: the optimizer.
        step_size: steps between decays (>= 1).
        gamma: the factor of each decay.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if isinstance(step_size, bool) or not isinstance(step_size, numbers.Integral) or step_size < 1:
            raise ValueError(f"StepLR: step_size must be an int >= 1, got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """The learning rates of this step, one per param group, computed from the current ones (torch's
        chainable ``get_lr``); ``step`` calls it."""
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the lr by ``gamma`` at each milestone: lr = initial lr * gamma ** (milestones passed).

    Arguments:
        optimizer: the optimizer.
        milestones: step indices (a milestone given twice decays twice there).
        gamma: the factor of each decay.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As LRScheduler's; the milestones become a Counter again (a checkpoint file keeps a plain dict)."""
        super().load_state_dict(state_dict)
        self.milestones = Counter({int(k): v for k, v in self.milestones.items()})

    def get_lr(self) -> list[float]:
        """The learning rates of this step, one per param group, computed from the current ones (torch's
        chainable ``get_lr``); ``step`` calls it."""
        if self.last_epoch not in self.milestones:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma ** self.milestones[self.last_epoch] for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        milestones = sorted(self.milestones.elements())
        return [base * self.gamma ** bisect_right(milestones, self.last_epoch) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the lr by ``gamma`` every step: lr = initial lr * gamma ** step.

    Arguments:
        optimizer: the optimizer.
        gamma: the factor of each step.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """The learning rates of this step, one per param group, computed from the current ones (torch's
        chainable ``get_lr``); ``step`` calls it."""
        if self._is_initial:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from the initial lr to ``eta_min`` over ``T_i`` epochs, then a restart; the first
    cycle has ``T_0`` epochs and each next one ``T_mult`` times as many (SGDR).

    ``step()`` advances one epoch; ``step(epoch)`` sets the epoch, which may be fractional (call it with
    ``epoch + i / iters_per_epoch`` after each batch to anneal within epochs).

    Arguments:
        optimizer: the optimizer.
        T_0: epochs of the first cycle (an int >= 1).
        T_mult: growth factor of the cycles (an int >= 1).
        eta_min: the lowest lr.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        if not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"Expected float or int eta_min, but got {eta_min} of type {type(eta_min)}")
        self.T_0 = T_0
        self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """The learning rates of this step: ``eta_min + (base - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2``
        per group."""
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base in self.base_lrs]

    def step(self, epoch: float | None = None) -> None:
        """Advance one epoch, or (``epoch`` given) move to that epoch, possibly fractional."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"Expected non-negative epoch, but got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:  # the cycle n holding epoch: T_0 (T_mult**n - 1) / (T_mult - 1) <= epoch
                    n = int(math.log((epoch / self.T_0 * (self.T_mult - 1) + 1), self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        self._get_lr_called_within_step = True
        try:
            values = self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def _format_param(name: str, optimizer: Optimizer, value: Any) -> list:
    """One value per parameter group: a list of that length, or one value repeated."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{name} must have the same length as optimizer.param_groups. {name} has "
                             f"{len(value)} values, param_groups has {len(optimizer.param_groups)}.")
        return list(value)
    return [value] * len(optimizer.param_groups)


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the lr rises from ``max_lr / div_factor`` to ``max_lr`` over the first
    ``pct_start`` of ``total_steps``, then anneals to ``initial_lr / final_div_factor``; the momentum
    (SGD's ``momentum``, or beta1 of Adam's ``betas``) moves the opposite way between ``max_momentum``
    and ``base_momentum``. With ``three_phase`` the lr comes back down to ``initial_lr`` symmetrically
    before the final anneal. Call ``step()`` after every batch; stepping past ``total_steps`` raises.

    The groups get torch's keys ``initial_lr``, ``max_lr``, ``min_lr`` (and ``max_momentum``,
    ``base_momentum``), so they travel with the optimizer's state_dict.

    Arguments:
        optimizer: the optimizer.
        max_lr: the peak lr, or one per parameter group.
        total_steps: steps of the cycle; or give ``epochs`` and ``steps_per_epoch``.
        epochs: epochs of the cycle (with ``steps_per_epoch``).
        steps_per_epoch: steps per epoch (with ``epochs``).
        pct_start: the share of the cycle spent rising, a float in [0, 1].
        anneal_strategy: ``"cos"`` or ``"linear"``.
        cycle_momentum: cycle the momentum too (the optimizer needs ``momentum`` or ``betas``).
        base_momentum: the lowest momentum (at the peak lr), or one per group.
        max_momentum: the highest momentum (at the start and end), or one per group.
        div_factor: initial lr = max_lr / div_factor.
        final_div_factor: min lr = initial lr / final_div_factor.
        three_phase: rise, fall back to the initial lr, then anneal to the min lr.
        last_epoch: see LRScheduler.
    """

    def __init__(self, optimizer: Optimizer, max_lr: float | list[float], total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: float | list[float] = 0.85, max_momentum: float | list[float] = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        self.optimizer = _check_optimizer(optimizer)
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0:
                raise ValueError(f"Expected positive integer epochs, but got {epochs}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise ValueError(f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
        up = float(pct_start * self.total_steps) - 1
        if three_phase:
            self._schedule_phases = [
                dict(end_step=up, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=float(2 * pct_start * self.total_steps) - 2, start_lr="max_lr", end_lr="initial_lr",
                     start_momentum="base_momentum", end_momentum="max_momentum"),
                dict(end_step=self.total_steps - 1, start_lr="initial_lr", end_lr="min_lr",
                     start_momentum="max_momentum", end_momentum="max_momentum"),
            ]
        else:
            self._schedule_phases = [
                dict(end_step=up, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=self.total_steps - 1, start_lr="max_lr", end_lr="min_lr",
                     start_momentum="base_momentum", end_momentum="max_momentum"),
            ]
        if not isinstance(pct_start, float) or pct_start < 0 or pct_start > 1:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._anneal_func_type = anneal_strategy
        max_lrs = _format_param("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for m, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = m / div_factor
                group["max_lr"] = m
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            max_momentums = _format_param("max_momentum", optimizer, max_momentum)
            base_momentums = _format_param("base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for m, b, group in zip(max_momentums, base_momentums, optimizer.param_groups, strict=True):
                    if self.use_beta1:
                        group["betas"] = (m, *group["betas"][1:])
                    else:
                        group["momentum"] = m
                    group["max_momentum"] = m
                    group["base_momentum"] = b
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        """The learning rates of this step (one per param group); with ``cycle_momentum`` it also writes each
        group's momentum (or beta1). Raises ValueError past ``total_steps``, as torch does."""
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == len(self._schedule_phases) - 1:
                    pct = (step - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        momentum = self._anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                    break
                start = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                if self.use_beta1:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum
        return lrs


class ChainedScheduler(_OfSchedulers):
    """Step several schedulers of one optimizer together: each ``step()`` steps them all in order, so
    their multiplicative changes compound (e.g. ``ExponentialLR`` inside a ``StepLR``).

    Arguments:
        schedulers: the schedulers (not ReduceLROnPlateau, whose step needs a metric).
        optimizer: their optimizer (default: the first scheduler's).
    """

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None) -> None:
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler to be chained, but got no "
                             "scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        for i, s in enumerate(schedulers):
            if not hasattr(s, "optimizer"):
                raise TypeError(f"{type(self).__name__} at index {i} should have `optimizer` as its attribute.")
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(f"{type(self).__name__} does not support `ReduceLROnPlateau` scheduler as it "
                                 "requires additional kwargs to be specified when calling `step`, but got one at "
                                 f"index {i} in the given schedulers sequence.")
            if s.optimizer is not optimizer:
                raise ValueError(f"{type(self).__name__} expects all schedulers to belong to the same optimizer, "
                                 f"but the scheduler {type(s).__name__} at index {i} has another one")
        self._schedulers = list(schedulers)
        self.optimizer = optimizer
        self._last_lr = [g["lr"] for g in optimizer.param_groups]

    def step(self) -> None:
        """Step every chained scheduler in order; ``get_last_lr()`` then gives the groups' resulting lrs."""
        for s in self._schedulers:
            s.step()
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]



class ReduceLROnPlateau(LRScheduler):
    """Multiply the lr by ``factor`` when a metric has not improved for ``patience`` epochs.

    ``step(metric)`` after each evaluation: the metric improves on the best so far when it is lower
    (``mode="min"``) or higher (``"max"``) by more than ``threshold`` (relative: ``best * (1 -+
    threshold)``, or absolute). After ``patience`` epochs without improvement, each group's lr becomes
    ``max(lr * factor, min_lr)`` (a change smaller than ``eps`` is skipped), and ``cooldown`` epochs
    pass before bad epochs count again. A wgpar tensor as the metric costs one readback.

    Arguments:
        optimizer: the optimizer.
        mode: ``"min"`` or ``"max"``.
        factor: the factor of each reduction, < 1.
        patience: epochs without improvement that are tolerated.
        threshold: the margin an improvement must pass.
        threshold_mode: ``"rel"`` or ``"abs"``.
        cooldown: epochs after a reduction during which bad epochs are not counted.
        min_lr: the lowest lr, or one per parameter group.
        eps: the smallest change of lr that is applied.
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: list[float] | float = 0, eps: float = 1e-8) -> None:
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        self.factor = factor
        self.optimizer = _check_optimizer(optimizer)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got {len(min_lr)}")
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = [g["lr"] for g in optimizer.param_groups]
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics: Any) -> None:
        """Record one evaluation of the metric (a number, or a one-element tensor) and reduce the lr if due."""
        current = float(metrics)
        self.last_epoch += 1
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs during the cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _reduce_lr(self) -> None:
        if len(self.optimizer.param_groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(f"The number of param groups in the `optimizer` ({len(self.optimizer.param_groups)})"
                                   f" differs from when `ReduceLROnPlateau` was initialized ({len(self.min_lrs)}), "
                                   "usually due to a new param group being added to the optimizer. Please modify "
                                   "the `min_lrs` field to match the length of the `optimizer` param groups.")
            self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                group["lr"] = new

    @property
    def in_cooldown(self) -> bool:
        """True while the cooldown after a reduction lasts (no bad epochs are counted then)."""
        return self.cooldown_counter > 0

    def _is_better(self, a: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def _init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        if mode not in ("min", "max"):
            raise ValueError("mode " + mode + " is unknown!")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError("threshold mode " + threshold_mode + " is unknown!")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from ``state_dict()`` (mode and threshold comparisons rebuilt), as torch's.

        Arguments:
            state_dict: what ``state_dict()`` returned.
        """
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


__all__ = ["LRScheduler", "LambdaLR", "LinearLR", "CosineAnnealingLR", "SequentialLR", "StepLR", "MultiStepLR",
           "ExponentialLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "ChainedScheduler", "ReduceLROnPlateau"]
