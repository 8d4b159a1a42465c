"""Small device calls on host copies (mpiring.gpu.host_route), tested without a GPU.

Device memory is faked (tests/fake_device.py): the copies to and from the host land late, so a
route that read x before its copy finished, or returned before the result's copy was ordered
before later kernels, gives wrong data. The MPI-marked tests run whole collectives at every
world size against NumPy oracles; the serial ones check the route's own rules.
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_device import (
    RecordingComm,
    check_collectives_on_fake_device,
    ipc_backend,
    on_host,
    route_to,
    staged_backend,
    to_device,
)
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce

import mpiring
from mpiring.errors import ArgumentError
from mpiring.gpu.host_route import DEFAULT_HOST_BYTES, HOST_BYTES_ENV, HostRoute, host_bytes_from_env

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
LIMIT = 1 << 12  # small calls up to 4 KiB take the route in these tests


@pytest.fixture(scope="module", params=["staged", "ipc"])
def routed_comm(request):
    log: list = []
    comm = mpiring.Communicator()
    comm._ring.comm = RecordingComm(comm._ring.comm, log)
    if request.param == "staged":
        backend = staged_backend(log, delay=2, segment_bytes=256, host_bytes=LIMIT)
    else:
        backend = ipc_backend(log, delay=2, host_bytes=LIMIT)
    yield comm, backend, log
    comm.free()
    if request.param == "ipc":
        backend.pool = None
        backend.engine.close()


@pytest.fixture
def on_route(monkeypatch, routed_comm):
    comm, backend, log = routed_comm
    route_to(monkeypatch, backend)
    log.clear()
    return comm, backend, log


@pytest.mark.mpi
def test_every_collective_is_right_with_the_route(on_route):
    comm, _, _ = on_route
    check_collectives_on_fake_device(comm, None)


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_a_small_call_is_two_copies_and_no_kernel(on_route, op):
    comm, backend, log = on_route
    inputs = all_inputs(3, N, 100, np.float32, op)
    got = comm.allreduce(to_device(inputs[RANK]), op=op)
    assert_same(on_host(got), numpy_reduce(op, inputs), f"allreduce {op}")
    kinds = [entry[0] for entry in log]
    assert kinds.count("fetch") == 1 and kinds.count("put") == 1 and "kernel" not in kinds, kinds
    assert not {"d2h", "h2d", "to_block", "from_peer"} & set(kinds), "no staged or IPC transfer"


@pytest.mark.mpi
def test_every_rank_takes_the_device_path_above_the_limit(on_route):
    comm, backend, log = on_route
    inputs = all_inputs(5, N, LIMIT // 4 + 1, np.float32)  # one element over
    got = comm.allreduce(to_device(inputs[RANK]))
    assert_same(on_host(got), numpy_reduce("sum", inputs), "over the limit")
    assert ("x", (LIMIT // 4 + 1,), np.dtype(np.float32)) not in backend._host_route._twins


@pytest.mark.mpi
def test_out_in_place_and_repeated_calls_hit_the_host_plan(on_route):
    comm, backend, _ = on_route
    x = to_device(np.zeros((6, 3), np.float64))
    out = to_device(np.zeros((6, 3), np.float64))
    for step in range(4):
        inputs = all_inputs(10 + step, N, (6, 3), np.float64)
        x[...] = inputs[RANK]
        assert comm.allreduce(x, out=out) is out
        assert_same(on_host(out), numpy_reduce("sum", inputs), f"step {step}")
    twins = backend._host_route._twins
    host_x, host_out = (twins[(role, (6, 3), np.dtype(np.float64))][0] for role in ("x", "out"))
    assert comm.plan_of("allreduce", host_x, host_out) is not None, "the repeated call is planned on the host"
    inputs = all_inputs(20, N, (6, 3), np.float64)
    x[...] = inputs[RANK]
    assert comm.allreduce(x, out=x) is x
    assert_same(on_host(x), numpy_reduce("sum", inputs), "in place")


@pytest.mark.mpi
def test_rooted_and_prefix_collectives_on_the_route(on_route):
    comm, _, _ = on_route
    inputs = all_inputs(7, N, (N + 1, 2), np.int64, "sum")
    root = N - 1
    got = comm.reduce(to_device(inputs[RANK]), root=root)
    if RANK == root:
        assert_same(on_host(got), numpy_reduce("sum", inputs), "reduce")
    else:
        assert got is None
    assert_same(on_host(comm.scan(to_device(inputs[RANK]))), numpy_reduce("sum", inputs[: RANK + 1]), "scan")
    got = comm.exscan(to_device(inputs[RANK]))
    if RANK == 0:
        assert got is None
    else:
        assert_same(on_host(got), numpy_reduce("sum", inputs[:RANK]), "exscan")
    blocks = all_inputs(8, N, (2 * N, 2), np.float32)
    got = comm.alltoall(to_device(blocks[RANK]))
    expected = np.concatenate([np.array_split(blocks[source], N)[RANK] for source in range(N)])
    assert_same(on_host(got), expected, "alltoall")


@pytest.mark.mpi
def test_a_strided_out_takes_the_device_path_and_is_right(on_route):
    comm, _, _ = on_route
    inputs = all_inputs(9, N, (N + 2, 5), np.float32)
    out = to_device(np.full((N + 2, 10), np.nan, np.float32))[:, ::2]
    assert comm.allreduce(to_device(inputs[RANK]), out=out) is out
    assert_same(np.asarray(out), numpy_reduce("sum", inputs), "strided out=")


# ---------------------------------------------------------------- serial: the route's own rules


def test_limit_from_environment(monkeypatch):
    monkeypatch.delenv(HOST_BYTES_ENV, raising=False)
    assert host_bytes_from_env() == DEFAULT_HOST_BYTES
    monkeypatch.setenv(HOST_BYTES_ENV, "0")
    assert host_bytes_from_env() == 0
    monkeypatch.setenv(HOST_BYTES_ENV, "1024")
    assert host_bytes_from_env() == 1024
    for bad in ("-1", "4K", "x"):
        monkeypatch.setenv(HOST_BYTES_ENV, bad)
        with pytest.raises(ArgumentError, match=HOST_BYTES_ENV):
            host_bytes_from_env()


def test_a_zero_limit_turns_the_route_off():
    assert staged_backend([], host_bytes=0).host_bytes == 0
    assert staged_backend([], host_bytes=64).host_bytes == 64


def test_a_raising_call_never_hands_its_twins_out_again():
    backend = staged_backend([], delay=1, host_bytes=LIMIT)
    route: HostRoute = backend._host_route
    x = to_device(np.arange(4.0))
    seen = []

    def fail(host_x, host_out):
        seen.append(host_x)
        raise TimeoutError("a peer never came")

    with pytest.raises(TimeoutError):
        route.run(x, None, fail)
    got = route.run(x, None, lambda host_x, host_out: seen.append(host_x) or host_x * 2)
    assert seen[1] is not seen[0], "the failed call's twin may still be in MPI's hands"
    assert_same(on_host(got), np.arange(4.0) * 2, "the next call")


def test_an_out_twin_is_reused_only_once_its_copy_to_the_device_finished():
    backend = staged_backend([], delay=5, host_bytes=LIMIT)
    route: HostRoute = backend._host_route
    x, out = to_device(np.arange(8, dtype=np.int32)), to_device(np.zeros(8, np.int32))

    def add_one(host_x, host_out):
        np.add(host_x, 1, out=host_out)
        return host_out

    assert route.run(x, out, add_one) is out
    fence = route._twins[("out", (8,), np.dtype(np.int32))][1]
    assert fence is not None and not fence.done
    route.run(x, out, add_one)
    assert fence.done, "the second call wrote the twin before the first copy out of it finished"
    assert_same(on_host(out), np.arange(8, dtype=np.int32) + 1, "result")
