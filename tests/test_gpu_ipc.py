"""The IPC path's protocol without a GPU: FakeIpcEngine puts each rank's blocks in POSIX shared
memory that the other ranks (processes) really open by name, as CUDA IPC opens a handle, with
copies that land late. The collectives are checked against NumPy oracles; MPI may only ever see
host memory (descriptors and acknowledgements).
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_device import (
    RecordingComm,
    check_collectives_on_fake_device,
    direct_backend,
    ipc_backend,
    on_host,
    route_to,
    staged_backend,
    to_device,
)
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce, rank_input

import mpiring
import mpiring.gpu
from mpiring.errors import CollectiveTimeout, CommunicationError
from mpiring.gpu.ipc import decode_descriptor, encode_descriptor

pytestmark = pytest.mark.mpi

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()


def _route(monkeypatch, backend) -> None:
    route_to(monkeypatch, backend)


@pytest.fixture(scope="module")
def ipc_comm():
    log: list = []
    comm = mpiring.Communicator()
    comm._ring.comm = RecordingComm(comm._ring.comm, log)
    backend = ipc_backend(log, delay=1)
    yield comm, backend, log
    comm.free()
    backend.pool = None
    backend.engine.close()


@pytest.fixture
def on_ipc(monkeypatch, ipc_comm):
    comm, backend, log = ipc_comm
    _route(monkeypatch, backend)
    log.clear()
    return comm, backend, log


def test_a_node_local_communicator_knows_it():
    comm = mpiring.Communicator()
    assert comm._ring.node_local  # every rank of a test run shares this machine
    comm.free()


@pytest.mark.parametrize("algorithm", [None, "ring"])
def test_collectives_on_the_ipc_path(on_ipc, algorithm):
    comm, _, log = on_ipc
    check_collectives_on_fake_device(comm, algorithm)
    if N > 1:  # payloads went device to device; MPI saw only host memory (checked above)
        assert any(entry[0] == "to_block" for entry in log) and any(entry[0] == "from_peer" for entry in log)
        assert not any(entry[0] in ("d2h", "h2d") for entry in log), "no host staging on the IPC path"


def test_ipc_in_place_strided_and_nonblocking(on_ipc):
    comm, _, _ = on_ipc
    inputs = all_inputs(4, N, (N + 2, 5), np.float32)
    total = numpy_reduce("sum", inputs)
    x = to_device(inputs[RANK])
    assert comm.allreduce(x, out=x) is x
    assert_same(on_host(x), total, "in place")
    out = to_device(np.full((N + 2, 10), np.nan, np.float32))[:, ::2]
    assert comm.allreduce(to_device(inputs[RANK]), out=out) is out
    assert_same(np.asarray(out), total, "strided out=")
    requests = [comm.iallreduce(to_device(inputs[RANK]), op=op) for op in ("max", "min")]
    assert_same(on_host(requests[1].wait()), numpy_reduce("min", inputs), "iallreduce min")
    assert_same(on_host(requests[0].wait()), numpy_reduce("max", inputs), "iallreduce max")


def test_ipc_blocks_are_reused_and_handles_opened_once(on_ipc):
    comm, backend, _ = on_ipc
    x = to_device(rank_input(1, RANK, 5000, np.float64))
    for _ in range(2):
        comm.allreduce(x)
    allocations = backend.pool.allocations
    for _ in range(5):
        assert_same(on_host(comm.allreduce(x)), numpy_reduce("sum", all_inputs(1, N, 5000, np.float64)), "warm")
    assert backend.pool.allocations == allocations, "device blocks must be reused, not allocated per call"
    # A peer's free blocks of one size take turns (earlier tests may have left several: a linear
    # broadcast's root sends to every rank at once), so a warm call may meet one of its blocks for
    # the first time; what must never happen is opening a block twice.
    assert backend.engine.opens == len(backend.engine.opened), "a peer's block is opened once, not per call"


def test_a_communicator_across_nodes_takes_the_fallback(on_ipc):
    comm, backend, log = on_ipc
    comm._ring.node_local = False  # as if the ranks were on several nodes
    try:
        inputs = all_inputs(7, N, 300, np.float32)
        assert_same(on_host(comm.allreduce(to_device(inputs[RANK]), algorithm="ring")),
                    numpy_reduce("sum", inputs), "fallback allreduce")
    finally:
        comm._ring.node_local = True
    if N > 1:
        assert any(entry[0] == "d2h" for entry in log) and not any(entry[0] == "to_block" for entry in log)


def test_descriptor_round_trip():
    class Block:
        handle = bytes(range(64))
        serial = 12345678901
        nbytes = 1 << 20

    assert decode_descriptor(encode_descriptor(Block(), 4096)) == (Block.handle, Block.serial, 4096)
    assert decode_descriptor(encode_descriptor(None, 0))[2] == 0


@pytest.mark.skipif(N < 2, reason="needs two ranks")
def test_ranks_on_different_paths_raise_instead_of_mixing_data(monkeypatch):
    """Rank 0 on the IPC path, the others staged: every rank raises, none returns data."""
    log: list = []
    comm = mpiring.Communicator(timeout=3)
    backend = ipc_backend(log, delay=1) if RANK == 0 else staged_backend(log, delay=1, segment_bytes=4096)
    _route(monkeypatch, backend)
    x = to_device(rank_input(2, RANK, 1000, np.float32))
    with pytest.raises((CommunicationError, CollectiveTimeout)):
        comm.allreduce(x, algorithm="ring")
    if RANK == 0:
        backend.engine.close()


def test_ipc_switch_and_debug_message(monkeypatch, capsys):
    made = []

    def make(device_id, path):
        made.append(path)
        return direct_backend([]) if path == "direct" else staged_backend([])

    monkeypatch.setattr(mpiring.gpu, "_backends", {})
    monkeypatch.setattr(mpiring.gpu, "_make_backend", make)
    monkeypatch.setattr(mpiring.gpu, "_make_ipc_backend", lambda device_id, fallback: ipc_backend([]))
    monkeypatch.setenv("MPIRING_CUDA_AWARE", "0")
    monkeypatch.setenv("MPIRING_DEBUG", "1")

    class CupyLike:
        device = type("Device", (), {"id": 0})()

    monkeypatch.delenv("MPIRING_GPU_IPC", raising=False)
    assert mpiring.gpu.device_backend(CupyLike()).path == "ipc"  # MPI not CUDA-aware: IPC by default
    assert "ipc path on communicators whose ranks share one node" in capsys.readouterr().err
    monkeypatch.setenv("MPIRING_GPU_IPC", "0")
    assert mpiring.gpu.device_backend(CupyLike()).path == "staged"
    monkeypatch.setenv("MPIRING_CUDA_AWARE", "1")
    monkeypatch.delenv("MPIRING_GPU_IPC")
    assert mpiring.gpu.device_backend(CupyLike()).path == "direct", "CUDA-aware MPI: direct before IPC"
    monkeypatch.setenv("MPIRING_GPU_IPC", "1")
    assert mpiring.gpu.device_backend(CupyLike()).path == "ipc"  # =1 puts IPC before direct
    monkeypatch.setenv("MPIRING_GPU_IPC", "maybe")
    with pytest.raises(mpiring.ArgumentError, match="MPIRING_GPU_IPC"):
        mpiring.gpu.device_backend(CupyLike())
