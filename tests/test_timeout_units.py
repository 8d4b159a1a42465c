"""The timeout poll in mpiring.engine.waiting, without MPI: a fake request shows what happens at the edge
of the deadline (serial; the MPI behaviour is in tests/test_timeouts.py)."""

from __future__ import annotations

import types

import pytest

import mpiring.engine.waiting as waiting_module
from mpiring.engine.ring import Ring
from mpiring.engine.tags import Tags
from mpiring.engine.transport import Call, Step
from mpiring.errors import CollectiveTimeout


class _Request:
    """A request that finishes on the `finishes_at`-th Testall."""

    def __init__(self, finishes_at: int | None) -> None:
        self.finishes_at = finishes_at

    def Get_status(self, status=None) -> bool:  # noqa: N802 - mpi4py's name
        return self.finishes_at is not None and _FakeRequestClass.polls >= self.finishes_at

    def Test(self) -> bool:  # noqa: N802
        return self.Get_status()


class _FakeRequestClass:
    polls = 0

    @classmethod
    def Testall(cls, requests, statuses=None) -> bool:  # noqa: N802
        cls.polls += 1
        return all(r.finishes_at is not None and cls.polls > r.finishes_at for r in requests)


@pytest.fixture
def fake_mpi(monkeypatch):
    _FakeRequestClass.polls = 0
    fake = types.SimpleNamespace(Request=_FakeRequestClass, Status=object, Exception=RuntimeError)
    monkeypatch.setattr(waiting_module, "MPI", fake)
    return fake


def _step(*requests: _Request) -> Step:
    step = Step()
    step.requests = list(requests)
    step.peers = [("receive from", k + 1) for k in range(len(requests))]
    return step


def _poll(step: Step, timeout: float, busy_poll: bool = False) -> None:
    ring = object.__new__(Ring)  # poll uses no other state of the ring than its tags and busy_poll
    ring.tags = Tags(None)
    ring.busy_poll = busy_poll
    waiting_module.poll(ring, step, None, Call("allreduce", "ring", 1, timeout))  # a sequence tag: nothing to look for


def test_messages_that_arrive_at_the_deadline_are_not_a_timeout(fake_mpi):
    """The first Testall finds them pending, by the deadline they are in: no timeout."""
    _poll(_step(_Request(finishes_at=1), _Request(finishes_at=1)), timeout=1e-9)


def test_a_timeout_names_only_the_requests_still_pending(fake_mpi):
    with pytest.raises(CollectiveTimeout) as caught:
        _poll(_step(_Request(finishes_at=1), _Request(finishes_at=None)), timeout=1e-9)
    assert caught.value.waiting_on == ["receive from rank 2"]
    assert str(caught.value).startswith("allreduce (ring) timed out after 1e-09 s in step 0, "
                                        "still waiting to receive from rank 2 (its receives were cancelled")


def test_the_poll_backs_off_instead_of_spinning(fake_mpi, monkeypatch):
    """It offers the core between polls up to 10 ms, then sleeps, the pause doubling from
    10 us to 1 ms (cores stay free during a long wait)."""
    pauses, yields = [], []
    monkeypatch.setattr(waiting_module.time, "sleep", pauses.append)
    monkeypatch.setattr(waiting_module, "_yield_core", lambda: yields.append(1))
    with pytest.raises(CollectiveTimeout):
        _poll(_step(_Request(finishes_at=None)), timeout=0.05)
    assert yields and pauses[:4] == pytest.approx([1e-5, 2e-5, 4e-5, 8e-5])
    assert max(pauses) <= 1e-3


def test_a_node_with_a_core_per_rank_polls_without_yielding(fake_mpi, monkeypatch):
    """Ring.busy_poll: the first 10 ms test again and again, as MPI libraries do on cores of their
    own; a long wait still sleeps, backing off."""
    pauses, yields = [], []
    monkeypatch.setattr(waiting_module.time, "sleep", pauses.append)
    monkeypatch.setattr(waiting_module, "_yield_core", lambda: yields.append(1))
    with pytest.raises(CollectiveTimeout):
        _poll(_step(_Request(finishes_at=None)), timeout=0.05, busy_poll=True)
    assert not yields and pauses[:2] == pytest.approx([1e-5, 2e-5])


def test_a_status_seen_early_survives_the_testall_that_completes_the_step():
    """MPICH leaves a persistent request that answered MPI_Request_get_status inactive, and the
    Testall that then completes the step gives an empty status for it: 0 bytes, which the size
    check took for a short message (a planned 64 MiB reduce at 4 ranks failed so, once a long
    wait had looked at its peers). `finished` keeps the status it saw; the wait puts it back."""
    import numpy as np
    from mpi4py import MPI

    from mpiring.backend import NUMPY
    from mpiring.engine.transport import Traffic, make_step

    comm = MPI.COMM_SELF.Dup()
    try:
        sent, received = np.arange(100, dtype=np.uint8), np.zeros(100, np.uint8)
        step = make_step(comm, NUMPY, 7, [(sent, 0)], [(received, 0)], Traffic(), persistent=True)
        step.statuses = [MPI.Status() for _ in step.requests]
        ring = types.SimpleNamespace(rank=0)
        for _ in range(2):  # a planned step runs again and again
            MPI.Prequest.Startall(step.requests)
            while not waiting_module.finished(step, 0):  # what a long wait's look does
                pass
            assert waiting_module.finished(step, 0)  # a later look (the step still waits for others)
            assert waiting_module.is_complete(ring, step, Call("allreduce", "ring", 7))
            assert step.statuses[0].Get_count(MPI.BYTE) == 100
            np.testing.assert_array_equal(received, sent)
            received[:] = 0
        for request in step.requests:
            request.Free()
    finally:
        comm.Free()
