"""The device path's logic, tested without a GPU: CUDA-awareness detection and its environment
override, which backend and path a device array gets, that an MPI which is not CUDA-aware never
receives a device buffer, stream synchronization on the direct path, the staged pipeline's
ordering, and the pinned pool's reuse.

Device memory is faked (tests/fake_device.py): host arrays posing as device arrays, and a copy
engine whose copies really are late, so a pipeline that skips a wait produces wrong data.
Serial tests drive the transport over COMM_SELF (a rank sending to itself); the MPI-marked ones
run whole collectives on fake device arrays at every world size.
"""

from __future__ import annotations

import ctypes
import importlib
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from fake_device import (
    FakeEngine,
    RecordingComm,
    check_collectives_on_fake_device,
    direct_backend,
    on_host,
    route_to,
    staged_backend,
    to_device,
)
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce, rank_input

import mpiring
import mpiring.gpu
from mpiring.backend import NUMPY, backend_for, is_device_array
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Call
from mpiring.engine.waiting import complete, is_complete
from mpiring.errors import ArgumentError, CollectiveTimeout, CommunicationError
from mpiring.gpu.staging import (
    DEFAULT_SEGMENT_BYTES,
    MIN_BLOCK_BYTES,
    SEGMENT_ENV,
    PinnedPool,
    segment_bounds,
    segment_bytes_from_env,
)

# fetch the module itself (mpiring.cuda_aware is the exported function)
cuda_aware_module = importlib.import_module("mpiring.cuda_detection")


# ---------------------------------------------------------------- CUDA-awareness detection


@pytest.mark.parametrize(
    ("text", "want"),
    [(None, None), ("", None), ("  ", None), ("0", False), ("1", True), ("true", True), ("FALSE", False),
     (" yes ", True), ("no", False), ("on", True), ("off", False)],
)
def test_override_parsing(text, want):
    assert cuda_aware_module.parse_override(text) is want


@pytest.mark.parametrize("text", ["2", "maybe", "cuda", "-1"])
def test_override_rejects_anything_else(text):
    with pytest.raises(ArgumentError, match="MPIRING_CUDA_AWARE"):
        cuda_aware_module.parse_override(text)


@pytest.fixture
def no_library(monkeypatch):
    """Fail if the MPI library is asked: the environment must decide on its own."""
    def refuse():
        raise AssertionError("the library was asked although the environment decides")

    monkeypatch.setattr(cuda_aware_module, "_library_answer", None)
    monkeypatch.setattr(cuda_aware_module, "_ask_loaded_library", refuse)


@pytest.mark.parametrize(("value", "aware"), [("0", False), ("1", True), ("off", False)])
def test_environment_decides_first(monkeypatch, no_library, value, aware):
    monkeypatch.setenv("MPIRING_CUDA_AWARE", value)
    answer = mpiring.cuda_awareness()
    assert answer.aware is aware and mpiring.cuda_aware() is aware
    assert "MPIRING_CUDA_AWARE" in answer.how and "environment" in answer.how


def test_the_loaded_mpi_answers_here(monkeypatch):
    """The PyPI MPICH and Open MPI wheels are built without CUDA: both say no, and how."""
    monkeypatch.delenv("MPIRING_CUDA_AWARE", raising=False)
    monkeypatch.setattr(cuda_aware_module, "_library_answer", None)
    answer = mpiring.cuda_awareness()
    assert answer.aware is False
    assert "MPIX_GPU_query_support" in answer.how or "MPIX_Query_cuda_support" in answer.how, answer.how
    assert mpiring.cuda_awareness() is answer  # asked once, then remembered


def test_loaded_library_handles_export_a_query():
    handles = cuda_aware_module.loaded_mpi_handles()
    assert any(hasattr(h, "MPIX_GPU_query_support") or hasattr(h, "MPIX_Query_cuda_support") for h in handles)


def test_mapped_libraries_without_proc():
    assert cuda_aware_module.mapped_libraries("/nonexistent/maps") == []


def _gpu_query(flag: int, code: int = 0):
    calls = []

    def query(kind, pointer):
        calls.append(kind)
        pointer.contents.value = flag
        return code

    query.calls = calls
    return query


def _asserting_query():
    def query():
        raise AssertionError("MPIX_Query_cuda_support called on an MPICH: an old one would abort here")

    return query


