"""Arrays of other libraries through every collective (mpiring.interop): torch tensors where torch
is installed, and everywhere a minimal DLPack exporter (`DLPackOnly`, tests/exporters.py) that is neither NumPy
nor CuPy. Results are checked against NumPy on regenerated inputs; zero-copy by addresses
(data_ptr() against the view's); planning by the plan the engine keeps. World sizes 1-4."""

from __future__ import annotations

import numpy as np
import pytest
from exporters import DLPackOnly
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce, rank_input

import mpiring
from mpiring import interop

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N, RANK = WORLD.Get_size(), WORLD.Get_rank()

try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install 'mpiring[torch]')")

# every dtype a torch tensor and mpiring share (bfloat16: see test_bfloat16_refused_with_a_way_out)
TORCH_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"]


@pytest.fixture(scope="module")
def comm():
    with mpiring.Communicator() as c:
        yield c


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def tensor_of(array: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(array).copy())


@needs_torch
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_allreduce_of_tensors_every_dtype(comm, dtype):
    op = "sum" if dtype != "bool" else "bor"
    mine = tensor_of(rank_input(1, RANK, (3, 5), dtype))
    want = numpy_reduce("bor" if dtype == "bool" else "sum", all_inputs(1, N, (3, 5), dtype))
    got = comm.allreduce(mine, op=op)
    assert isinstance(got, torch.Tensor)
    assert_same(got.numpy(), want, f"allreduce {dtype}")
    out = torch.empty_like(mine)
    before = out.data_ptr()
    assert comm.allreduce(mine, op=op, out=out) is out  # written in place, returned as given
    assert out.data_ptr() == before
    assert_same(out.numpy(), want, f"allreduce out= {dtype}")
    assert_same(mine.numpy(), rank_input(1, RANK, (3, 5), dtype), "input untouched")


@needs_torch
def test_views_share_the_tensors_memory(comm):
    t = torch.arange(12.0).reshape(3, 4)
    x, out = interop.convert("allreduce", t, t)
    assert address(x) == t.data_ptr() and x is out  # no copy: the collective reads and writes t's memory
    strided = t[:, ::2]
    assert address(interop.native("allreduce", "x", strided)) == strided.data_ptr()
    result = comm.allreduce(strided)  # a strided input, read in place
    assert_same(result.numpy(), strided.numpy() * N, "strided")
    mpiring_result = np.arange(4.0)
    back = interop.as_kind(mpiring_result, t)  # the result as a tensor over mpiring's memory
    assert isinstance(back, torch.Tensor) and back.data_ptr() == address(mpiring_result)


@needs_torch
def test_every_collective_on_tensors(comm):
    rows = 2 * N
    x = rank_input(2, RANK, (rows, 3), "float64")
    inputs = all_inputs(2, N, (rows, 3), "float64")
    t = tensor_of(x)
    assert_same(comm.broadcast(t, root=N - 1).numpy(), inputs[N - 1], "broadcast")
    reduced = comm.reduce(t, root=0)
    if RANK == 0:
        assert_same(reduced.numpy(), numpy_reduce("sum", inputs), "reduce")
    else:
        assert reduced is None
    assert_same(comm.allgather(t).numpy(), np.concatenate(inputs), "allgather")
    gathered = comm.gather(t, root=0)
    assert (gathered is None) == (RANK != 0)
    if RANK == 0:
        assert_same(gathered.numpy(), np.concatenate(inputs), "gather")
    part = comm.scatter(t if RANK == 0 else None, root=0, out=torch.empty(2, 3, dtype=torch.float64))
    assert_same(part.numpy(), inputs[0][2 * RANK : 2 * RANK + 2], "scatter")
    total = numpy_reduce("sum", inputs)
    assert_same(comm.reduce_scatter(t).numpy(), total[2 * RANK : 2 * RANK + 2], "reduce_scatter")
    want = np.concatenate([inputs[k][2 * RANK : 2 * RANK + 2] for k in range(N)])
    assert_same(comm.alltoall(t).numpy(), want, "alltoall")
    assert_same(comm.alltoallv(t, [2] * N, [2] * N).numpy(), want, "alltoallv")
    assert_same(comm.scan(t).numpy(), numpy_reduce("sum", inputs[: RANK + 1]), "scan")
    ex = comm.exscan(t)
    assert ex is None if RANK == 0 else np.array_equal(ex.numpy(), numpy_reduce("sum", inputs[:RANK]))


