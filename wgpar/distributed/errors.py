"""Errors of the distributed layer: every rank sees one that names the rank at fault and the collective."""

from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete: a rank failed, disagreed, or the group is broken."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A rank did not arrive at a collective (or a transfer did not finish) within the timeout."""


class RankError(RuntimeError):
    """Work on one rank raised; ``rank`` and ``__cause__`` say where and what."""

    def __init__(self, rank: int, exc: BaseException) -> None:
        super().__init__(f"rank {rank} raised {type(exc).__name__}: {exc}")
        self.rank = rank
