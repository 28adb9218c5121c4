"""Errors raised by collectives: every rank sees one that names the rank at fault and the collective."""

from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete: a rank failed, disagreed, or the group is broken."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A rank did not arrive at a collective (or a transfer did not finish) within the timeout."""