def test_open_mpi_is_asked_its_own_query():
    for value, aware in ((1, True), (0, False)):
        handle = SimpleNamespace(MPIX_Query_cuda_support=lambda value=value: value)
        answer = cuda_aware_module.query_library("Open MPI 5.0.11", [handle])
        assert answer.aware is aware and "MPIX_Query_cuda_support() returned" in answer.how


def test_open_mpi_prefers_its_query_over_the_mpich_one():
    gpu = _gpu_query(0)
    handle = SimpleNamespace(MPIX_Query_cuda_support=lambda: 1, MPIX_GPU_query_support=gpu)
    assert cuda_aware_module.query_library("Open MPI 5.0.11", [handle]).aware is True
    assert gpu.calls == []


def test_mpich_is_asked_gpu_query_support_for_cuda():
    for flag, aware in ((1, True), (0, False)):
        query = _gpu_query(flag)
        # a modern MPICH has both symbols; MPIX_Query_cuda_support must stay untouched
        handle = SimpleNamespace(MPIX_GPU_query_support=query, MPIX_Query_cuda_support=_asserting_query())
        answer = cuda_aware_module.query_library("MPICH 4.2.0", [handle])
        assert answer.aware is aware
        assert query.calls == [cuda_aware_module.MPIX_GPU_SUPPORT_CUDA] == [0]


def test_a_failing_gpu_query_means_not_aware():
    answer = cuda_aware_module.query_library("MPICH 4.1", [SimpleNamespace(MPIX_GPU_query_support=_gpu_query(1, 3))])
    assert answer.aware is False and "error 3" in answer.how


def test_old_mpich_query_that_asserts_is_never_called():
    handle = SimpleNamespace(MPIX_Query_cuda_support=_asserting_query())
    answer = cuda_aware_module.query_library("MPICH 3.4.3", [handle])
    assert answer.aware is False and "MPIRING_CUDA_AWARE=1" in answer.how


def test_library_without_any_query():
    answer = cuda_aware_module.query_library("Intel MPI 2021", [SimpleNamespace(), object()])
    assert answer.aware is False and "no CUDA-awareness query" in answer.how


def test_first_handle_with_a_query_answers():
    first, second = _gpu_query(1), _gpu_query(0)
    handles = [SimpleNamespace(), SimpleNamespace(MPIX_GPU_query_support=first),
               SimpleNamespace(MPIX_GPU_query_support=second)]
    assert cuda_aware_module.query_library("MPICH 5.0.2", iter(handles)).aware is True
    assert second.calls == []


def test_ctypes_signature_declared_on_real_functions():
    """On a real library the functions get a C signature (flag passed as int*)."""
    handles = [h for h in cuda_aware_module.loaded_mpi_handles() if hasattr(h, "MPIX_GPU_query_support")]
    if not handles or "Open MPI" in MPI.Get_library_version():
        pytest.skip("needs an MPICH-family library")
    function = cuda_aware_module._function(handles[0], "MPIX_GPU_query_support",
                                           [ctypes.c_int, ctypes.POINTER(ctypes.c_int)])
    assert function.restype is ctypes.c_int and len(function.argtypes) == 2


# ---------------------------------------------------------------- which backend and path


class _CupyLike:
    """Looks like a CuPy array to the dispatcher (module name and CUDA Array Interface)."""

    __cuda_array_interface__ = {}

    def __init__(self, device_id: int = 0) -> None:
        self.device = SimpleNamespace(id=device_id)


_CupyLike.__module__ = "cupy._core.core"


def test_host_arrays_go_to_numpy():
    assert backend_for(np.zeros(3)) is NUMPY
    assert backend_for([1, 2]) is NUMPY
    assert backend_for(np.float64(2.0)) is NUMPY
    assert backend_for(np.zeros(3).view(np.matrix)) is NUMPY  # a subclass, still host memory
    assert backend_for(to_device([1.0])) is NUMPY  # a host subclass without CUDA Array Interface
    assert not is_device_array(np.zeros(2))


def test_device_arrays_are_recognised_without_cupy(monkeypatch):
    seen = []
    assert mpiring.backend._device_backend is mpiring.gpu.device_backend  # registered by mpiring/__init__.py
    monkeypatch.setattr(mpiring.backend, "_device_backend", lambda x: seen.append(x) or "device")
    x = _CupyLike()
    assert is_device_array(x) and backend_for(x) == "device" and seen == [x]


