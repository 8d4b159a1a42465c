"""Recorded collectives (mpiring.engine): a host call whose layout comes twice is recorded once
as a schedule and replayed on whatever arrays of that layout later calls pass; device arrays on
the direct path (a CUDA-aware MPI) and the staged one are recorded as plans bound to their arrays.
Replays must give what an unrecorded call gives, with new contents, across eviction, for
persistent requests started many times, and interleaved with nonblocking calls. They run in C
where the extension was built (mpiring.engine.native) and in Python otherwise: the tests that
take `replay_comm` run both. Device plans also send by persistent requests (MPICH's default) or
by new ones each run (Open MPI's). Fake device arrays here (tests/fake_device.py), real ones in
tests/test_gpu.py. How schedules bind (views, new arrays, eviction): tests/test_schedules.py."""

from __future__ import annotations

import gc
import inspect
import math
import threading
import time
import weakref

import numpy as np
import pytest
from fake_device import (
    FakeDeviceArray,
    RecordingComm,
    direct_backend,
    ipc_backend,
    route_to,
    staged_backend,
    to_device,
)
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce, rank_input

import mpiring
from mpiring.algorithms import ALGORITHMS
from mpiring.engine import native
from mpiring.engine.cache import ENTRIES_KEPT
from mpiring.engine.engine import Engine
from mpiring.engine.plan import Plan
from mpiring.engine.recording import POST, WORK
from mpiring.engine.schedule import Schedule
from mpiring.engine.waiting import YIELD_SECONDS

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()


def _communicator(monkeypatch, replay: str, sends: str = "persistent sends"):
    if replay == "compiled" and not native.available():  # the same on every rank: one install
        pytest.skip("the C replay was not built (no C compiler at install; test_package says when it must be)")
    monkeypatch.setenv("MPIRING_COMPILED", "1" if replay == "compiled" else "0")
    monkeypatch.setenv("MPIRING_PERSISTENT_SENDS", "1" if sends == "persistent sends" else "0")
    fresh = mpiring.Communicator()
    fresh.replay = replay
    assert fresh._ring.persistent_sends == (sends == "persistent sends")
    return fresh


@pytest.fixture(params=["compiled", "python"])
def replay_comm(request, monkeypatch):
    """A fresh communicator whose schedules and plans replay in C (mpiring.engine.native) or in Python."""
    fresh = _communicator(monkeypatch, request.param)
    yield fresh
    fresh.free()


def _assert_replays_in(comm, recorded, algorithm=None):
    """The call was recorded, and replays where `comm` asked for: in C, or (device plans whose
    steps overlap) in Python. Host calls whose steps overlap (the pipelined ring) are not recorded."""
    if algorithm == "ring_pipelined" and (recorded is None or type(recorded) is Schedule):
        assert recorded is None, "a pipelined host call cannot be a schedule"
        return
    assert recorded is not None
    in_c = comm.replay == "compiled" and recorded.length is not None
    assert (recorded.compiled is not None) == in_c, (comm.replay, recorded.call.collective)


def _calls(comm, algorithm, seed, rows, empty=np.empty):
    """Every collective with out= given (plannable), each with its oracle. The arrays are made
    once, by `empty(shape, dtype)`; `fill(seed)` writes new contents into them."""
    x = empty((N * rows, 3), np.float64)
    block = empty((rows, 3), np.float64)
    whole = empty((N * rows, 3), np.float64)
    part = empty((rows, 3), np.float64)
    full = empty(x.shape, x.dtype)
    root = seed % N
    counts = [rows] * N
    uneven = [(RANK + b) % 3 for b in range(N)]  # all-to-all-v: rank a sends rank b (a + b) % 3 rows
    v_in, v_out = empty((sum(uneven), 3), np.float64), empty((sum((a + RANK) % 3 for a in range(N)), 3), np.float64)
    prefix = empty(x.shape, x.dtype)

    def fill(seed):
        inputs = all_inputs(seed, N, x.shape, x.dtype)
        x[...] = inputs[RANK]
        block[...] = rank_input(seed, RANK, block.shape, block.dtype)
        blocks = [rank_input(seed, k, block.shape, block.dtype) for k in range(N)]
        v_inputs = [rank_input(seed, k, (sum((k + b) % 3 for b in range(N)), 3), x.dtype) for k in range(N)]
        v_in[...] = v_inputs[RANK]
        offsets = [sum((k + b) % 3 for b in range(RANK)) for k in range(N)]
        return {
            "alltoall": np.concatenate([np.split(inputs[k], N)[RANK] for k in range(N)]),
            "alltoallv": np.concatenate([v_inputs[k][offsets[k] : offsets[k] + (k + RANK) % 3] for k in range(N)]),
            "scan": numpy_reduce("sum", inputs[: RANK + 1]),
            "exscan": numpy_reduce("max", inputs[:RANK]) if RANK else None,
            "allreduce": numpy_reduce("sum", inputs),
            "reduce": numpy_reduce("max", inputs),
            "broadcast": inputs[root],
            "reduce_scatter": np.array_split(numpy_reduce("sum", inputs), N)[RANK],
            "allgather": np.concatenate(blocks),
            "gather": np.concatenate(blocks),
            "scatter": np.array_split(inputs[root], N)[RANK],
        }

    def algo(name):
        return algorithm if algorithm in ALGORITHMS[name] else None

    runs = {
        "allreduce": lambda: comm.allreduce(x, out=full, algorithm=algo("allreduce")),
        "reduce": lambda: comm.reduce(x, op="max", root=root, out=full, algorithm=algo("reduce")),
        "broadcast": lambda: comm.broadcast(x, root=root, out=full, algorithm=algo("broadcast")),
        "reduce_scatter": lambda: comm.reduce_scatter(x, out=part, algorithm=algo("reduce_scatter")),
        "allgather": lambda: comm.allgather(block, out=whole, counts=counts, algorithm=algo("allgather")),
        "gather": lambda: comm.gather(block, root=root, out=whole, counts=counts, algorithm=algo("gather")),
        "scatter": lambda: comm.scatter(x, root=root, out=part, counts=counts, algorithm=algo("scatter")),
        "alltoall": lambda: comm.alltoall(x, out=full, algorithm=algo("alltoall")),
        "alltoallv": lambda: comm.alltoallv(v_in, uneven, [(a + RANK) % 3 for a in range(N)], out=v_out,
                                            algorithm=algo("alltoallv")),
        "scan": lambda: comm.scan(x, out=prefix, algorithm=algo("scan")),
        "exscan": lambda: comm.exscan(x, op="max", out=prefix, algorithm=algo("exscan")),
    }
    planned = {"alltoall": (x, full), "alltoallv": (v_in, v_out), "scan": (x, prefix), "exscan": (x, prefix)}
    return fill, runs, root, planned


