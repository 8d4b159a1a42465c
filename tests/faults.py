"""Helpers for tests that make ranks fail on purpose: run a call, record what happened on each
rank, and share the records so every rank asserts on the same data (and passes or fails with
the others, instead of one rank failing while the rest wait)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpi4py import MPI

WORLD = MPI.COMM_WORLD


@dataclass
class Outcome:
    """What one call did on one rank."""

    rank: int
    error: str | None = None  # exception class name, None if it returned
    message: str = ""
    seconds: float = 0.0
    attributes: dict[str, Any] = field(default_factory=dict)  # picklable attributes of the exception
    value: Any = None  # the return value when it returned

    def __str__(self) -> str:
        what = f"{self.error}: {self.message}" if self.error else f"returned {self.value!r}"
        return f"rank {self.rank} after {self.seconds:.2f} s: {what}"


_ATTRIBUTES = ("collective", "algorithm", "step", "waiting_on", "notice_from", "argument", "fields", "ranks",
               "groups")


def attempt(call: Callable[[], Any]) -> Outcome:
    """Run `call` on this rank and record whether and how it raised."""
    rank = WORLD.Get_rank()
    start = time.monotonic()
    try:
        value = call()
    except Exception as error:  # recording every failure is the point
        attributes = {name: getattr(error, name) for name in _ATTRIBUTES if hasattr(error, name)}
        return Outcome(rank, type(error).__name__, str(error), time.monotonic() - start, attributes)
    return Outcome(rank, None, "", time.monotonic() - start, value=value)


def everyone(outcome: Outcome | None) -> list[Outcome | None]:
    """Every rank's outcome (None from a rank that made no call), in rank order."""
    return WORLD.allgather(outcome)


def describe(outcomes: list[Outcome | None]) -> str:
    return "\n".join(str(o) if o else f"rank {k}: no call" for k, o in enumerate(outcomes))