@needs_torch
def test_nonblocking_and_persistent_give_tensors(comm):
    t = tensor_of(rank_input(3, RANK, (4,), "float32"))
    want = numpy_reduce("max", all_inputs(3, N, (4,), "float32"))
    request = comm.iallreduce(t, op="max")
    got = request.wait()
    assert isinstance(got, torch.Tensor) and request.test()
    assert_same(got.numpy(), want, "iallreduce")
    out = torch.zeros(4)
    persistent = comm.allreduce_init(t, op="max", out=out)
    for _ in range(2):
        persistent.start()
        assert persistent.wait() is out
        assert_same(out.numpy(), want, "allreduce_init")
    persistent.free()


@needs_torch
def test_the_same_tensor_twice_is_planned(comm):
    t = torch.ones(6)
    out = torch.empty(6)
    for _ in range(3):
        comm.allreduce(t, out=out)
    x, o = interop.convert("allreduce", t, out)  # new views: the engine knows the call by their layout
    assert comm.plan_of("allreduce", x, o) is not None
    assert_same(out.numpy(), np.full(6, float(N), np.float32), "planned")


@needs_torch
def test_refusals_are_clear_and_leave_the_communicator_usable(comm):
    with pytest.raises(mpiring.ArgumentError, match="detach"):
        comm.allreduce(torch.ones(3, requires_grad=True))
    with pytest.raises(mpiring.ArgumentError, match="out.*shape"):
        comm.allreduce(torch.ones(3), out=torch.empty(4))
    assert_same(comm.allreduce(torch.ones(3)).numpy(), np.full(3, float(N), np.float32), "after refusals")


@needs_torch
def test_bfloat16_refused_with_a_way_out(comm):
    with pytest.raises(mpiring.ArgumentTypeError, match="bfloat16"):
        comm.allreduce(torch.ones(2, dtype=torch.bfloat16))


def test_any_dlpack_exporter(comm):
    x = rank_input(4, RANK, (5,), "int32")
    want = numpy_reduce("sum", all_inputs(4, N, (5,), "int32"))
    out = np.zeros(5, np.int32)
    assert comm.allreduce(DLPackOnly(x), out=DLPackOnly(out)) is not None
    assert_same(out, want, "exported out=")
    got = comm.allreduce(DLPackOnly(x))  # a library without from_dlpack gets NumPy's array
    assert_same(got, want, "exported x")


def test_read_only_export_refused_as_out(comm):
    frozen = np.zeros(5, np.int32)
    frozen.setflags(write=False)  # as JAX exports its arrays
    with pytest.raises(mpiring.ArgumentError, match="read-only"):
        comm.allreduce(np.ones(5, np.int32), out=DLPackOnly(frozen))
    assert_same(comm.allreduce(DLPackOnly(frozen)), np.zeros(5, np.int32), "read-only input is fine")


def test_dropin_takes_foreign_buffers(comm):
    x = rank_input(5, RANK, (6,), "float64")
    want = np.empty(6)
    WORLD.Allreduce(x, want)
    got = np.zeros(6)
    comm.Allreduce(DLPackOnly(x), DLPackOnly(got))
    assert_same(got, want, "Allreduce")
    if torch is not None:
        t = torch.zeros(6, dtype=torch.float64)
        comm.Allreduce(tensor_of(x), t)
        assert_same(t.numpy(), want, "Allreduce torch")
        every = torch.zeros(6 * N, dtype=torch.float64)
        comm.Allgather(tensor_of(x), every)
        assert_same(every.numpy(), np.concatenate(all_inputs(5, N, (6,), "float64")), "Allgather torch")


@needs_torch
def test_nonblocking_calls_keep_the_memory_alive(comm):
    t = torch.ones(4)
    request = comm.iallreduce(t, out=t)
    x, out = request._request.arrays  # what the engine holds while the call is in flight
    assert x is out and address(x) == t.data_ptr()
    assert x.base is not None  # DLPack's view: its capsule keeps the tensor's memory alive
    del t
    assert_same(request.wait().numpy(), np.full(4, float(N), np.float32), "after the caller let go")