def algo_of(name, algorithm):
    return algorithm if algorithm in ALGORITHMS[name] else None


def _counts_of(name, rank):
    if name == "alltoallv":
        return (tuple((rank + b) % 3 for b in range(N)), tuple((a + rank) % 3 for a in range(N)))
    return None


@pytest.mark.parametrize("algorithm", ["auto", "ring", "binomial", "recursive_doubling", "rabenseifner",
                                       "ring_pipelined", "bruck", "recursive_halving", "pairwise",
                                       "scattered", "linear"])
@pytest.mark.parametrize("rows", [0, 1, 3])
def test_replays_match_the_oracle_with_new_contents(replay_comm, algorithm, rows):
    comm = replay_comm
    fill, runs, root, planned = _calls(comm, algorithm, seed=rows, rows=rows)
    for seed in range(4):  # the first call is unplanned, the second builds the plan, then replays
        expected = fill(100 * rows + seed)
        for name, run in runs.items():
            got = run()
            if (name in ("reduce", "gather") and RANK != root) or expected[name] is None:
                assert got is None
            else:
                assert_same(got, expected[name], f"{name} {algorithm} call {seed}")
            if seed > 0:  # planned from the second call on: host arrays, layout known to every rank
                arrays = planned.get(name)
                if arrays is not None:
                    op = {"exscan": "max"}.get(name)
                    _assert_replays_in(comm, comm.plan_of(name, *arrays, op=op, algorithm=algo_of(name, algorithm),
                                                          counts=_counts_of(name, RANK)), algo_of(name, algorithm))


@pytest.mark.parametrize(("name", "algorithm"), [(name, algorithm) for name in ("scatter", "gather", "broadcast")
                                               for algorithm in ("ring", "binomial", "linear")]
                         + [("alltoall", "scattered"), ("allgather", "ring"), ("allgather", "scattered")])
def test_the_own_block_is_copied_while_the_first_messages_are_in_flight(replay_comm, name, algorithm):
    """The root's copy of its own block (every rank's, in all-to-all and all-gather) is work in flight: done right
    after its first step's messages start, before the wait, and the plan still replays exchange by
    exchange (in C where compiled). The results stay the oracle's as the contents change."""
    comm, root = replay_comm, 0
    x = np.empty((4 * N, 3), np.float32)
    out = np.empty(x.shape if name in ("broadcast", "alltoall") else (4, 3), np.float32)
    if name in ("gather", "allgather"):
        x, out = out, x
    call = {"scatter": lambda: comm.scatter(x, root=root, out=out, counts=[4] * N, algorithm=algorithm),
            "gather": lambda: comm.gather(x, root=root, out=out, counts=[4] * N, algorithm=algorithm),
            "broadcast": lambda: comm.broadcast(x, root=root, out=out, algorithm=algorithm),
            "alltoall": lambda: comm.alltoall(x, out=out, algorithm=algorithm),
            "allgather": lambda: comm.allgather(x, out=out, counts=[4] * N, algorithm=algorithm)}[name]
    for seed in range(3):
        inputs = all_inputs(seed, N, x.shape, x.dtype)
        x[...] = inputs[RANK]
        got = call()
        if name == "alltoall":
            expected = np.concatenate([np.split(inputs[k], N)[RANK] for k in range(N)])
        elif name == "scatter":
            expected = np.split(inputs[root], N)[RANK]
        else:
            expected = np.concatenate(inputs) if name in ("gather", "allgather") else inputs[root]
        if name == "gather" and RANK != root:
            assert got is None
        else:
            assert_same(got, expected, f"{name} {algorithm} call {seed}")
    [schedule] = [s for s in comm._engine.cache.table.values() if type(s) is Schedule and s.call.collective == name]
    _assert_replays_in(comm, schedule)
    during = [work for exchange in schedule.exchanges for work in exchange.during]
    if N > 1 and (RANK == root or name in ("alltoall", "allgather")):  # the copy, in flight with the first step
        assert len(during) == 1 and schedule.exchanges[0].during and not schedule.prologue_works, (name, algorithm)
    else:
        assert len(during) <= 1, (name, algorithm)  # (a binomial root alone copies during an empty step)


