"""Loss modules, as torch.nn's: each holds its options (and class weights as buffers, so torch state dicts
load) and calls its ``functional`` form, whose docstring says what differs from torch."""

from __future__ import annotations

from ..tensor import Tensor
from . import functional as F
from .module import Module


class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__()
        F._loss_args(type(self).__name__, "mean" if reduction == "batchmean" else reduction, size_average, reduce)
        self.reduction = reduction


class _WeightedLoss(_Loss):
    def __init__(self, weight: Tensor | None = None, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    """Softmax cross entropy, as ``torch.nn.CrossEntropyLoss`` (see ``functional.cross_entropy``).

    Arguments:
        weight: a [C] float tensor scaling each class (a buffer), or None.
        ignore_index: class-index targets equal to it contribute nothing (default -100).
        reduction: "mean", "sum" or "none".
        label_smoothing: in [0, 1], the weight of the uniform distribution mixed into the target.
    """

    def __init__(self, weight: Tensor | None = None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input: Tensor, target) -> Tensor:
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing)


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of log-probabilities at class targets, as ``torch.nn.NLLLoss`` (see
    ``functional.nll_loss``).

    Arguments:
        weight: a [C] float tensor scaling each class (a buffer), or None.
        ignore_index: targets equal to it contribute nothing (default -100).
        reduction: "mean", "sum" or "none".
    """

    def __init__(self, weight: Tensor | None = None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean") -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target) -> Tensor:
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class BCELoss(_WeightedLoss):
    """Binary cross entropy of probabilities, as ``torch.nn.BCELoss`` (see ``functional.binary_cross_entropy``).

    Arguments:
        weight: scales each entry (broadcast to the input; a buffer), or None.
        reduction: "mean", "sum" or "none".
    """

    def forward(self, input: Tensor, target) -> Tensor:
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross entropy of logits, computed stably, as ``torch.nn.BCEWithLogitsLoss`` (see
    ``functional.binary_cross_entropy_with_logits``).

    Arguments:
        weight: scales each entry (broadcast to the input; a buffer), or None.
        reduction: "mean", "sum" or "none".
        pos_weight: scales the positive term, one per class along the last dim (a buffer), or None.
    """

    def __init__(self, weight: Tensor | None = None, size_average=None, reduce=None, reduction: str = "mean",
                 pos_weight: Tensor | None = None) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target) -> Tensor:
        return F.binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)


class L1Loss(_Loss):
    """Mean (or summed) absolute error, as ``torch.nn.L1Loss``.

    Arguments:
        reduction: "mean", "sum" or "none".
    """

    def forward(self, input: Tensor, target) -> Tensor:
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """Quadratic below ``beta``, linear above, as ``torch.nn.SmoothL1Loss`` (see ``functional.smooth_l1_loss``).

    Arguments:
        reduction: "mean", "sum" or "none".
        beta: where the loss turns linear (0: L1).
    """

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target) -> Tensor:
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Quadratic below ``delta``, ``delta``-sloped above, as ``torch.nn.HuberLoss`` (see ``functional.huber_loss``).

    Arguments:
        reduction: "mean", "sum" or "none".
        delta: where the loss turns linear.
    """

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target) -> Tensor:
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class KLDivLoss(_Loss):
    """KL divergence of a target distribution from log-probabilities, as ``torch.nn.KLDivLoss`` (see
    ``functional.kl_div``).

    Arguments:
        reduction: "mean" (warns, as torch), "batchmean", "sum" or "none".
        log_target: the target is given as log-probabilities.
    """

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target) -> Tensor:
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)