def test_host_only_use_never_imports_cupy():
    code = ("import sys, numpy, mpiring; c = mpiring.Communicator(); c.allreduce(numpy.ones(3)); "
            "c.broadcast(numpy.ones(2)); assert 'cupy' not in sys.modules, 'cupy was imported'; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@pytest.fixture
def fake_backends(monkeypatch):
    """device_backend with backend construction replaced (no CuPy, no GPU), its cache emptied."""
    made = []

    def make(device_id, path):
        log = []
        backend = direct_backend(log) if path == "direct" else staged_backend(log)
        made.append((device_id, path))
        return backend

    monkeypatch.setattr(mpiring.gpu, "_backends", {})
    monkeypatch.setattr(mpiring.gpu, "_make_backend", make)
    monkeypatch.setenv("MPIRING_GPU_IPC", "0")  # these tests are about the MPI path; IPC has its own
    return made


@pytest.mark.parametrize(("value", "path"), [("0", "staged"), ("1", "direct")])
def test_path_follows_cuda_awareness(monkeypatch, fake_backends, value, path):
    monkeypatch.setenv("MPIRING_CUDA_AWARE", value)
    backend = mpiring.gpu.device_backend(_CupyLike(device_id=1))
    assert backend.path == path and backend.staged is (path == "staged")
    assert mpiring.gpu.device_backend(_CupyLike(device_id=1)) is backend  # made once, kept
    assert fake_backends == [(1, path)]


def test_without_override_a_non_cuda_aware_mpi_gets_the_staged_path(monkeypatch, fake_backends):
    monkeypatch.delenv("MPIRING_CUDA_AWARE", raising=False)
    assert mpiring.gpu.device_backend(_CupyLike()).path == "staged"


def test_debug_says_the_path_once(monkeypatch, fake_backends, capsys):
    monkeypatch.setenv("MPIRING_DEBUG", "1")
    monkeypatch.setenv("MPIRING_CUDA_AWARE", "0")
    for _ in range(3):
        mpiring.gpu.device_backend(_CupyLike())
    err = capsys.readouterr().err
    assert err.count("take the staged path") == 1, err
    assert "MPIRING_CUDA_AWARE=0" in err


def test_path_for():
    assert mpiring.gpu.path_for(cuda_aware_module.CudaAwareness(True, "x")) == "direct"
    assert mpiring.gpu.path_for(cuda_aware_module.CudaAwareness(False, "x")) == "staged"


# ---------------------------------------------------------------- segments and the pinned pool


def test_segment_bounds():
    assert segment_bounds(0, 64) == [0, 0]  # an empty message is still one message
    assert segment_bounds(1, 64) == [0, 1]
    assert segment_bounds(64, 64) == [0, 64]
    assert segment_bounds(65, 64) == [0, 64, 65]
    assert segment_bounds(200, 64) == [0, 64, 128, 192, 200]


def test_segment_size_from_environment(monkeypatch):
    monkeypatch.delenv(SEGMENT_ENV, raising=False)
    assert segment_bytes_from_env() == DEFAULT_SEGMENT_BYTES
    monkeypatch.setenv(SEGMENT_ENV, "4096")
    assert segment_bytes_from_env() == 4096
    for bad in ("0", "-5", "1MiB"):
        monkeypatch.setenv(SEGMENT_ENV, bad)
        with pytest.raises(ArgumentError, match=SEGMENT_ENV):
            segment_bytes_from_env()


def test_pool_reuses_blocks_and_respects_fences():
    engine = FakeEngine([], delay=1)
    pool = PinnedPool(engine.pinned, engine.done)
    a = pool.acquire(1000)
    assert a.nbytes == MIN_BLOCK_BYTES and pool.allocations == 1
    pool.release(a)
    assert pool.acquire(5000) is a and pool.allocations == 1  # same size class: reused
    big = pool.acquire(MIN_BLOCK_BYTES + 1)
    assert big.nbytes == 2 * MIN_BLOCK_BYTES and pool.allocations == 2
    fence = engine.to_host(np.empty(0, np.uint8), np.empty(0, np.uint8), 0)  # done after one poll
    pool.release(a, fence)
    b = pool.acquire(10)  # a's copies may still be running: a different block
    assert b is not a and pool.allocations == 3
    pool.release(b)
    assert pool.acquire(10) is a  # the fence is done by now
    assert pool.acquire(10) is b
    assert pool.held_bytes == 4 * MIN_BLOCK_BYTES


def test_pool_drops_idle_blocks_beyond_its_limit():
    engine = FakeEngine([], delay=0)
    pool = PinnedPool(engine.pinned, engine.done, limit_bytes=2 * MIN_BLOCK_BYTES)
    blocks = [pool.acquire(10) for _ in range(2)]
    for block in blocks:
        pool.release(block)
    pool.acquire(4 * MIN_BLOCK_BYTES)  # over the limit: the idle small blocks go first
    assert pool.idle_blocks() == 0 and pool.held_bytes == 4 * MIN_BLOCK_BYTES


# ---------------------------------------------------------------- the transport, over COMM_SELF


@pytest.fixture
def self_ring():
    """A ring of one rank that sends to itself through a RecordingComm; and the shared log."""
    log: list = []
    comm = MPI.COMM_SELF.Dup()
    ring = Ring(comm)
    ring.comm = RecordingComm(comm, log)
    yield ring, log
    comm.Free()


def _call(collective: str = "allreduce", timeout: float | None = None) -> Call:
    return Call(collective, "ring", 1, timeout)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.bool_, np.complex128, np.uint8])
@pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 300])
def test_staged_self_transfer_moves_the_bytes_and_only_host_memory(self_ring, dtype, count):
    ring, log = self_ring
    backend = staged_backend(log, delay=2, segment_bytes=64)
    data = to_device(rank_input(count, 0, count, dtype))
    target = to_device(np.zeros(count, dtype))
    complete(ring, ring.post(backend, 1, sends=[(data, 0)], receives=[(target, 0)]), _call())
    assert_same(np.asarray(target), np.asarray(data), f"self transfer {dtype} x {count}")
    assert ring.comm.buffers and all(kind is np.ndarray for kind in ring.comm.buffers)
    assert ring.traffic.bytes_sent == data.nbytes == ring.traffic.bytes_received and ring.traffic.messages == 1


def test_staged_pipeline_order(self_ring):
    """Copies are queued up front, each send waits for its own copy, H2D starts as segments land."""
    ring, log = self_ring
    backend = staged_backend(log, delay=2, segment_bytes=64)
    data = to_device(np.arange(100, dtype=np.float32))  # 400 bytes: 7 segments
    target = to_device(np.zeros(100, np.float32))
    complete(ring, ring.post(backend, 1, sends=[(data, 0)], receives=[(target, 0)]), _call())
    assert_same(np.asarray(target), np.asarray(data), "pipelined transfer")

    names = [entry[0] for entry in log]
    sends = [i for i, entry in enumerate(log) if entry[0] == "isend"]
    assert len(sends) == 7 == names.count("d2h") == names.count("irecv") == names.count("h2d")
    assert names.index("after_compute") < names.index("d2h")
    last_queued = max(i for i, name in enumerate(names) if name == "d2h")
    assert last_queued < sends[0], "every D2H copy is queued before the first send (they overlap MPI)"
    done_at = {entry[1]: i for i, entry in enumerate(log) if entry[0] == "d2h_done"}
    offsets = [entry[1] for entry in log if entry[0] == "d2h"]
    for offset, send in zip(offsets, sends, strict=True):
        assert done_at[offset] < send, f"segment at byte {offset} sent before its copy finished"
    first_h2d = names.index("h2d")
    assert first_h2d < sends[-1], "H2D copies start while later segments are still being sent"
    assert names.index("before_compute") > max(i for i, name in enumerate(names) if name == "h2d")


def test_staged_pool_is_reused_across_steps(self_ring):
    ring, log = self_ring
    backend = staged_backend(log, delay=1, segment_bytes=64)
    data = to_device(np.arange(1000, dtype=np.float64))
    target = to_device(np.zeros(1000))
    for round_ in range(8):
        complete(ring, ring.post(backend, round_, sends=[(data, 0)], receives=[(target, 0)]), _call())
        if round_ == 2:
            warm = backend.pool.allocations
    # a send and a receive block, plus one while a receive block's H2D copies may still run
    assert backend.pool.allocations == warm <= 3
    assert_same(np.asarray(target), np.asarray(data), "after reuse")


def test_receive_blocks_wait_for_their_copies(self_ring):
    """A receive block goes back to the pool with the H2D fence: reused only once its copies ran."""
    ring, log = self_ring
    backend = staged_backend(log, delay=3, segment_bytes=64)
    data, target = to_device(np.arange(25, dtype=np.float32)), to_device(np.zeros(25, np.float32))
    complete(ring, ring.post(backend, 1, sends=[(data, 0)], receives=[(target, 0)]), _call())
    pool = backend.pool
    assert pool.allocations == 2 and pool.idle_blocks() == 2
    pool.acquire(100)  # the send block: free as soon as its Isends completed
    pool.acquire(100)  # the receive block is still fenced: a new one
    assert pool.allocations == 3