@pytest.fixture(params=[(replay, sends, path) for replay in ("compiled", "python")
                        for sends in ("persistent sends", "fresh sends") for path in ("direct", "staged")],
                ids=" ".join)
def device_comm(monkeypatch, request):
    """A communicator with fake device arrays (tests/fake_device.py) on the direct path (a
    CUDA-aware MPI reads them in place) or the staged one (through pinned host memory, with copies
    that land late), planned in C or Python, sending by persistent requests or new ones each run.
    Where plans replay in Python, MPI sits behind a RecordingComm, which refuses a device buffer
    on the staged path."""
    replay, sends, path = request.param
    replay_comm = _communicator(monkeypatch, replay, sends)
    backend = direct_backend([]) if path == "direct" else staged_backend([], delay=1, segment_bytes=40)
    route_to(monkeypatch, backend)
    if replay_comm.replay == "python":  # (the C replay takes the communicator's MPI handle)
        replay_comm._ring.comm = RecordingComm(replay_comm._ring.comm, [], device_ok=path == "direct")
    replay_comm.device = backend
    yield replay_comm
    replay_comm.free()


def _assert_device_plan(plan, backend):
    """A direct-path plan synchronizes the compute stream right before it starts any step (MPI must
    not read a buffer a queued kernel still writes, nor write one a kernel still reads); any device
    plan does its arithmetic through the backend, whose kernels run with the buffers' GPU current."""
    assert plan is not None
    ready = backend.ready_for_mpi
    for index, (kind, _) in enumerate(plan.actions):
        if kind == POST and not backend.staged:
            assert index > 0 and plan.actions[index - 1] == (WORK, ready), f"{plan.call.collective}: unsynchronized"
    for kind, work in plan.actions:
        if kind == WORK and work != ready:
            owner = getattr(work, "__self__", None) or work.func.__self__
            assert owner is backend or type(owner).__module__ == "mpiring.gpu.staging", (plan.call.collective, work)


@pytest.mark.parametrize("algorithm", ["auto", "ring", "binomial", "recursive_doubling", "bruck", "pairwise",
                                       "linear"])
def test_device_replays_match_the_oracle(device_comm, algorithm):
    comm = device_comm
    backend = comm.device
    fill, runs, root, _ = _calls(comm, algorithm, seed=3, rows=3,
                                 empty=lambda shape, dtype: to_device(np.empty(shape, dtype)))
    for seed in range(4):  # unplanned, then planned, then replayed
        expected = fill(seed)
        syncs = backend.engine.syncs
        pinned = len(backend.engine.pinned_blocks)
        for name, run in runs.items():
            got = run()
            if (name in ("reduce", "gather") and RANK != root) or expected[name] is None:
                assert got is None
            else:
                assert type(got) is FakeDeviceArray, name
                assert_same(np.asarray(got), expected[name], f"{name} {algorithm} call {seed}")
        if seed >= 2:  # replays only
            if backend.staged:  # the plans own their pinned blocks: nothing allocated
                assert len(backend.engine.pinned_blocks) == pinned
            else:  # every step of every plan synchronized first
                starts = sum(kind == POST for plan in comm._engine.cache.table.values() if type(plan) is Plan
                             for kind, _ in plan.actions)
                assert backend.engine.syncs - syncs == starts
    plans = [plan for plan in comm._engine.cache.table.values() if type(plan) is Plan]
    assert len(plans) == len(runs)  # every collective, device arrays and counts given: all planned
    for plan in plans:
        _assert_device_plan(plan, backend)
        fresh_sends = any(step.fresh_sends for kind, step in plan.actions if kind == POST)
        if not (fresh_sends and not backend.staged):  # new sends of device memory stay with mpi4py
            _assert_replays_in(comm, plan)
    if comm.replay == "python" and backend.staged:
        assert (N == 1 or comm._ring.comm.buffers) and all(kind is np.ndarray for kind in comm._ring.comm.buffers)


