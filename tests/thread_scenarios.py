"""Threads on communicators, for tests/test_threads.py and scripts/thread_stress.py (which runs
these many times, at several world sizes and MPI thread levels).

`intruded`: one communicator, owned by the calling thread, which makes calls every rank makes
alike; other threads call it (blocking, nonblocking and persistent calls, a request's start,
test, wait, result and free, the communicator's free) from the moment the owner's call of a
given kind has begun, while the owner waits inside it (MPI waits let go of the GIL, in C and in
mpi4py). Every one of their calls must raise ConcurrentUseError or CommunicatorBrokenError
before any message moves; the owner's call must complete with the right data; and once the
intruders have called, the owner's next call raises CommunicatorBrokenError on every rank
alike, so no rank is left waiting.

`own_communicators`: several threads at once, each on a communicator of its own, results
checked against NumPy on inputs every rank regenerates (needs MPI_THREAD_MULTIPLE: their MPI
calls overlap).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
from mpi4py import MPI
from oracles import all_inputs, numpy_reduce

import mpiring

KINDS = ("blocking", "persistent", "nonblocking")
REFUSED = (mpiring.ConcurrentUseError, mpiring.CommunicatorBrokenError)


def _expect(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), (
        f"{what}: got {got!r}, want {want!r}")


def intruded(kind: str, seed: int, intruders: int = 3, skew: float = 0.005, timeout: float = 30.0) -> Counter:
    """One round (see the module's docstring) on a new communicator, whose owner is the calling
    thread; `kind`: the owner's call the intruders come into (a blocking allreduce in the C
    Shortcut, a persistent request's start and wait, a nonblocking allreduce's wait). Rank 0
    comes to that call `skew` seconds late, so the others wait inside it. Returns what the
    intruders' calls raised, by exception name; raises AssertionError on anything else."""
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    comm = mpiring.Communicator(timeout=timeout)
    ring = comm._ring
    inputs = all_inputs(seed, size, (4,), np.int64)
    x, want = inputs[rank], numpy_reduce("sum", inputs)
    y, y2, py = np.empty(4, np.int64), np.empty(4, np.int64), np.empty(4, np.int64)
    root_x = all_inputs(seed + 1, size, (3,), np.int64)[0]
    b = root_x.copy() if rank == 0 else np.zeros(3, np.int64)
    for _ in range(3):  # recorded, then cached: the next ones run in C (where the extension was built)
        _expect(comm.allreduce(x, out=y), want, "warm-up allreduce")
        _expect(comm.broadcast(b, out=b), root_x, "warm-up broadcast")
    persistent = comm.allreduce_init(x, out=py)
    persistent.start()
    _expect(persistent.wait(), want, "warm-up persistent allreduce")
    owners_request = comm.iallreduce(x, out=y2)
    _expect(owners_request.wait(), want, "warm-up iallreduce")

    begun = ring.calls  # the owner's call of `kind` takes the next number: the intruders wait for it
    go, stop = threading.Event(), threading.Event()
    first = [threading.Event() for _ in range(intruders)]
    seen: Counter = Counter()
    wrong: list[str] = []
    mine = np.empty(4, np.int64)
    attempts = (
        lambda: comm.allreduce(x, out=y),  # the owner's very arrays: the Shortcut's memo of its last hit
        lambda: comm.allreduce(x, out=mine),  # the same layout: the Shortcut's table
        lambda: comm.broadcast(b, out=b),
        lambda: comm.allreduce(x),
        lambda: comm.iallreduce(x, out=mine),
        lambda: comm.allreduce_init(x, out=mine),
        persistent.start,
        persistent.wait,
        persistent.test,
        lambda: persistent.result,
        persistent.free,
        owners_request.wait,
        owners_request.test,
        comm.barrier,
        comm.free,
    )

    def intrude(k: int) -> None:
        go.wait()
        deadline = time.monotonic() + timeout
        while ring.calls == begun and time.monotonic() < deadline:  # until the owner's call has begun
            time.sleep(0)
        n = k
        while True:
            attempt = attempts[n % len(attempts)]
            n += 1
            try:
                result = attempt()
            except REFUSED as error:
                seen[type(error).__name__] += 1
            except BaseException as error:  # noqa: BLE001 - any other outcome is the failure reported
                wrong.append(f"intruder {k}, attempt {(n - 1) % len(attempts)}: {type(error).__name__}: {error}")
            else:
                wrong.append(f"intruder {k}, attempt {(n - 1) % len(attempts)}: returned {result!r}")
            first[k].set()
            if stop.is_set():
                return

    threads = [threading.Thread(target=intrude, args=(k,), daemon=True) for k in range(intruders)]
    for thread in threads:
        thread.start()
    try:
        go.set()
        if rank == 0:
            time.sleep(skew)  # the other ranks wait for rank 0 inside the call, with the intruders
        if kind == "blocking":
            got = comm.allreduce(x, out=y)
        elif kind == "persistent":
            persistent.start()
            got = persistent.wait()
        else:
            got = comm.iallreduce(x, out=y2).wait()
        _expect(got, want, f"the owner's {kind} allreduce while other threads call")
        for event in first:  # every intruder has called: the ring is broken here, whatever came first
            assert event.wait(timeout), "an intruder never called"
        try:
            comm.allreduce(x, out=y)
        except mpiring.CommunicatorBrokenError:
            pass
        else:
            raise AssertionError("the owner's call after a second thread's returned: the ring should be broken")
    finally:
        stop.set()
        go.set()
        for thread in threads:
            thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "an intruder is still calling"
    assert not wrong, wrong
    # the intruders took no call number and failed no call: the owner's count is its own
    assert ring.calls == begun + 1 and ring.failures == 0, (ring.calls, begun, ring.failures)
    assert ring.broken is not None and "second thread" in ring.broken, ring.broken
    comm.free()
    return seen


