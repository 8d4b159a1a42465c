"""Schedules bound at run time (mpiring.engine.schedule): one recorded call of a layout serves every
later call of that layout, whatever arrays it passes, and never runs on memory that no longer is
what it was recorded for. Each case runs with the C replay and with the Python one, against NumPy
oracles on regenerated inputs, and counts the schedule's runs (never a timing)."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
from mpi4py import MPI
from oracles import all_inputs, assert_same, numpy_reduce, rank_input

import mpiring
from mpiring.engine import native
from mpiring.engine.schedule import RERECORD_LIMIT, STABLE_RUNS

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()


@pytest.fixture(params=["compiled", "python"])
def comm(request, monkeypatch):
    if request.param == "compiled" and not native.available():
        pytest.skip("the C replay was not built")
    monkeypatch.setenv("MPIRING_COMPILED", "1" if request.param == "compiled" else "0")
    made = mpiring.Communicator()
    yield made
    made.free()


def _sum(seed, shape, dtype=np.float64):
    inputs = all_inputs(seed, N, shape, dtype)
    return inputs[RANK], numpy_reduce("sum", inputs)


def _record(comm, shape, dtype=np.float64, **arguments):
    """Call twice with one layout, so that it is recorded; its schedule."""
    for seed in range(2):
        x, want = _sum(seed, shape, dtype)
        assert_same(comm.allreduce(x, out=np.empty(shape, dtype), **arguments), want, f"call {seed}")
    schedule = comm.plan_of("allreduce", np.empty(shape, dtype), np.empty(shape, dtype), **arguments)
    assert schedule is not None
    return schedule


def test_new_arrays_of_a_layout_replay_its_schedule(comm):
    schedule = _record(comm, (3, 5))
    runs = schedule.runs
    for seed in range(2, 6):
        x, want = _sum(seed, (3, 5))
        out = np.empty((3, 5))
        assert comm.allreduce(x, out=out) is out
        assert_same(out, want, f"call {seed}")
    assert schedule.runs == runs + 4
    assert comm.plan_of("allreduce", x, out) is schedule


def test_views_at_offsets_bind_where_they_are_and_strided_ones_stay_right(comm):
    schedule = _record(comm, (6,))
    runs = schedule.runs
    x, want = _sum(7, (6,))
    pool = np.full(40, np.nan)
    pool[3:9] = x
    got = comm.allreduce(pool[3:9], out=pool[20:26])  # contiguous views at offsets of one array
    assert got.base is pool
    assert_same(pool[20:26], want, "views at offsets")
    assert np.isnan(pool[:3]).all() and np.isnan(pool[9:20]).all() and np.isnan(pool[26:]).all()
    strided = np.zeros(12)
    strided[::2] = x
    assert_same(comm.allreduce(strided[::2], out=np.empty(6)), want, "a strided x (copied, then bound)")
    assert schedule.runs == runs + 2
    out = np.full(12, np.nan)
    assert comm.allreduce(x, out=out[::2]) is not None  # a strided out: unrecorded, and right
    assert_same(out[::2], want, "a strided out")
    assert np.isnan(out[1::2]).all()
    assert schedule.runs == runs + 2


def test_without_out_every_call_gets_a_new_array(comm):
    x, want = _sum(3, (4,))
    results = [comm.allreduce(x) for _ in range(4)]
    assert len({id(r) for r in results}) == 4
    for r in results:
        assert_same(r, want, "no out=")
    results[-1][:] = -1  # the caller owns it: the next call is unaffected
    assert_same(comm.allreduce(x), want, "after the caller wrote its result")


def test_a_freed_array_and_a_new_one_at_its_address(comm):
    schedule = _record(comm, (1000,))
    out = np.empty(1000)
    for seed in range(3):
        x, want = _sum(10 + seed, (1000,))
        address = x.__array_interface__["data"][0]
        assert_same(comm.allreduce(x, out=out), want, f"array {seed}")
        del x
        gc.collect()
        again, want = _sum(20 + seed, (1000,))  # often the freed memory
        assert_same(comm.allreduce(again, out=out), want, f"at {address:#x}, reused: "
                    f"{again.__array_interface__['data'][0] == address}")
        del again
    assert schedule.runs >= 6


def test_another_dtype_or_shape_is_another_schedule(comm):
    first = _record(comm, (4, 3))
    second = _record(comm, (12,))
    third = _record(comm, (4, 3), np.float32)
    assert len({id(first), id(second), id(third)}) == 3
    x = _sum(5, (4, 3))[0].copy()
    out = np.empty((4, 3))
    x.shape = out.shape = (12,)  # reshaped in place: the other layout's schedule, and right
    assert_same(comm.allreduce(x, out=out), _sum(5, (12,))[1], "reshaped in place")


def test_in_place_is_its_own_layout(comm):
    for seed in range(4):
        x, want = _sum(seed, (9,))
        assert comm.allreduce(x, out=x) is x
        assert_same(x, want, f"in place {seed}")
    schedule = comm.plan_of("allreduce", x, x)
    assert schedule is not None and schedule is not comm.plan_of("allreduce", x, np.empty(9))


def test_overlapping_x_and_out_are_right(comm):
    _record(comm, (6,))
    x, want = _sum(4, (6,))
    pool = np.zeros(9)
    pool[:6] = x
    assert_same(comm.allreduce(pool[:6], out=pool[3:9]), want, "x and out overlapping")


def test_an_array_changed_under_its_schedule(comm):
    """The same array objects, changed between calls: restrided, resized, made read-only."""
    _record(comm, (8,))
    base = np.zeros(16)
    x = base[:8]
    x[:], want = _sum(30, (8,))
    out = np.empty(8)
    assert_same(comm.allreduce(x, out=out), want, "as recorded")
    with warnings.catch_warnings():  # NumPy deprecates it, but a caller may still do it
        warnings.simplefilter("ignore", DeprecationWarning)
        x.strides = (16,)  # the same object, shape and dtype: every other element of base now
    x[:], want = _sum(31, (8,))
    assert_same(comm.allreduce(x, out=out), want, "restrided")
    y, want = _sum(32, (8,))
    y = y.copy()
    y.resize(1 << 20, refcheck=False)
    y.resize(8, refcheck=False)  # the same object, probably moved
    assert_same(comm.allreduce(y, out=out), want, "resized and back")
    out.flags.writeable = False
    with pytest.raises(mpiring.ArgumentError, match="read-only"):
        comm.allreduce(y, out=out)


def test_a_broadcast_out_restrided_under_its_schedule(comm):
    base = np.full(16, np.nan)
    out = base[:8]
    for seed in range(3):  # recorded, then replayed
        x = np.arange(8.0) + seed if RANK == 0 else np.empty(8)
        comm.broadcast(x, out=out)
    base[:] = np.nan
    _restride(out)
    x = np.arange(8.0) * 3 if RANK == 0 else np.empty(8)
    assert comm.broadcast(x, out=out) is out
    assert_same(out, np.arange(8.0) * 3, "a restrided out")
    assert np.isnan(base[1::2]).all()


def _restride(array):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        array.strides = (2 * array.itemsize,)


@pytest.mark.parametrize("change", ["restrided x", "read-only out", "read-only result", "retyped x"])
def test_a_persistent_request_refuses_arrays_changed_since_it_was_made(comm, change):
    """Every rank changes its arrays the same way: every rank raises, at the start, naming what
    changed; that request refuses every later start, and the communicator goes on."""
    base = np.zeros(16)
    x = base[:8]
    x[:], want = _sum(50, (8,))
    out = None if change == "read-only result" else np.zeros(16)[:8]
    request = comm.allreduce_init(x, out=out)
    for _ in range(2):
        request.start()
        result = request.wait()
        assert_same(result, want, "as made")
    if change == "restrided x":
        _restride(x)
    elif change == "read-only out":
        out.flags.writeable = False
    elif change == "read-only result":
        result.flags.writeable = False
    else:
        x.dtype = np.int64
    name = "out" if "out" in change or "result" in change else "x"
    with pytest.raises(mpiring.ArgumentError, match=f"{name}.* since this persistent request was made"):
        request.start()
    with pytest.raises(mpiring.ArgumentError, match="since this persistent request was made"):
        request.start()
    y, want = _sum(51, (8,))
    assert_same(comm.allreduce(y), want, "the next call")


def test_the_drop_in_replays_the_schedule(comm):
    """Every uppercase call makes new views of its buffers: they bind to the same schedule."""
    x, want = _sum(40, (7,))
    y = np.empty(7)
    for _ in range(2):
        comm.Allreduce(x, y)
    schedule = comm.plan_of("allreduce", x, y)
    assert schedule is not None
    runs = schedule.runs
    for seed in range(41, 44):
        x, want = _sum(seed, (7,))
        y = np.empty(7)
        comm.Allreduce(x, y, op=MPI.SUM)
        assert_same(y, want, f"drop-in {seed}")
    assert schedule.runs == runs + 3


@pytest.mark.parametrize("name", ["broadcast", "reduce", "reduce_scatter", "alltoall", "scan", "exscan"])
def test_every_collective_of_a_known_layout_replays_on_new_arrays(comm, name):
    rows = 2 * N
    root = N - 1
    call = {
        "broadcast": lambda x: comm.broadcast(x, root=root),
        "reduce": lambda x: comm.reduce(x, root=root),
        "reduce_scatter": lambda x: comm.reduce_scatter(x),
        "alltoall": lambda x: comm.alltoall(x),
        "scan": lambda x: comm.scan(x),
        "exscan": lambda x: comm.exscan(x),
    }[name]
    for seed in range(5):
        inputs = all_inputs(seed, N, (rows, 2), np.float64)
        got = call(inputs[RANK].copy())  # a new array every call
        expected = {
            "broadcast": inputs[root],
            "reduce": numpy_reduce("sum", inputs) if RANK == root else None,
            "reduce_scatter": np.array_split(numpy_reduce("sum", inputs), N)[RANK],
            "alltoall": np.concatenate([np.split(inputs[k], N)[RANK] for k in range(N)]),
            "scan": numpy_reduce("sum", inputs[: RANK + 1]),
            "exscan": numpy_reduce("sum", inputs[:RANK]) if RANK else None,
        }[name]
        if expected is None:
            assert got is None
        else:
            assert_same(got, expected, f"{name} call {seed}")
    assert comm.plan_of(name, inputs[RANK], None, root=root if name in ("broadcast", "reduce") else None) is not None


def _ragged_rows(k: int, call: int) -> int:
    """Rank k's rows in call `call`: even ranks keep theirs, odd ranks change from call 3 on."""
    return 2 + k % 3 + (k % 2) * (call >= 3) * (call % 2 + 1)