def test_device_results_and_persistent_requests(device_comm):
    comm = device_comm
    backend = comm.device
    inputs = all_inputs(7, N, (N + 2, 30), np.float32)
    x = to_device(inputs[RANK])
    results = [comm.allreduce(x, op="avg") for _ in range(3)]  # no out=: each call a new device array
    plan = comm.plan_of("allreduce", x)
    _assert_device_plan(plan, backend)
    assert all(type(got) is FakeDeviceArray for got in results) and results[1] is not results[2]
    for got in results:
        assert_same(np.asarray(got), numpy_reduce("avg", inputs), "allreduce avg")
    for length in (0, 1, 1001):  # empty, and chunks whose messages take different numbers of segments
        y = to_device(np.empty(length, np.float32))
        for seed in range(3):
            parts = all_inputs(seed, N, length, np.float32)
            y[...] = parts[RANK]
            assert_same(np.asarray(comm.allreduce(y, algorithm="ring")), numpy_reduce("sum", parts), f"{length}")
        assert comm.plan_of("allreduce", y) is not None
    out = to_device(np.empty_like(inputs[RANK]))
    request = comm.allreduce_init(x, op="max", out=out)
    _assert_device_plan(request._recorded, backend)
    for seed in range(5):
        inputs = all_inputs(seed, N, x.shape, x.dtype)
        x[...] = inputs[RANK]
        request.start()
        if seed % 2:
            while not request.test():
                pass
        assert request.wait() is out
        assert_same(np.asarray(out), numpy_reduce("max", inputs), f"persistent start {seed}")
    request.free()


def test_a_device_plan_is_not_replayed_on_another_path(device_comm, monkeypatch):
    """mpiring.gpu.device_backend reads MPIRING_CUDA_AWARE on every call: once device arrays take
    another path, their plan (a direct one hands MPI device memory) must not run."""
    comm = device_comm
    inputs = all_inputs(3, N, (N, 2), np.float64)
    x, out = to_device(inputs[RANK]), to_device(np.empty((N, 2)))
    for _ in range(2):
        comm.allreduce(x, out=out)
    plan = comm.plan_of("allreduce", x, out)
    assert plan is not None and plan.backend is comm.device
    other = ipc_backend([])  # not plannable: every call on it goes through its own transfer
    route_to(monkeypatch, other)
    out[...] = 0
    assert comm.allreduce(x, out=out) is out
    assert_same(np.asarray(out), numpy_reduce("sum", inputs), "allreduce on another path")
    assert plan.used < comm._ring.calls, "the call replayed the other path's plan"
    other.engine.close()


def test_a_repeated_layout_is_recorded_and_new_arrays_of_it_replay_it(comm):
    x, out = np.ones(5), np.empty(5)
    comm.allreduce(x, out=out)
    assert comm.plan_of("allreduce", x, out) is None  # seen once: not recorded yet
    comm.allreduce(x, out=out)
    schedule = comm.plan_of("allreduce", x, out)
    assert schedule is not None
    runs = schedule.runs
    for k in range(3):  # new arrays every call: the same schedule, and nothing keeps them alive
        fresh, fresh_out = np.full(5, float(k)), np.empty(5)
        assert_same(comm.allreduce(fresh, out=fresh_out), np.full(5, float(k * N)), f"call {k}")
        assert comm.plan_of("allreduce", fresh, fresh_out) is schedule
        refs = weakref.ref(fresh), weakref.ref(fresh_out)
        del fresh, fresh_out
        gc.collect()
        assert all(ref() is None for ref in refs)
    assert schedule.runs == runs + 3


def test_without_out_each_call_returns_a_new_array(comm):
    x = np.full(4, float(RANK))
    results = [comm.allreduce(x) for _ in range(4)]
    assert len({id(r) for r in results}) == 4
    for r in results:
        assert_same(r, np.full(4, float(sum(range(N)))), "allreduce without out=")
    results[-1][:] = -1  # the caller owns it: the next call is unaffected
    assert_same(comm.allreduce(x), np.full(4, float(sum(range(N)))), "after the caller wrote its result")


def test_shape_reassigned_in_place_rebuilds_the_plan(comm):
    x = np.arange(6, dtype=np.float64)
    out = np.empty(6)
    for _ in range(2):
        comm.allreduce(x, out=out)
    x.shape = (2, 3)
    out.shape = (2, 3)
    got = comm.allreduce(x, out=out)
    assert got.shape == (2, 3)
    assert_same(got, N * np.arange(6, dtype=np.float64).reshape(2, 3), "after reshaping in place")


def test_a_freed_communicator_keeps_no_array_alive():
    comm = mpiring.Communicator()
    x, out = np.full(3, 1.0), np.empty(3)
    for _ in range(3):
        comm.allreduce(x, out=out)
    ref = weakref.ref(x)
    del x
    comm.free()
    gc.collect()
    assert ref() is None


def _fill_the_cache(comm):
    arrays = [np.full(k + 1, float(k)) for k in range(ENTRIES_KEPT + 2)]  # a layout each
    for a in arrays:
        comm.allreduce(a)
        comm.allreduce(a)
    return arrays


def test_eviction_bounds_the_cache_and_keeps_results_right(comm):
    arrays = _fill_the_cache(comm)
    assert len(comm._engine.cache) <= ENTRIES_KEPT
    for k, a in enumerate(arrays):  # the first ones were evicted: recorded again, the rest replayed
        assert_same(comm.allreduce(a), np.full(k + 1, float(k * N)), f"layout {k}")


def test_a_persistent_request_started_many_times(replay_comm):
    comm = replay_comm
    x = np.empty((N + 1, 2), np.int64)
    out = np.empty((N + 1, 2), np.int64)
    request = comm.allreduce_init(x, op="sum", out=out)
    for seed in range(20):
        inputs = all_inputs(seed, N, x.shape, x.dtype)
        x[...] = inputs[RANK]
        request.start()
        assert request.wait() is out
        assert_same(out, numpy_reduce("sum", inputs), f"start {seed}")
    if N > 1:  # at one rank a run completes inside start()
        request.start()
        with pytest.raises(RuntimeError, match="still running"):
            request.start()
        request.wait()
    request.free()
    with pytest.raises(RuntimeError, match="freed"):
        request.start()


