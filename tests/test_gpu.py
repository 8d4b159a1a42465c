"""Every collective on CuPy device buffers, on a real GPU: the core matrix of test_collectives
(ops x dtypes x lengths x roots, out=, in place, strided) against NumPy oracles, on each path:
"ipc" (MPIRING_GPU_IPC=1: the ranks of a test run share one node), "mpi" (IPC off: direct where the
MPI is CUDA-aware, else staged) and "staged" (IPC off and MPIRING_CUDA_AWARE=0).

Skips, with the reason, where CuPy is missing or finds no GPU (CI, the project's machines).
On a GPU machine:  python tests/run_world_sizes.py --sizes 1 2 4 -- tests/test_gpu.py
Ranks share GPUs round robin (mpiring.bind_device), so one GPU serves every world size.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI
from oracles import DTYPES, OPS, all_inputs, assert_same, numpy_reduce, op_valid, rank_input

import mpiring

pytestmark = pytest.mark.mpi

try:
    import cupy
except ImportError as error:  # not installed, or installed for another CUDA
    pytest.skip(f"CuPy is not importable ({error}); pip install 'mpiring[gpu]' for the GPU tests",
                allow_module_level=True)
if not cupy.is_available():
    pytest.skip("CuPy finds no usable CUDA GPU here (cupy.is_available() is False)", allow_module_level=True)

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
DEVICE = mpiring.bind_device(WORLD)  # collective: every rank imports this module
BIG = 70_001
SEGMENTED = (1 << 22) + 3  # float32: four 4 MiB staging segments and a ragged last one
LENGTHS = sorted({0, 1, N + 1, 37, BIG})
ROOTS = sorted({0, N - 1, N // 2})
OP_CASES = [(d, op) for d in DTYPES for op in OPS if op_valid(op, d)]


@pytest.fixture(params=["ipc", "mpi", "staged"])
def path(request, monkeypatch):
    """"ipc": CUDA IPC; "mpi": what cuda_aware() allows; "staged": through pinned host memory."""
    monkeypatch.setenv("MPIRING_GPU_IPC", "1" if request.param == "ipc" else "0")
    if request.param == "staged":
        monkeypatch.setenv("MPIRING_CUDA_AWARE", "0")
    return request.param


@pytest.fixture(scope="module")
def gcomm():
    # A stalled step raises CollectiveTimeout naming the step and the peer instead of hanging;
    # 120 s is far above any test's need.
    comm = mpiring.Communicator(timeout=120)
    yield comm
    comm.free()


def dev(a):
    return cupy.asarray(a)


def host(x, what: str = "result"):
    """A collective's result, checked to be a CuPy array on this rank's GPU, as NumPy."""
    assert isinstance(x, cupy.ndarray), f"{what}: got {type(x).__name__}, not a CuPy array"
    assert x.device.id == DEVICE, f"{what}: on GPU {x.device.id}, expected GPU {DEVICE}"
    return cupy.asnumpy(x)


def _case_id(case) -> str:
    return f"{case[0].name}-{case[1]}"


def test_ranks_are_bound_round_robin():
    from mpiring.gpu.binding import node_local_rank

    local_rank, _ = node_local_rank(WORLD)
    assert DEVICE == local_rank % cupy.cuda.runtime.getDeviceCount()
    assert cupy.cuda.Device().id == DEVICE


@pytest.mark.parametrize("case", OP_CASES, ids=_case_id)
def test_allreduce(gcomm, path, case):
    dtype, op = case
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, dtype, op)
        got = gcomm.allreduce(dev(inputs[RANK]), op=op)
        assert_same(host(got), numpy_reduce(op, inputs), f"{path} allreduce {op} {dtype} len {length}")


@pytest.mark.parametrize("case", OP_CASES, ids=_case_id)
def test_reduce(gcomm, path, case):
    dtype, op = case
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, dtype, op)
        for root in ROOTS:
            got = gcomm.reduce(dev(inputs[RANK]), op=op, root=root)
            if RANK == root:
                assert_same(host(got), numpy_reduce(op, inputs), f"{path} reduce {op} {dtype} len {length}")
            else:
                assert got is None


@pytest.mark.parametrize("case", OP_CASES, ids=_case_id)
def test_reduce_scatter(gcomm, path, case):
    dtype, op = case
    for seed, rows in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, (rows, 2), dtype, op)
        got = gcomm.reduce_scatter(dev(inputs[RANK]), op=op)
        want = np.array_split(numpy_reduce(op, inputs), N)[RANK]
        assert_same(host(got), want, f"{path} reduce_scatter {op} {dtype} rows {rows}")


def _rows_of(rank: int, seed: int) -> int:
    return (3 * rank + seed) % 5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allgather_and_gather(gcomm, path, dtype):
    for seed in range(3):
        blocks = [rank_input(seed, k, (_rows_of(k, seed), 3), dtype) for k in range(N)]
        assert_same(host(gcomm.allgather(dev(blocks[RANK]))), np.concatenate(blocks), f"{path} allgather {dtype}")
        for root in ROOTS:
            got = gcomm.gather(dev(blocks[RANK]), root=root)
            if RANK == root:
                assert_same(host(got), np.concatenate(blocks), f"{path} gather {dtype} root {root}")
    big = [rank_input(9, k, BIG + k, dtype) for k in range(N)]
    assert_same(host(gcomm.allgather(dev(big[RANK]))), np.concatenate(big), f"{path} allgather {dtype} large")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scatter_and_broadcast(gcomm, path, dtype):
    for seed, rows in enumerate(LENGTHS):
        for root in ROOTS:
            full = rank_input(seed, root, (rows, 3), dtype)
            part = np.array_split(full, N)[RANK]
            out = dev(np.zeros_like(part))  # non-roots name the device through out=
            got = gcomm.scatter(dev(full) if RANK == root else None, root=root, out=out)
            assert got is out
            assert_same(host(got), part, f"{path} scatter {dtype} rows {rows} root {root}")
            mine = dev(full if RANK == root else np.zeros_like(full))
            assert_same(host(gcomm.broadcast(mine, root=root)), full, f"{path} broadcast {dtype} rows {rows}")


def test_segmented_messages(gcomm, path):
    """Messages of several staging segments, with a ragged last one, in every collective."""
    inputs = all_inputs(5, N, SEGMENTED, np.float32)
    assert_same(host(gcomm.allreduce(dev(inputs[RANK]))), numpy_reduce("sum", inputs), f"{path} allreduce 16 MiB")
    root = N - 1
    got = gcomm.broadcast(dev(inputs[root]) if RANK == root else dev(np.zeros_like(inputs[root])), root=root)
    assert_same(host(got), inputs[root], f"{path} broadcast 16 MiB")
    assert_same(host(gcomm.allgather(dev(inputs[RANK][: SEGMENTED // N]))),
                np.concatenate([a[: SEGMENTED // N] for a in inputs]), f"{path} allgather")


def test_out_in_place_and_strided(gcomm, path):
    inputs = all_inputs(5, N, (N + 3, 2), np.float64)
    total = numpy_reduce("sum", inputs)
    out = dev(np.full_like(inputs[RANK], np.nan))
    assert gcomm.allreduce(dev(inputs[RANK]), out=out) is out
    assert_same(host(out), total, f"{path} allreduce out=")
    x = dev(inputs[RANK])
    assert gcomm.allreduce(x, out=x) is x
    assert_same(host(x), total, f"{path} allreduce in place")
    strided = dev(np.full((N + 3, 4), np.nan))[:, ::2]
    assert gcomm.allreduce(dev(inputs[RANK]), out=strided) is strided
    assert_same(host(strided), total, f"{path} allreduce strided out=")
    arrays = all_inputs(11, N, (40, 6), np.float32)
    source = dev(arrays[RANK])[::2, 1:]  # a strided device input
    assert not source.flags.c_contiguous
    assert_same(host(gcomm.allreduce(source)), numpy_reduce("sum", [a[::2, 1:] for a in arrays]), f"{path} strided x")
    part = np.array_split(total, N)[RANK]
    out = dev(np.full_like(part, np.nan))
    assert gcomm.reduce_scatter(dev(inputs[RANK]), out=out) is out
    assert_same(host(out), part, f"{path} reduce_scatter out=")


def test_stream_ordering(gcomm, path):
    """Data written by kernels queued just before the call is what travels, on the default stream
    and on a stream the caller made current; later kernels see the received data."""
    n = 1 << 22
    for stream in (None, cupy.cuda.Stream(non_blocking=True)):
        with stream if stream is not None else cupy.cuda.Stream.null:
            x = cupy.full(n, RANK + 1, dtype=cupy.float32)
            for _ in range(30):  # a long queue of kernels ahead of the collective
                x = x * 1.0
            got = gcomm.allreduce(x)
            doubled = got * 2  # queued after the collective on the same stream
            want = float(N * (N + 1) // 2)
            assert float(doubled[0]) == 2 * want and float(doubled[-1]) == 2 * want
            assert bool((got == want).all())


def test_repeated_calls_on_the_same_buffers(gcomm, path):
    """The same device buffers call after call, new contents written by kernels queued just before
    each call: on the direct and staged paths the calls after the first replay a plan (the staged
    one copies through its own pinned blocks); every path gives the right sums each time."""
    from mpiring.gpu import device_backend

    x = cupy.empty(1 << 20, dtype=cupy.float32)
    out = cupy.empty_like(x)
    for call in range(4):
        x.fill(RANK + call)
        for _ in range(20):  # a queue of kernels ahead of the collective
            x *= 1.0
        assert gcomm.allreduce(x, out=out) is out
        doubled = out * 2  # queued after the collective on the same stream
        want = float(sum(rank + call for rank in range(N)))
        assert bool((doubled == 2 * want).all()), f"{path} call {call}"
    planned = gcomm.plan_of("allreduce", x, out) is not None
    assert planned == device_backend(x).plannable, f"{path}: planned {planned}"


def test_small_calls_on_host_copies(gcomm, path):
    """A small call on the staged or IPC path runs on pinned host copies (mpiring.gpu.host_route):
    it reads what kernels queued just before it wrote, on the default stream and on a stream the
    caller made current, later kernels see its result, and a repeated call replays a host plan."""
    from mpiring.gpu import device_backend

    for stream in (None, cupy.cuda.Stream(non_blocking=True)):
        with stream if stream is not None else cupy.cuda.Stream.null:
            x = cupy.empty(1000, dtype=cupy.float32)
            out = cupy.empty_like(x)
            for call in range(4):
                x.fill(RANK + call)
                for _ in range(20):  # a queue of kernels ahead of the collective
                    x *= 1.0
                assert gcomm.allreduce(x, out=out) is out
                doubled = out * 2  # queued after the collective on the same stream
                want = float(sum(rank + call for rank in range(N)))
                assert bool((doubled == 2 * want).all()), f"{path} call {call}"
    backend = device_backend(x)
    if backend.path == "direct":
        assert backend.host_bytes == 0
    if backend.host_bytes < x.nbytes:  # direct, or the route turned off (MPIRING_GPU_HOST_BYTES=0)
        return
    twins = backend._host_route._twins
    host_x, host_out = (twins[(role, (1000,), np.dtype(np.float32))][0] for role in ("x", "out"))
    assert gcomm.plan_of("allreduce", host_x, host_out) is not None


def test_nonblocking(gcomm, path):
    inputs = all_inputs(3, N, 5000, np.float32)
    requests = [gcomm.iallreduce(dev(inputs[RANK]), op=op) for op in ("sum", "max")]
    assert_same(host(requests[1].wait()), numpy_reduce("max", inputs), f"{path} iallreduce max")
    assert_same(host(requests[0].wait()), numpy_reduce("sum", inputs), f"{path} iallreduce sum")


@pytest.mark.parametrize("ipc", ["1", "0"])
def test_pools_reach_a_steady_state(gcomm, monkeypatch, ipc):
    """Pinned (staged) and device (IPC) blocks are reused: after a warm-up, calls allocate nothing.

    How many blocks a warm ring needs depends on how the ranks' steps interleave (a block comes back
    when its copies or its receiver's acknowledgement are done), so warm-up ends when 5 calls in a
    row allocated nothing on every rank; it must end within 40 calls.

    The ranks decide together when to stop. Each rank stopping on its own count would leave some
    ranks in one more allreduce than the others, waiting for peers that had moved on.
    MPIRING_GPU_TEST_REPORT (a file) gets one line per run with the call after which each rank
    alone would have stopped.
    """
    monkeypatch.setenv("MPIRING_CUDA_AWARE", "0")
    monkeypatch.setenv("MPIRING_GPU_IPC", ipc)
    from mpiring.gpu import device_backend

    x = dev(rank_input(2, RANK, 3 << 20, np.float32))
    backend = device_backend(x)
    assert backend.path == ("ipc" if ipc == "1" else "staged")
    want = numpy_reduce("sum", all_inputs(2, N, 3 << 20, np.float32))
    quiet = calls = 0
    alone = None  # the call after which this rank's own count would have stopped it
    while calls < 40:
        before = backend.pool.allocations
        assert_same(host(gcomm.allreduce(x)), want, "reuse")
        calls += 1
        quiet = quiet + 1 if backend.pool.allocations == before else 0
        if quiet >= 5 and alone is None:
            alone = calls
        if WORLD.allreduce(quiet >= 5, op=MPI.LAND):  # every rank makes the same calls
            break
    stopped = WORLD.gather(alone, root=0)
    report = os.environ.get("MPIRING_GPU_TEST_REPORT")
    if report and RANK == 0:
        with open(report, "a") as file:
            file.write(f"pools ipc={ipc} ranks={N}: each rank alone would stop after {stopped} calls, "
                       f"all stopped after {calls}\n")
    assert quiet >= 5, f"still allocating after 40 calls ({backend.pool.allocations} blocks)"


def test_direct_path_matches_native_mpi(gcomm, monkeypatch):
    monkeypatch.delenv("MPIRING_CUDA_AWARE", raising=False)
    monkeypatch.setenv("MPIRING_GPU_IPC", "0")
    if not mpiring.cuda_aware():
        pytest.skip(f"MPI is not CUDA-aware ({mpiring.cuda_awareness().how}): no direct path here")
    x = dev(rank_input(4, RANK, BIG, np.float64))
    native = cupy.empty_like(x)
    cupy.cuda.get_current_stream().synchronize()
    WORLD.Allreduce(x, native, MPI.SUM)
    assert_same(host(gcomm.allreduce(x)), cupy.asnumpy(native), "direct allreduce vs native")
