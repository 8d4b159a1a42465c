"""mpiring.survival in one process: several Livenesses, one per thread standing in for a rank,
connected over real sockets. A "rank" that dies has its sockets closed without a goodbye, as the
kernel closes a dead process's. Their agreement, loss detection and revoke are checked here;
tests/test_lost_rank.py does the same with real processes under mpiexec."""

from __future__ import annotations

import threading
import time

import pytest

from mpiring import survival


class _Exchange:
    """What Liveness needs of a communicator (its rank, size, allgather and barrier), for threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: list = [None] * size
        self.barrier = threading.Barrier(size)

    def view(self, rank: int) -> _Comm:
        return _Comm(self, rank)


class _Comm:
    def __init__(self, exchange: _Exchange, rank: int) -> None:
        self.exchange, self.rank = exchange, rank

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.exchange.size

    def allgather(self, item: object) -> list:
        self.exchange.items[self.rank] = item
        self.exchange.barrier.wait()
        items = list(self.exchange.items)
        self.exchange.barrier.wait()
        return items

    def Barrier(self) -> None:  # noqa: N802
        self.exchange.barrier.wait()


def _each(size: int, work, ranks=None) -> dict[int, object]:
    """Run work(rank) on a thread per rank; their results by rank (an exception is the result)."""
    results: dict[int, object] = {}

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except Exception as error:  # handed back to the test
            results[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (range(size) if ranks is None else ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    return results


@pytest.fixture
def mesh():
    made: list[survival.Liveness] = []

    def make(size: int) -> list[survival.Liveness]:
        exchange = _Exchange(size)
        livenesses = _each(size, lambda rank: survival.Liveness(exchange.view(rank), silence=5.0))
        made.extend(livenesses[rank] for rank in range(size))
        return [livenesses[rank] for rank in range(size)]

    yield make
    for liveness in made:
        liveness.close()
    survival._any_loss = False  # (these losses were in threads: the process must finalize MPI as usual)


def _die(liveness: survival.Liveness) -> None:
    """The rank's process is gone: its sockets close with no goodbye."""
    survival._WATCHER.remove(liveness)


def _wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.002)
    return False


def test_agree_ands_the_flags_and_loses_nobody(mesh) -> None:
    ranks = mesh(4)
    results = _each(4, lambda rank: ranks[rank].agree(0b111 if rank else 0b101))
    assert all(results[rank] == (0b101, frozenset()) for rank in range(4)), results
    again = _each(4, lambda rank: ranks[rank].agree(1))  # a second agreement does not mix with the first
    assert all(again[rank] == (1, frozenset()) for rank in range(4)), again


def test_a_dead_rank_is_seen_by_every_survivor_and_agreed_on(mesh) -> None:
    ranks = mesh(5)
    _die(ranks[3])
    assert _wait_for(lambda: all(ranks[rank].failed for rank in (0, 1, 2, 4)))
    assert all(ranks[rank].lost == {3} for rank in (0, 1, 2, 4))
    error = ranks[0].error("allreduce")
    assert error.lost == [3] and "rank 3" in str(error)
    results = _each(5, lambda rank: ranks[rank].agree(2 + rank % 2), ranks=(0, 1, 2, 4))
    assert all(results[rank] == (2, frozenset({3})) for rank in (0, 1, 2, 4)), results


def test_a_rank_lost_during_the_agreement_is_left_out_everywhere(mesh) -> None:
    ranks = mesh(4)

    def work(rank: int):
        if rank == 1:
            time.sleep(0.01)  # the others are inside the agreement, waiting for it
            _die(ranks[1])
            return None
        return ranks[rank].agree(1)

    results = _each(4, work)
    assert all(results[rank] == (1, frozenset({1})) for rank in (0, 2, 3)), results


def test_revoke_reaches_every_rank_and_a_goodbye_is_no_loss(mesh) -> None:
    ranks = mesh(3)
    ranks[2].revoke()
    assert _wait_for(lambda: ranks[0].revoked and ranks[1].revoked)
    assert ranks[0].failed and ranks[0].lost == set()
    assert type(ranks[1].error("broadcast")).__name__ == "CommunicatorRevokedError"
    fresh = mesh(2)
    fresh[1].close()  # freed: it says goodbye, so its peer does not take it for lost
    time.sleep(0.3)
    assert not fresh[0].failed and fresh[0].lost == set()


def test_a_silent_peer_is_lost_after_the_heartbeat_timeout(mesh) -> None:
    ranks = mesh(2)
    ranks[0].silence = 0.5
    # rank 1 stops speaking without closing: its connection stays open, its watcher no longer serves it
    with survival._WATCHER.lock:
        survival._WATCHER.livenesses.remove(ranks[1])
        for peer in ranks[1].peers.values():
            survival._WATCHER.selector.unregister(peer.sock)
    assert _wait_for(lambda: ranks[0].lost == {1}, seconds=5.0)


def test_shrink_raises_by_name_when_mpi_does_not_make_the_communicator(mesh) -> None:
    """MPI_Comm_create_group that never returns (a killed rank can leave MPI's shared memory
    broken) ends shrink with CommunicationError at its deadline, not a hang."""
    from mpi4py import MPI

    from mpiring.errors import CommunicationError

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("shrink watches MPI from a second thread only under MPI_THREAD_MULTIPLE")
    [liveness] = mesh(1)
    released = threading.Event()

    class Group:
        def Incl(self, ranks: list[int]) -> Group:  # noqa: N802 - mpi4py's names
            return self

        def Free(self) -> None:  # noqa: N802
            pass

    class Comm:
        def Get_group(self) -> Group:  # noqa: N802
            return Group()

        def Create_group(self, group: Group, tag: int) -> None:  # noqa: N802
            released.wait(30)

    began = time.monotonic()
    with pytest.raises(CommunicationError, match="survivors' communicator within 0.2 s"):
        survival.shrink(liveness, Comm(), lambda comm: comm, 0.2)
    assert time.monotonic() - began < 5
    released.set()