def test_persistent_requests_of_every_collective(replay_comm):
    comm = replay_comm
    root = N - 1
    x = np.empty((2 * N, 2))
    part, whole, block = np.empty((2, 2)), np.empty((2 * N, 2)), np.empty((2, 2))
    full = np.empty_like(x)
    requests = {
        "allreduce": comm.allreduce_init(x, out=full),
        "reduce": comm.reduce_init(x, op="min", root=root, out=full),
        "broadcast": comm.broadcast_init(x, root=root, out=full),
        "reduce_scatter": comm.reduce_scatter_init(x, out=part),
        "allgather": comm.allgather_init(block, out=whole),
        "gather": comm.gather_init(block, root=root, out=whole),  # ragged-capable: replays its exchange
        "scatter": comm.scatter_init(x, root=root, out=part),  # and its header
        "barrier": comm.barrier_init(),
    }
    for seed in range(3):
        inputs = all_inputs(seed, N, x.shape, x.dtype)
        blocks = [rank_input(seed, k, block.shape, block.dtype) for k in range(N)]
        expected = {
            "allreduce": numpy_reduce("sum", inputs), "reduce": numpy_reduce("min", inputs),
            "broadcast": inputs[root], "reduce_scatter": np.array_split(numpy_reduce("sum", inputs), N)[RANK],
            "allgather": np.concatenate(blocks), "gather": np.concatenate(blocks),
            "scatter": np.array_split(inputs[root], N)[RANK], "barrier": None,
        }
        for name, request in requests.items():
            x[...] = inputs[RANK]
            block[...] = blocks[RANK]
            request.start()
            got = request.wait()
            if expected[name] is None or (name in ("reduce", "gather") and RANK != root):
                assert got is None, name
            else:
                assert_same(got, expected[name], f"persistent {name}, start {seed}")
    for request in requests.values():
        request.free()


def test_persistent_nonblocking_and_blocking_interleaved(replay_comm):
    comm = replay_comm
    x = np.empty(7)
    out = np.empty(7)
    persistent = comm.allreduce_init(x, op="max", out=out)
    y, y_out = np.empty((N, 2)), np.empty((N, 2))
    for seed in range(6):
        inputs = all_inputs(seed, N, x.shape, x.dtype)
        others = all_inputs(seed + 50, N, y.shape, y.dtype)
        x[...] = inputs[RANK]
        y[...] = others[RANK]
        persistent.start()
        pending = comm.iallreduce(others[RANK] * 2)
        blocking = comm.allreduce(y, out=y_out)  # planned from the second round on; advances the others
        assert_same(blocking, numpy_reduce("sum", others), f"blocking {seed}")
        if seed % 2:
            assert_same(pending.wait(), 2 * numpy_reduce("sum", others), f"nonblocking {seed}")
            assert_same(persistent.wait(), numpy_reduce("max", inputs), f"persistent {seed}")
        else:
            assert_same(persistent.wait(), numpy_reduce("max", inputs), f"persistent {seed}")
            assert_same(pending.wait(), 2 * numpy_reduce("sum", others), f"nonblocking {seed}")
    persistent.free()


def test_traffic_of_a_replay_equals_that_of_the_unplanned_call(comm):
    x, out = np.ones(10 * N + 3), np.empty(10 * N + 3)
    counted = []
    for _ in range(3):  # unplanned, building, replay
        comm.traffic.reset()
        comm.allreduce(x, out=out, algorithm="ring")
        counted.append((comm.traffic.bytes_sent, comm.traffic.bytes_received, comm.traffic.messages))
    assert counted[0] == counted[1] == counted[2]


@pytest.mark.skipif(not native.enabled(), reason="the C replay was not built or is off")
def test_cached_calls_take_the_c_shortcut_and_count_as_python_does(monkeypatch):
    """Once planned, a compiled host call never reaches Python (native.shortcut), and counts
    its sequence number and traffic as a call in Python does."""
    in_python = []
    original = Engine.run_in_python

    def counted(self, collective, *args):
        in_python.append(collective)
        return original(self, collective, *args)

    monkeypatch.setattr(Engine, "run_in_python", counted)
    x, out = rank_input(3, RANK, (5,), np.float64), np.empty(5)
    want = numpy_reduce("sum", all_inputs(3, N, (5,), np.float64))
    with mpiring.Communicator() as shortcut:
        calls = shortcut._ring.calls
        for n in range(4):
            assert_same(shortcut.allreduce(x, out=out, algorithm="ring"), want, f"call {n}")
            shortcut.barrier()
        assert shortcut._ring.calls == calls + 8  # every call took its sequence number
        traffic = shortcut.traffic.bytes_sent, shortcut.traffic.messages
    assert in_python == ["allreduce", "barrier"] * 2  # seen once, then planned; then all in C
    with mpiring.Communicator() as plain:  # the same calls, each in Python
        plain._blocking = plain._engine.run_in_python
        for _ in range(4):
            plain.allreduce(x, out=out, algorithm="ring")
            plain.barrier()
        assert (plain.traffic.bytes_sent, plain.traffic.messages) == traffic