@pytest.mark.parametrize("name", ["allgather", "gather", "alltoallv", "scatter"])
def test_layout_rounds_are_recorded_and_a_changed_layout_is_never_stale(comm, name):
    """Without counts= the ranks exchange their layout first. The call is recorded with the table
    it brought; a replay whose round brings another one finishes the call for it (never with the
    recorded one), and the key records anew, until its layouts have changed RERECORD_LIMIT times.
    Even ranks pass the same layout every call, odd ones change theirs."""
    root = N - 1
    for call in range(RERECORD_LIMIT * 2 + 8):
        rows = [_ragged_rows(k, call) for k in range(N)]
        blocks = [np.full((rows[k], 2), float(k + 10 * call)) for k in range(N)]
        if name == "allgather":
            got, want = comm.allgather(blocks[RANK]), np.concatenate(blocks)
        elif name == "gather":
            got = comm.gather(blocks[RANK], root=root)
            want = np.concatenate(blocks) if RANK == root else None
        elif name == "scatter":  # the root's whole array changes rows: the others' part sizes change
            whole = np.arange(float(sum(rows) * 2)).reshape(-1, 2) + call
            got = comm.scatter(whole if RANK == root else None, root=root)
            want = np.array_split(whole, N)[RANK]
        else:  # rank a sends rows[a] rows to every rank
            send = np.concatenate([np.full((rows[RANK], 2), float(RANK * 100 + b + call)) for b in range(N)])
            got = comm.alltoallv(send, [rows[RANK]] * N)
            want = np.concatenate([np.full((rows[a], 2), float(a * 100 + RANK + call)) for a in range(N)])
        if want is None:
            assert got is None
        else:
            assert_same(got, want, f"{name} call {call}")
    recorded = [s for s in comm._engine.cache.table.values()
                if type(s).__name__ == "Schedule" and s.call.collective == name]
    if name != "scatter" or RANK != root:  # (the root's array changes every call: never the same key)
        assert recorded and all(s.layout is not None for s in recorded), "recorded with its layout round"
        if RANK % 2 == 0 and name != "scatter":
            assert sum(s.runs for s in recorded) >= 4, "replayed as the others' layouts changed"


