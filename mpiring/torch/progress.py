"""The progress thread of a process group: the one thread that calls its mpiring Communicator.

An mpiring Communicator takes calls from one thread only (ConcurrentUseError otherwise), and its
nonblocking calls advance only while someone waits on them. torch.distributed calls a process
group from any thread (DistributedDataParallel's gradient hooks run on autograd's threads) and
expects async_op=True calls to go on by themselves. So every collective of a group is a job
handed to the group's own thread through one FIFO queue: the thread runs them one by one, in
the order they were issued (the same on every rank, as every rank issues the same calls), and
completes each job's torch Future with its result or its exception. Idle, the thread blocks on
the queue; while a job runs, its waits offer the core between tests unless the rank has two
cores or MPIRING_BUSY_POLL says otherwise (mpiring.torch.factory): it shares the rank's cores
with the caller's own work.

The thread is opt-in (`MPIRING_TORCH_PROGRESS=1`, read when a group is made): on a machine with
a core per rank it hid less all-reduce time than gloo's threads do (the all-reduce's copies and
sums need the core the backward pass computes on), and each blocking call pays the hand-over to
the thread (docs/pytorch-and-jax.md, section 3). Without it the calls run in the calling thread
at once (ProcessGroupMpiring._run): nothing overlaps, and a group takes calls from one thread
only (mpiring's ConcurrentUseError).
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from mpiring import environment

_live: weakref.WeakSet[Progress] = weakref.WeakSet()  # threads still serving, closed at exit


def wanted() -> bool:
    """Whether process groups made now get a progress thread (MPIRING_TORCH_PROGRESS, default no)."""
    return environment.flag("MPIRING_TORCH_PROGRESS", "mpiring.torch") is True


class Progress:
    """Runs jobs (callables) in order on one thread, each completing a torch Future; without a
    thread (`threaded=False`), in the caller's thread at once."""

    def __init__(self, name: str, threaded: bool = True) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Any, torch.futures.Future] | None] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # a job put after close() would never run: refuse it instead
        self.closed = False
        if threaded:
            self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
            self._thread.start()
            _live.add(self)

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def submit(self, job: Callable[[], Any], result: Any) -> torch.futures.Future:
        """A Future completed once `job()` has run after every job submitted before it: with
        `result`, or with the exception `job` raised.

        A job submitted by the thread itself (a callback that a finished job's future ran, such
        as a DDP hook's then()) runs at once: queued, it would race the calling thread's next
        jobs, which could then run in another order on another rank."""
        future: torch.futures.Future = torch.futures.Future()
        with self._lock:
            self.check_open()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._jobs.put((job, result, future))
                return future
        _complete(job, result, future)
        return future

    def check_open(self) -> None:
        """Raise RuntimeError once the group was shut down."""
        if self.closed:
            raise RuntimeError("mpiring: this process group was shut down (destroy_process_group)")

    def call(self, job: Callable[[], Any]) -> Any:
        """Run `job` in its turn and return its value (or raise its exception) here."""
        box: list[Any] = []
        self.submit(lambda: box.append(job()), None).wait()
        return box[0]

    def close(self) -> None:
        """Run the jobs already submitted, then end the thread (a second call does nothing)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._thread is None:
                return
            self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()
        _live.discard(self)

    def _serve(self) -> None:
        while (item := self._jobs.get()) is not None:
            _complete(*item)
            del item  # the job's arrays: not held until the next one comes


def _complete(job: Callable[[], Any], result: Any, future: torch.futures.Future) -> None:
    try:
        job()
    except Exception as error:  # noqa: BLE001 - it belongs to whoever waits on the future
        future.set_exception(error)
    else:
        future.set_result(result)


@atexit.register
def _close_all() -> None:
    """At exit, before MPI is finalized (mpi4py does that after Python's exit handlers), let
    every thread finish its jobs and end, so that none is inside MPI when MPI goes."""
    for progress in list(_live):
        progress.close()