@pytest.mark.skipif(not native.available(), reason="the C replay was not built")
def test_persistent_runs_in_c_count_and_give_what_python_runs_do():
    """A compiled persistent request starts and waits in C (native.persistent_shortcut): the
    same results, sequence numbers and traffic as the same request run by its Python methods."""
    x, want = rank_input(4, RANK, (6,), np.float64), numpy_reduce("max", all_inputs(4, N, (6,), np.float64))
    seen = {}
    for path in ("C", "Python"):
        with mpiring.Communicator() as comm:
            out = np.empty(6)
            request = comm.allreduce_init(x, op="max", out=out, algorithm="ring")
            barrier = comm.barrier_init()
            if path == "Python":
                for made in (request, barrier):
                    made.start, made.wait = made._start_in_python, made._wait_in_python
            assert inspect.isbuiltin(request.start) is (path == "C" and request._recorded.compiled is not None)
            calls = comm._ring.calls
            for n in range(5):
                out[:] = -1
                request.start()
                assert request.wait() is out
                assert_same(out, want, f"{path} run {n}")
                barrier.start()
                barrier.wait()
                comm.allreduce(x, out=out, algorithm="ring")  # blocking calls between keep their place
            seen[path] = (comm._ring.calls - calls, comm.traffic.bytes_sent, comm.traffic.messages)
    assert seen["C"] == seen["Python"]


def test_a_second_thread_is_refused_on_a_planned_call():
    comm = mpiring.Communicator()
    x, out = np.ones(3), np.empty(3)
    comm.allreduce(x, out=out)
    comm.allreduce(x, out=out)
    errors = []

    def other():
        try:
            comm.allreduce(x, out=out)
        except mpiring.ConcurrentUseError as error:
            errors.append(error)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert errors  # raised before any message moved, on this rank alone
    with pytest.raises(mpiring.CommunicatorBrokenError):
        comm.allreduce(x, out=out)
    comm.free()


@pytest.mark.parametrize("algorithm, messages", [("ring", N - 1), ("bruck", math.ceil(math.log2(N))),
                                                ("scattered", N - 1)])
def test_counts_skip_the_layout_exchange_and_are_checked(comm, algorithm, messages):
    counts = [k % 3 for k in range(N)]
    block = np.full((counts[RANK], 2), float(RANK))
    whole = np.empty((sum(counts), 2))
    for _ in range(3):
        comm.traffic.reset()
        got = comm.allgather(block, out=whole, counts=counts, algorithm=algorithm)
        assert_same(got, np.concatenate([np.full((c, 2), float(k)) for k, c in enumerate(counts)]), "allgather")
        assert comm.traffic.messages == messages  # the algorithm's steps only: no exchange of row counts
    with pytest.raises(mpiring.ArgumentError, match="counts"):
        comm.allgather(block, counts=[1] * (N + 1))  # every rank raises before any message moves
    with pytest.raises(mpiring.ArgumentError, match="counts"):
        comm.gather(np.ones((counts[RANK] + 1, 2)), counts=counts)


@pytest.mark.skipif(N < 2, reason="needs a rank that stays away")
@pytest.mark.parametrize("replay", ["compiled", "python"])
def test_a_timed_out_schedule_stays_referenced_with_its_arrays(monkeypatch, replay):
    """MPI may still write into a timed-out call's buffers: the communicator keeps the schedule
    and the arrays it was bound to."""
    if replay == "compiled" and not native.available():
        pytest.skip("the C replay was not built")
    monkeypatch.setenv("MPIRING_COMPILED", "1" if replay == "compiled" else "0")
    fresh = mpiring.Communicator(timeout=0.3)
    x, out = np.ones(4), np.empty(4)
    fresh.allreduce(x, out=out)
    fresh.allreduce(x, out=out)  # recorded
    if RANK != N - 1:  # the last rank stays away from the third call
        with pytest.raises(mpiring.CollectiveTimeout):
            fresh.allreduce(x, out=out)
        abandoned = fresh._ring.abandoned
        held = [item for a in abandoned for item in (a if isinstance(a, tuple) else a.bound_roots())]
        assert any(a is x for a in held) and any(a is out for a in held), abandoned
        with pytest.raises(mpiring.CommunicatorBrokenError):
            fresh.allreduce(x, out=out)
    WORLD.Barrier()


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_a_failed_nonblocking_call_leaves_no_trace(comm):
    block = np.zeros((1, 2), np.float32 if RANK == 0 else np.float64)
    request = comm.iallgather(block)
    with pytest.raises(mpiring.CollectiveMismatchError):
        request.wait()
    assert comm._ring.in_flight == []
    later = comm.iallreduce(np.full(3, 1.0))
    assert_same(later.wait(), np.full(3, float(N)), "the next nonblocking call")


