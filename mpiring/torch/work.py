"""torch.distributed's Work objects: a collective's torch Future, or MPI's own requests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# what a pending send or recv waits for: (test, wait), each a call on one MPI request
Pending = tuple[Callable[[], bool], Callable[[], Any]]


class Work(dist.Work):
    """One call of the process group: done at once (a blocking call); a collective's `future`,
    which the group's progress thread completes (mpiring.torch.progress); or pending on MPI's
    requests (send and recv), which advance inside is_completed() and wait(), with `finish` run
    once they are all done."""

    def __init__(self, outputs: Sequence[torch.Tensor] | None = None, future: torch.futures.Future | None = None,
                 pending: Sequence[Pending] = (), finish: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._outputs = list(outputs) if outputs is not None else []
        self._future = future
        self._chained: torch.futures.Future | None = None  # get_future()'s
        self._pending = list(pending)
        self._finish = finish
        self._done = future is None and not self._pending and finish is None
        self._error: BaseException | None = None
        self.source: int = -1  # recv_anysource: the rank the message came from
        self._keep: Any = None  # temporaries the call reads or writes, alive as long as the Work

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the call is done and raise its error, if it had one (mpiring's
        communicator timeout applies, not `timeout`)."""
        if self._error is not None:
            raise self._error
        if not self._done:
            try:
                if self._future is not None:
                    self._future.wait()
                for _, wait in self._pending:
                    wait()
                if self._finish is not None:
                    self._finish()
            except BaseException as error:
                self._error = error
                raise
            self._done = True
        return True

    def is_completed(self) -> bool:
        if self._done or self._error is not None:
            return True
        if self._future is not None:
            if not self._future.done():
                return False
        elif not all(test() for test, _ in self._pending):
            return False
        with contextlib.suppress(Exception):  # done with an error: wait() and exception() give it
            self.wait()
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def source_rank(self) -> int:
        return self.source

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        """The call's Future: for a collective, completed by its progress thread (at once where
        the call ran in the caller's thread); for send and recv, completed after a wait.

        A collective's error makes it a failed future, as torch's own backends' are: its wait()
        raises RuntimeError naming the error (wait() on the Work raises the error itself). The
        thread's future keeps the exception as its value (torch's set_exception), which C++
        callers such as DDP's reducer would take for a result; the then() turns it into a
        failure they see."""
        if self._future is not None:
            if self._chained is None:
                self._chained = self._future.then(_value)
            return self._chained
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future


def _value(future: torch.futures.Future) -> Any:
    return future.value()  # raises the call's error: the chained future fails


def of_mpi(request: Any, status: Any = None) -> Pending:
    """An mpi4py request (send, recv) as a Work's pending entry."""
    return (lambda: request.Test(status)), (lambda: request.Wait(status))
