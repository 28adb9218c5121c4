"""Errors of the pipeline: each names the stage, the rank and the micro-batch where it happened."""

from __future__ import annotations

from ..errors import CollectiveError


class PipelineError(RuntimeError):
    """A pipeline step could not complete."""


class PipelineStageError(PipelineError):
    """Work on one stage raised (the first failure: every other stage stops with PipelineAbortedError)."""


class PipelineAbortedError(PipelineError, CollectiveError):
    """A stage stopped because another one failed or a transfer did not complete (the message names both)."""


class PipelineShapeError(PipelineError, ValueError):
    """Activations or gradients between two stages do not have the shape the receiving stage expects."""