def _pair():
    """Ranks 0 and 1 alone (None elsewhere): cases whose messages two ranks must disagree on."""
    pair = WORLD.Split(0 if RANK < 2 else MPI.UNDEFINED, RANK)
    return None if pair == MPI.COMM_NULL else pair


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
@pytest.mark.parametrize("peer_elements", [2, 8])
def test_a_replay_that_gets_a_wrong_size_raises_naming_the_sender(replay_comm, monkeypatch, peer_elements):
    """Rank 0 replays its plan of 4 float64; rank 1 makes an unplanned call with 2 (rank 0's
    receive gets too few bytes: its size check) or 8 (too many: MPI's truncation error). The
    replay stops at that exchange and raises in the same words as Python's, on both paths."""
    pair = _pair()
    if pair is not None:
        comm = mpiring.Communicator(pair, timeout=30)
        comm.replay = replay_comm.replay
        x, out = np.ones(4), np.empty(4)
        for _ in range(2):
            comm.allreduce(x, out=out, algorithm="recursive_doubling")
        _assert_replays_in(comm, comm.plan_of("allreduce", x, out, algorithm="recursive_doubling"))
        if RANK == 0:
            problem = "received 16 bytes from rank 1 but expected 32" if peer_elements == 2 else (
                "expected 32 bytes from rank 1 in step 0 but a larger message arrived")
            with pytest.raises(mpiring.CommunicationError, match=problem):
                comm.allreduce(x, out=out, algorithm="recursive_doubling")
        else:
            with pytest.raises(mpiring.CommunicationError):
                comm.allreduce(np.ones(peer_elements), algorithm="recursive_doubling")
        with pytest.raises(mpiring.CommunicatorBrokenError):
            comm.allreduce(x, out=out, algorithm="recursive_doubling")
        comm.free()
        pair.Free()
    WORLD.Barrier()