def test_one_copy_for_a_buffer_sent_to_several_ranks(self_ring):
    ring, log = self_ring
    backend = staged_backend(log, delay=0, segment_bytes=64)
    data = to_device(np.arange(40, dtype=np.int32))  # 160 bytes: 3 segments
    targets = [to_device(np.zeros(40, np.int32)) for _ in range(2)]
    step = ring.post(backend, 1, sends=[(data, 0), (data, 0)], receives=[(t, 0) for t in targets])
    complete(ring, step, _call("broadcast"))
    for target in targets:
        assert_same(np.asarray(target), np.asarray(data), "fan-out")
    assert [entry[0] for entry in log].count("d2h") == 3


def test_staged_nonblocking_progress(self_ring):
    ring, log = self_ring
    backend = staged_backend(log, delay=3, segment_bytes=64)
    data = to_device(np.arange(64, dtype=np.float32))
    target = to_device(np.zeros(64, np.float32))
    step = ring.post(backend, 1, sends=[(data, 0)], receives=[(target, 0)])
    call = _call()
    polls = 0
    while not is_complete(ring, step, call):
        polls += 1
        assert polls < 1000
    assert polls > 0 and call.step == 1
    assert_same(np.asarray(target), np.asarray(data), "test() driven")


def test_staged_timeout_names_the_missing_peer(self_ring):
    ring, log = self_ring
    backend = staged_backend(log, segment_bytes=64)
    step = ring.post(backend, 7, receives=[(to_device(np.zeros(40, np.float32)), 0)])
    with pytest.raises(CollectiveTimeout, match="receive from rank 0"):
        complete(ring, step, _call(timeout=0.05))
    for request in step.requests:  # leave nothing behind on the communicator
        if request:
            request.Cancel()
            request.Wait()


@pytest.mark.parametrize(("sent", "expected"), [(96, 100), (100, 96)])
def test_staged_size_mismatch_raises(self_ring, sent, expected):
    ring, log = self_ring
    backend = staged_backend(log, segment_bytes=64)
    data, target = to_device(np.zeros(sent, np.uint8)), to_device(np.zeros(expected, np.uint8))
    step = ring.post(backend, 3, sends=[(data, 0)], receives=[(target, 0)])
    with pytest.raises(CommunicationError):
        complete(ring, step, _call())
    for request in step.requests:
        if request:
            request.Cancel()
            request.Wait()


def test_staged_backend_refuses_the_plain_protocol():
    backend = staged_backend([])
    with pytest.raises(RuntimeError, match="never straight to MPI"):
        backend.send_message(to_device([1.0]))
    with pytest.raises(RuntimeError, match="never straight to MPI"):
        backend.receive_message(to_device([1.0]))


def test_direct_path_synchronizes_before_mpi_touches_device_memory():
    log: list = []
    comm = MPI.COMM_SELF.Dup()
    ring = Ring(comm)
    ring.comm = RecordingComm(comm, log, device_ok=True)
    backend = direct_backend(log)
    try:
        data = backend.empty(50, np.float64)
        backend.copy(data, to_device(np.arange(50.0)))  # a kernel writes the send buffer
        target = backend.empty(50, np.float64)
        complete(ring, ring.post(backend, 1, sends=[(data, 0)], receives=[(target, 0)]), _call())
    finally:
        comm.Free()
    assert_same(np.asarray(target), np.arange(50.0), "direct transfer")
    names = [entry[0] for entry in log]
    for i, entry in enumerate(log):
        if entry[0] in ("isend", "irecv") and entry[1] == "device":
            last_kernel = max((k for k in range(i) if names[k] == "kernel"), default=-1)
            assert "sync" in names[last_kernel + 1 : i], f"{entry[0]} of device memory without a stream sync"
    assert ("isend", "device", 400) in log  # the direct path does hand MPI the device buffer


def test_zero_byte_messages_never_carry_a_device_pointer():
    backend = direct_backend([])
    empty = to_device(np.zeros(0, np.float32))
    assert type(backend.send_message(empty)[0]) is np.ndarray
    assert type(backend.receive_message(empty)[0][0]) is np.ndarray


