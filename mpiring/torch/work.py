"""torch.distributed's Work objects over mpiring's requests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# what a pending Work waits for: (test, wait), each a call on one request
Pending = tuple[Callable[[], bool], Callable[[], Any]]


class Work(dist.Work):
    """One call of the process group: done at once (a blocking call), or pending on mpiring's
    nonblocking requests (or MPI's, for send and recv), which advance only inside is_completed()
    and wait(), as mpiring's requests do. `finish` runs once they are all done (copying a
    result into the caller's tensors, where the call ran on a temporary).

    get_future() waits first and returns a completed future: mpiring has no progress thread that
    could complete it later (so DistributedDataParallel's bucket all-reduces run one by one).
    """

    def __init__(self, outputs: Sequence[torch.Tensor] | None = None, pending: Sequence[Pending] = (),
                 finish: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._outputs = list(outputs) if outputs is not None else []
        self._pending = list(pending)
        self._finish = finish
        self._done = not self._pending and finish is None
        self._error: BaseException | None = None
        self.source: int = -1  # recv_anysource: the rank the message came from
        self._keep: Any = None  # temporaries the call reads or writes, alive as long as the Work

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the call is done (mpiring's communicator timeout applies, not `timeout`)."""
        if self._error is not None:
            raise self._error
        if not self._done:
            try:
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
        if all(test() for test, _ in self._pending):
            self.wait()
        return self._done

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
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._outputs)
        return future


def of_request(request: Any) -> Pending:
    """An mpiring request (nonblocking collective) as a Work's pending entry."""
    return request.test, request.wait


def of_mpi(request: Any, status: Any = None) -> Pending:
    """An mpi4py request (send, recv) as a Work's pending entry."""
    return (lambda: request.Test(status)), (lambda: request.Wait(status))