@pytest.mark.skipif(N < 2, reason="needs a late rank")
def _wait_for_late_ranks(comm, rounds: int, pause: float):
    """Blocking and persistent all-reduces, one rank `pause` seconds late to each in turn; the
    blocking call's plan."""
    x, out = np.full(5, float(RANK + 1)), np.empty(5)
    want = np.full(5, float(N * (N + 1) // 2))
    request = comm.allreduce_init(x, out=out)
    for late in range(rounds):
        if RANK == late % N:
            time.sleep(pause)
        assert_same(comm.allreduce(x, out=out), want, f"planned, late {late}")
        if RANK == late % N:
            time.sleep(pause)
        request.start()
        assert_same(request.wait(), want, f"persistent, late {late}")
    request.free()
    return comm.plan_of("allreduce", x, out)


def test_a_replay_waits_past_the_compiled_spin_for_a_late_rank(replay_comm):
    """A rank arriving later than the C loop spins (YIELD_SECONDS) hands the wait to Python's
    poll, which finishes the exchange and the rest of the plan, as with a persistent request."""
    _assert_replays_in(replay_comm, _wait_for_late_ranks(replay_comm, 3, 5 * YIELD_SECONDS))


@pytest.mark.skipif(N < 2, reason="needs a late rank")
def test_a_call_found_in_python_runs_in_c_and_waits_for_a_late_rank(replay_comm):
    """A cached call the C Shortcut leaves to Python (a per-call timeout, an x that is not
    contiguous) is still replayed by its schedule, in C where it was compiled (Program.call),
    and a rank later than the C spin hands the wait to Python, which finishes the call right."""
    comm = replay_comm
    base = np.arange(10.0) * (RANK + 1)
    want = np.arange(0.0, 10.0, 2) * (N * (N + 1) // 2)
    out = np.empty(5)
    for seed in range(2):  # recorded
        assert_same(comm.allreduce(base[::2], out=out, timeout=60), want, f"call {seed}")
    schedule = comm.plan_of("allreduce", np.empty(5), out)
    _assert_replays_in(comm, schedule)
    runs = schedule.runs
    for late in range(3):
        if RANK == late % N:
            time.sleep(3 * YIELD_SECONDS)
        fresh = np.empty(5)
        assert comm.allreduce(base[::2], out=fresh, timeout=60) is fresh
        assert_same(fresh, want, f"late {late}")
    assert schedule.runs == runs + 3
    if schedule.compiled is not None:  # the arrays went back to the caller: none kept
        assert schedule.compiled.x is None and schedule.compiled.out is None and schedule.x is None
    # arrays the schedule cannot bind (x and out overlapping, x not a block of out): unrecorded, right
    shared = np.zeros(9)
    shared[:5] = base[::2]
    assert_same(comm.allreduce(shared[:5], out=shared[4:], timeout=60), want, "x and out overlapping")
    assert schedule.runs == runs + 3


@pytest.mark.parametrize("busy", [True, False], ids=["busy poll", "offer the core"])
def test_busy_polling_waits_as_long_and_gives_the_same_results(monkeypatch, busy):
    """MPIRING_BUSY_POLL (else: whether the node has a core per rank) decides whether waits
    offer the core between tests; the compiled replay takes it too (Program.busy), and a late
    rank is waited for either way."""
    monkeypatch.setenv("MPIRING_BUSY_POLL", "1" if busy else "0")
    with mpiring.Communicator() as comm:
        assert comm._ring.busy_poll is busy
        plan = _wait_for_late_ranks(comm, 2, 2 * YIELD_SECONDS)
        if plan.compiled is not None:
            assert plan.compiled.busy is busy


def test_the_communicators_own_busy_poll_comes_before_the_variable(monkeypatch):
    """Communicator(busy_poll=...) decides over MPIRING_BUSY_POLL, and shrink() passes it on."""
    for variable in ("1", "0"):
        monkeypatch.setenv("MPIRING_BUSY_POLL", variable)
        for busy in (True, False):
            with mpiring.Communicator(busy_poll=busy) as comm:
                assert comm._ring.busy_poll is busy
                with comm.shrink() as again:
                    assert again._ring.busy_poll is busy
        with mpiring.Communicator() as comm:
            assert comm._ring.busy_poll is (variable == "1")


def test_a_node_short_of_cores_offers_them(monkeypatch):
    """Without MPIRING_BUSY_POLL, waits spin only where the CPUs the node's ranks may use,
    together, are at least as many as the ranks, or where the MPI library offers the core in
    each test itself (then a wait offering it too would offer it twice)."""
    from mpiring import topology
    monkeypatch.delenv("MPIRING_BUSY_POLL", raising=False)
    for yields in (False, True):
        monkeypatch.setattr(topology, "library_yields_when_idle", lambda yields=yields: yields)
        for cpus, busy in (({1000 + RANK}, True), ({0}, N == 1 or yields)):  # a CPU each; one CPU for all
            monkeypatch.setattr(topology, "_allowed_cpus", lambda cpus=cpus: cpus)
            with mpiring.Communicator() as comm:
                assert comm._ring.busy_poll is (busy and N > 1), (cpus, yields)


def test_the_library_yields_when_idle_only_where_its_control_variable_says_so(monkeypatch):
    """Open MPI's `mpi_yield_when_idle`, read through the MPI tool interface: another library
    has no such variable (its tool interface is not even opened), and one that cannot be reached
    says no."""
    from mpiring import topology
    open_mpi = "Open MPI" in MPI.Get_library_version()
    opened = []

    def unreachable(name):
        opened.append(name)
        raise OSError("no library")

    topology.library_yields_when_idle.cache_clear()
    monkeypatch.setattr(topology.ctypes, "CDLL", unreachable)
    try:
        assert topology.library_yields_when_idle() is False
        assert len(opened) == (1 if open_mpi else 0)
    finally:
        topology.library_yields_when_idle.cache_clear()
    if not open_mpi:
        assert topology.library_yields_when_idle() is False


def test_nodes_on_one_machine_count_its_cores_together(monkeypatch):
    """Emulated nodes (namespaces, containers) share one machine's cores: ranks with the same
    boot id count their CPUs together, whatever nodes MPI reports; on machines of their own
    each counts its own."""
    from mpiring import topology
    monkeypatch.delenv("MPIRING_BUSY_POLL", raising=False)
    monkeypatch.setattr(topology, "local_ranks", lambda: 0)
    monkeypatch.setattr(topology, "library_yields_when_idle", lambda: False)
    monkeypatch.setattr(topology, "_allowed_cpus", lambda: {0})  # one CPU each, the same one
    monkeypatch.setenv("MPIRING_VIRTUAL_NODES", str(N))  # a node per rank
    for machine, busy in ((lambda: "one machine", N == 1), (lambda: f"machine {RANK}", True)):
        monkeypatch.setattr(topology, "_machine", machine)
        with mpiring.Communicator() as comm:
            assert comm._ring.nodes.nodes == tuple((r,) for r in range(N))
            assert comm._ring.busy_poll is (busy and N > 1)


@pytest.mark.skipif(not native.available(), reason="the C replay was not built (test_package says when it must be)")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_doubling", "rabenseifner"])
def test_the_compiled_replay_gives_the_bits_of_the_python_replay(monkeypatch, dtype, algorithm):
    """Copies and arithmetic the C replay does itself (native.work_spec) must give NumPy's bits,
    on inputs whose sums round (so the order of additions shows)."""
    results = {}
    rng = np.random.default_rng(1234 + RANK)
    x = (rng.standard_normal(37) * 1000).astype(dtype)
    for replay in ("compiled", "python"):
        monkeypatch.setenv("MPIRING_COMPILED", "1" if replay == "compiled" else "0")
        comm = mpiring.Communicator()
        comm.replay = replay
        out, part = np.empty_like(x), np.zeros(len(np.array_split(x, N)[RANK]), dtype)  # zeros: when not run
        for _ in range(3):  # unplanned, planned, replayed
            comm.allreduce(x, out=out, algorithm=algorithm)
            if algorithm in ALGORITHMS["reduce_scatter"] or algorithm == "auto":
                comm.reduce_scatter(x, out=part, algorithm=algorithm)
        _assert_replays_in(comm, comm.plan_of("allreduce", x, out, algorithm=algorithm))
        results[replay] = (out.copy(), part.copy())
        comm.free()
    for got, want in zip(results["compiled"], results["python"], strict=True):
        assert_same(got, want, f"{algorithm} {np.dtype(dtype)}")
    everyone = WORLD.allgather(results["compiled"][0].tobytes())
    assert all(bits == everyone[0] for bits in everyone), "ranks differ"