def test_cupy_engine_uses_calls_cupy_has():
    """Import-level check of the CuPy API the engine relies on (no GPU needed; skipped without CuPy)."""
    try:
        import cupy
    except ImportError as error:
        pytest.skip(f"CuPy is not importable ({error})")
    runtime = cupy.cuda.runtime
    assert callable(runtime.memcpyAsync) and runtime.memcpyDeviceToHost == 2 and runtime.memcpyHostToDevice == 1
    assert all(hasattr(cupy.cuda.Stream, name) for name in ("wait_event", "record", "synchronize"))
    assert hasattr(cupy.cuda.Event, "done") and callable(cupy.cuda.alloc_pinned_memory)
    assert callable(cupy.cuda.get_current_stream) and callable(cupy.may_share_memory)
    assert cupy.ndarray.__module__.startswith("cupy") and hasattr(cupy.ndarray, "__cuda_array_interface__")


# ---------------------------------------------------------------- whole collectives, fake device, MPI

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()


@pytest.fixture(scope="module")
def fake_device_comm():
    """A Communicator whose device arrays take the staged path over fake device memory, with MPI
    behind a RecordingComm that fails on any device buffer."""
    log: list = []
    comm = mpiring.Communicator()
    comm._ring.comm = RecordingComm(comm._ring.comm, log)
    backend = staged_backend(log, delay=1, segment_bytes=256)
    yield comm, backend
    comm.free()


@pytest.fixture
def on_fake_device(monkeypatch, fake_device_comm):
    comm, backend = fake_device_comm
    route_to(monkeypatch, backend)
    return comm, backend





@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", [None, "ring"])
def test_collectives_on_the_staged_path(on_fake_device, algorithm):
    comm, _ = on_fake_device
    check_collectives_on_fake_device(comm, algorithm)


@pytest.mark.mpi
def test_pipelined_ring_on_the_staged_path(on_fake_device, monkeypatch):
    """Staged buffers already move in overlapping segments: ring_pipelined runs the plain ring there."""
    from mpiring.algorithms import reduce_scatter_ring_pipelined

    monkeypatch.setattr(reduce_scatter_ring_pipelined, "SEGMENT_BYTES", 8)
    comm, _ = on_fake_device
    for seed, length in enumerate([0, N + 1, 333]):
        inputs = all_inputs(seed, N, length, np.float32)
        got = comm.allreduce(to_device(inputs[RANK]), algorithm="ring_pipelined")
        assert_same(on_host(got), numpy_reduce("sum", inputs), f"allreduce {length}")
        rows = all_inputs(seed, N, (length, 3), np.float64)
        got = comm.reduce_scatter(to_device(rows[RANK]), algorithm="ring_pipelined")
        assert_same(on_host(got), np.array_split(numpy_reduce("sum", rows), N)[RANK], f"reduce_scatter {length}")
    assert all(kind is np.ndarray for kind in comm._ring.comm.buffers), "only host memory reached MPI"


@pytest.mark.mpi
def test_out_in_place_and_nonblocking_on_the_staged_path(on_fake_device):
    comm, backend = on_fake_device
    inputs = all_inputs(4, N, (N + 2, 5), np.float32)
    total = numpy_reduce("sum", inputs)
    x = to_device(inputs[RANK])
    assert comm.allreduce(x, out=x) is x
    assert_same(on_host(x), total, "in place")
    out = to_device(np.full((N + 2, 10), np.nan, np.float32))[:, ::2]  # strided out=
    assert comm.allreduce(to_device(inputs[RANK]), out=out) is out
    assert_same(np.asarray(out), total, "strided out=")
    request = comm.iallreduce(to_device(inputs[RANK]), op="max")
    while not request.test():
        pass
    assert_same(on_host(request.result), numpy_reduce("max", inputs), "iallreduce")
    strided = to_device(inputs[RANK])[::2]  # a non-contiguous input
    assert_same(on_host(comm.allreduce(strided)), numpy_reduce("sum", [a[::2] for a in inputs]), "strided x")


@pytest.mark.mpi
def test_staged_collectives_allocate_no_pinned_memory_once_warm(on_fake_device):
    comm, backend = on_fake_device
    x = to_device(rank_input(1, RANK, 5000, np.float64))
    for _ in range(2):
        comm.allreduce(x)
    warm = backend.pool.allocations
    for _ in range(5):
        comm.allreduce(x)
    assert backend.pool.allocations == warm, "pinned blocks must be reused, not allocated per call"
