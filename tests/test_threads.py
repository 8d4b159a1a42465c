"""Threads: a communicator serves the thread that first called it. Calls from other threads,
while the owner waits inside a call (blocking in the C Shortcut, a persistent request's C wait,
a nonblocking wait), raise ConcurrentUseError or CommunicatorBrokenError before any message
moves, change nothing the owner's call uses, and the owner's call returns the right data; one
communicator per thread works with every thread calling at once. tests/thread_scenarios.py has
the scenarios; scripts/thread_stress.py runs them many times."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from mpi4py import MPI
from thread_scenarios import KINDS, intruded, own_communicators

import mpiring
from mpiring.engine import native

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()


@pytest.mark.parametrize("kind", KINDS)
def test_other_threads_calling_while_the_owner_waits_in_a_call_are_refused(kind):
    for round_ in range(2):
        seen = intruded(kind, seed=10 * KINDS.index(kind) + round_)
        assert sum(seen.values()) >= 3, seen  # every intruder called at least once


@pytest.mark.skipif(MPI.Query_thread() < MPI.THREAD_MULTIPLE,
                    reason="threads calling MPI at once need MPI_THREAD_MULTIPLE")
def test_one_communicator_per_thread_all_calling_at_once():
    own_communicators(seed=1)


def test_a_second_thread_sees_the_same_refusal_on_every_way_in():
    comm = mpiring.Communicator(timeout=30)
    x, out = np.ones(3), np.empty(3)
    for _ in range(3):
        comm.allreduce(x, out=out)  # cached: the third ran in C where the extension was built
    request = comm.allreduce_init(x, out=np.empty(3))
    request.start()
    request.wait()
    outcomes = []

    def other():
        for attempt in (lambda: comm.allreduce(x, out=out), request.start, request.wait, request.free, comm.free):
            try:
                attempt()
            except mpiring.MpiringError as error:
                outcomes.append(type(error).__name__)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert outcomes == ["ConcurrentUseError"] * 5, outcomes
    assert not comm._engine.freed and comm._ring.failures == 0
    for attempt in (lambda: comm.allreduce(x, out=out), request.start):  # the owner's next calls: broken
        with pytest.raises(mpiring.CommunicatorBrokenError):
            attempt()
    np.testing.assert_array_equal(request.wait(), np.full(3, float(N)))  # its last run's result stays
    request.free()
    comm.free()


def test_free_comes_from_the_owner_or_after_its_thread_ended():
    comm = mpiring.Communicator(timeout=30)
    sums = []
    worker = threading.Thread(target=lambda: sums.extend(comm.allreduce(np.ones(2)) for _ in range(3)))
    worker.start()
    worker.join()
    assert [float(s[0]) for s in sums] == [float(N)] * 3
    comm.free()  # the owner's thread has ended: this one may free it
    with pytest.raises(mpiring.CommunicatorFreedError):
        comm.allreduce(np.ones(2))


@pytest.mark.skipif(not native.enabled(), reason="the C replay was not built or is off")
def test_the_shortcut_still_takes_the_owner_s_cached_calls():
    comm = mpiring.Communicator(timeout=30)
    x, out = np.ones(2), np.empty(2)
    for _ in range(3):
        comm.allreduce(x, out=out)
    runs = comm.plan_of("allreduce", x, out).compiled.runs
    for _ in range(5):
        comm.allreduce(x, out=out)
    assert comm.plan_of("allreduce", x, out).compiled.runs == runs + 5  # none went to Python
    comm.free()
