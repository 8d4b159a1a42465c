"""Errors that end a training run cleanly, and how the ranks agree on them without hanging.

A rank that hits a problem (an unreadable data file, a bad checkpoint) must not just exit: the
others would wait for it in the next collective for ever. Instead every rank calls `agree` at
the same point, with its own problem or None; if any rank has one, every rank raises the same
TrainingError, carrying the message of the lowest rank that failed.
"""

from __future__ import annotations

from typing import Any

import numpy

_MESSAGE_BYTES = 2048


class TrainingError(Exception):
    """A problem with the run's inputs (data, flags, checkpoint) that ends it with a message."""


def agree(comm: Any, problem: BaseException | str | None, error: type[TrainingError] = TrainingError) -> None:
    """Collective: raise `error` (a TrainingError) on every rank if any rank passes a problem.

    Costs one small all-reduce when nobody failed, plus one broadcast of the message otherwise.
    """
    flag = numpy.array([comm.rank if problem is not None else comm.size], dtype=numpy.int64)
    first = int(comm.allreduce(flag, op="min")[0])
    if first == comm.size:
        return
    message = numpy.zeros(_MESSAGE_BYTES, dtype=numpy.uint8)
    if comm.rank == first:
        encoded = str(problem).encode("utf-8")[:_MESSAGE_BYTES]
        message[: len(encoded)] = numpy.frombuffer(encoded, dtype=numpy.uint8)
    comm.broadcast(message, root=first, out=message)
    text = bytes(message).rstrip(b"\0").decode("utf-8", errors="replace")
    if comm.size > 1 and comm.rank != first:
        text += f" (on rank {first})"
    if isinstance(problem, BaseException) and comm.rank == first:
        raise error(text) from problem
    raise error(text)