def own_communicators(seed: int, threads: int = 3, iterations: int = 12, timeout: float = 60.0) -> None:
    """Several threads at once, each on a communicator of its own (made here, in the same order on
    every rank; freed here once the threads are done), each making blocking, nonblocking and
    persistent calls whose results are checked against NumPy."""
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    comms = [mpiring.Communicator(timeout=timeout) for _ in range(threads)]
    failures: list[str] = []

    def run(k: int) -> None:
        comm = comms[k]
        px, py = np.empty((3, 2), np.int64), np.empty((3, 2), np.int64)
        persistent = comm.allreduce_init(px, out=py)
        y = np.empty((3, 2), np.int64)
        try:
            for i in range(iterations):
                case = seed * 1000 + k * 100 + i
                inputs = all_inputs(case, size, (3, 2), np.int64)
                total = numpy_reduce("sum", inputs)
                _expect(comm.allreduce(inputs[rank], out=y), total, f"thread {k} allreduce {i}")
                root = i % size
                b = inputs[root].copy() if rank == root else np.zeros((3, 2), np.int64)
                _expect(comm.broadcast(b, root=root, out=b), inputs[root], f"thread {k} broadcast {i}")
                _expect(comm.allgather(inputs[rank]), np.concatenate(inputs), f"thread {k} allgather {i}")
                maxima = numpy_reduce("max", inputs)
                _expect(comm.iallreduce(inputs[rank], op="max").wait(), maxima, f"thread {k} iallreduce {i}")
                px[...] = inputs[rank]
                persistent.start()
                _expect(persistent.wait(), total, f"thread {k} persistent allreduce {i}")
            persistent.free()
        except BaseException as error:  # noqa: BLE001 - reported by the caller, from the main thread
            failures.append(f"thread {k}: {type(error).__name__}: {error}")

    workers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout * 2)
    assert not any(worker.is_alive() for worker in workers), "a thread's calls did not finish"
    assert not failures, failures
    for comm in comms:  # their threads have ended: another may free them
        comm.free()
