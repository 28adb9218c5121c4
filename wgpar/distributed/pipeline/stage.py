"""Pipeline stages: one slice of a model on one device, and splitting a model into such slices.

``split_module`` cuts an ``nn.Sequential`` (or a list of blocks) into contiguous parts, balanced by
parameter count or at explicit boundaries; ``PipelineStage`` puts one part on its device and checks
the activations it receives, so that a model cut in the wrong place fails with a message naming the
stages and shapes instead of somewhere inside a matmul.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...nn.layers import Sequential
from ...nn.module import Module
from ...runtime import adapters as _adapters
from ...runtime.device import Device
from ...tensor import Tensor
from .errors import PipelineShapeError


def _blocks(model: Module | Sequence[Module]) -> list[Module]:
    if isinstance(model, Sequential):
        blocks = list(model.children())
    elif isinstance(model, Module):
        raise TypeError(f"split_module: give an nn.Sequential or a list of blocks, not a {type(model).__name__} "
                        "(its forward may not be a chain)")
    else:
        blocks = list(model)
    for i, b in enumerate(blocks):
        if not isinstance(b, Module):
            raise TypeError(f"split_module: block {i} is a {type(b).__name__}, not a wgpar.nn.Module")
    return blocks


def _balanced_cuts(weights: list[int], parts: int) -> list[int]:
    """Start index of parts 1..parts-1: contiguous, non-empty, minimising the heaviest part; among equal
    splits, blocks without parameters (activations) stay with the block before them."""
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = (float("inf"), 0)
    # best[k][j]: (heaviest part, cuts before a parameter-free block) splitting blocks[:j] into k parts
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    back = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0, 0)
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            for i in range(k - 1, j):
                prev = best[k - 1][i]
                if prev == inf:
                    continue
                cand = (max(prev[0], prefix[j] - prefix[i]), prev[1] + (1 if i > 0 and weights[i] == 0 else 0))
                if cand < best[k][j]:
                    best[k][j], back[k][j] = cand, i
    cuts, j = [], n
    for k in range(parts, 0, -1):
        j = back[k][j]
        cuts.append(j)
    return sorted(cuts)[1:]


def split_module(model: Module | Sequence[Module], num_stages: int,
                 boundaries: Sequence[int] | None = None) -> list[Sequential]:
    """Cut a chain of blocks into ``num_stages`` contiguous parts (each an ``nn.Sequential`` sharing the
    blocks, so parameters are not copied).

    Arguments:
        model: an ``nn.Sequential`` or a list of blocks, applied one after another.
        num_stages: how many parts.
        boundaries: the index of the first block of parts 1..num_stages-1 (increasing); by default
            the parts are balanced by parameter count (the heaviest part as light as possible).
    """
    blocks = _blocks(model)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"split_module: num_stages must be a positive int, got {num_stages!r}")
    if len(blocks) < num_stages:
        raise ValueError(f"split_module: {len(blocks)} blocks cannot fill {num_stages} stages")
    if boundaries is None:
        cuts = _balanced_cuts([sum(p.numel() for p in b.parameters()) for b in blocks], num_stages)
    else:
        cuts = [int(c) for c in boundaries]
        edges = [0, *cuts, len(blocks)]
        if len(cuts) != num_stages - 1 or any(a >= b for a, b in zip(edges, edges[1:])):
            raise ValueError(f"split_module: boundaries must be {num_stages - 1} increasing block indices in "
                             f"1..{len(blocks) - 1} (the first block of each stage after the first), got "
                             f"{list(boundaries)}")
    edges = [0, *cuts, len(blocks)]
    return [Sequential(*blocks[a:b]) for a, b in zip(edges, edges[1:])]


def _first_leaf(module: Module) -> Module:
    while True:
        children = list(module.children())
        if not children:
            return module
        module = children[0]


class PipelineStage:
    """Stage ``stage_index`` of ``num_stages``: ``module`` on ``device`` (moved there if needed).

    Arguments:
        module: this stage's part of the model (takes one tensor, returns one tensor).
        stage_index: its position in the pipeline, 0-based.
        num_stages: the number of stages of the whole pipeline.
        device: where it runs (a Device or index; default: where its parameters are, else device 0).
        input_shape: the shape of one sample of the activations it receives (without the batch
            dimension), checked on every micro-batch; by default only the last dimension is checked,
            when the first layer is a Linear (its ``in_features``).
    """

    def __init__(self, module: Module, stage_index: int, num_stages: int, device: Device | int | None = None,
                 input_shape: Sequence[int] | None = None) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"PipelineStage: module must be a wgpar.nn.Module, got {type(module).__name__}")
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"PipelineStage: num_stages must be a positive int, got {num_stages!r}")
        if isinstance(stage_index, bool) or not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise ValueError(f"PipelineStage: stage_index {stage_index!r} out of range for {num_stages} stages")
        dev = _adapters.resolve(device if device is not None else module.device)
        if any(p.device is not dev for p in module.parameters()) or any(b.device is not dev for b in module.buffers()):
            module.to(dev)
        self.module = module
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.device = dev
        self.input_shape = tuple(int(n) for n in input_shape) if input_shape is not None else None
        first = _first_leaf(module)
        self._in_features = getattr(first, "in_features", None) if input_shape is None else None

    @property
    def is_first(self) -> bool:
        """Whether this is stage 0."""
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        """Whether this is the last stage."""
        return self.stage_index == self.num_stages - 1

    def parameters(self):
        """The parameters of the stage's module."""
        return self.module.parameters()

    def check_input(self, x: Tensor, mb: int) -> None:
        """Raise PipelineShapeError if micro-batch ``mb``'s activations do not fit this stage."""
        src = f"stage {self.stage_index - 1}" if self.stage_index else "the input"
        if self.input_shape is not None and tuple(x.shape[1:]) != self.input_shape:
            raise PipelineShapeError(f"stage {self.stage_index} expects activations of shape (batch, "
                                     f"{', '.join(map(str, self.input_shape))}) but {src} sent {x.shape} for "
                                     f"micro-batch {mb}")
        if self._in_features is not None and (x.ndim == 0 or x.shape[-1] != self._in_features):
            raise PipelineShapeError(f"stage {self.stage_index} expects activations whose last dimension is "
                                     f"{self._in_features} (its first layer's in_features) but {src} sent {x.shape} "
                                     f"for micro-batch {mb}")

    def __repr__(self) -> str:
        return f"PipelineStage({self.stage_index}/{self.num_stages}, device={self.device}, module={self.module!r})"