def test_a_layout_that_changes_once_is_recorded_anew(comm):
    """Scatter without counts=: the other ranks' key cannot tell the root's sizes, so their
    schedule's layout round sees them change; the key then records the layout now in use and
    replays it, instead of finishing every later call unrecorded."""
    for rows_each in (1, 64):
        whole = np.arange(float(N * rows_each * 2)).reshape(-1, 2)
        for _ in range(6):
            got = comm.scatter(whole if RANK == 0 else None, root=0)
            assert_same(got, np.array_split(whole, N)[RANK], f"{rows_each} rows each")
        schedule = comm.plan_of("scatter", whole if RANK == 0 else None, None, root=0)
        assert schedule is not None and schedule.runs >= 3, f"{rows_each} rows each: replayed"


def test_layouts_kept_a_while_are_each_recorded(comm):
    """Sizes that grow, each used for a few calls (a benchmark's sweep): every one is recorded and
    replayed, however many there are."""
    for rows_each in range(1, RERECORD_LIMIT + 6):
        whole = np.arange(float(N * rows_each * 2)).reshape(-1, 2)
        for _ in range(STABLE_RUNS + 4):
            got = comm.scatter(whole if RANK == 0 else None, root=0)
            assert_same(got, np.array_split(whole, N)[RANK], f"{rows_each} rows each")
        schedule = comm.plan_of("scatter", whole if RANK == 0 else None, None, root=0)
        assert schedule is not None and schedule.runs >= 2, f"{rows_each} rows each: replayed"


@pytest.mark.parametrize("collective, algorithm", [("allgather", a) for a in ("ring", "bruck", "scattered", None)]
                         + [("gather", a) for a in ("ring", "binomial", "linear", None)])
@pytest.mark.parametrize("uneven", [False, True])
def test_an_own_block_of_out_as_x_replays_where_the_schedule_allows(comm, collective, algorithm, uneven):
    """x a view of out's own block (what MPI.IN_PLACE means to a gather): recorded with x apart,
    the schedule binds x where it lies if nothing but the copy of x onto itself writes there
    (Schedule.own_offset: the ring and linear gathers, the ring and scattered all-gathers), else a
    copy of x apart; either way later calls replay it, and results match the oracle whatever the
    rest of out held."""
    counts = [k % 3 for k in range(N)] if uneven else [2] * N  # uneven: some blocks empty
    root = N - 1
    offsets = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty((offsets[-1], 3))
    x = out[offsets[RANK]:offsets[RANK + 1]]
    for seed in range(5):
        blocks = [rank_input(seed, k, (counts[k], 3), np.float64) for k in range(N)]
        out[...] = np.nan  # what any block but this rank's holds before the call
        x[...] = blocks[RANK]
        if collective == "allgather":
            got = comm.allgather(x, out=out, counts=counts, algorithm=algorithm)
        else:
            got = comm.gather(x, root=root, out=out if RANK == root else None, counts=counts, algorithm=algorithm)
        if collective == "allgather" or RANK == root:
            assert got is out
            assert_same(out, np.concatenate(blocks), f"{collective} {algorithm} call {seed}")
    apart = np.empty_like(x)
    schedule = comm.plan_of(collective, apart, out if collective == "allgather" or RANK == root else None,
                            counts=counts, algorithm=algorithm, **({"root": root} if collective == "gather" else {}))
    if collective == "gather" and RANK != root:
        return  # (out is None: x cannot lie in it)
    assert schedule is not None and schedule.runs == 4  # recorded at the second call, replayed by the others
    if counts[RANK] and (collective, algorithm) in (("allgather", "ring"), ("allgather", "scattered"),
                                                    ("gather", "ring"), ("gather", "linear")):
        assert schedule.own_offset == offsets[RANK] * 3 * 8  # bound where x lies


def test_x_inside_out_but_not_at_its_own_block_runs_unrecorded_and_right(comm):
    """x a block of out other than this rank's: the schedule recorded for x apart does not bind it."""
    out = np.empty((2 * N, 2))
    other = (RANK + 1) % N
    x = out[2 * other:2 * other + 2]
    for seed in range(4):
        blocks = [rank_input(seed, k, (2, 2), np.float64) for k in range(N)]
        out[...] = 0
        x[...] = blocks[RANK]
        assert comm.allgather(x, out=out, counts=[2] * N, algorithm="ring") is out
        assert_same(out, np.concatenate(blocks), f"call {seed}")
