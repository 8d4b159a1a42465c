"""Every collective x op x dtype x root x length against two independent oracles: NumPy on
inputs every rank regenerates, and mpi4py's native collective on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from oracles import (
    DTYPES,
    all_inputs,
    assert_barrier_waits_for_all,
    assert_same,
    native_case,
    native_op,
    native_supported,
    numpy_reduce,
    op_cases,
    rank_input,
)

import mpiring
from mpiring import collectives
from mpiring.algorithms import ALGORITHMS

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
BIG = 70_001  # elements: past the MPI libraries' eager limits for every dtype but the 1-byte ones
LENGTHS = sorted({0, 1, max(N - 1, 0), N, N + 1, 13, 37, BIG})
ROOTS = sorted({0, N - 1, N // 2})
OP_CASES = op_cases(N)


def algorithms(collective: str) -> pytest.MarkDecorator:
    """Run a test once per algorithm of `collective` (every algorithm meets the same oracle)."""
    return pytest.mark.parametrize("algorithm", list(ALGORITHMS[collective]))


def _case_id(case) -> str:
    dtype, op = case
    return f"{dtype.name}-{op}"


@algorithms('allreduce')
@pytest.mark.parametrize("case", OP_CASES, ids=_case_id)  # (applied first: it varies slowest, see native_case)
def test_allreduce(comm, case, algorithm):
    dtype, op = case
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, dtype, op)
        got = comm.allreduce(inputs[RANK], op=op, algorithm=algorithm)
        assert_same(got, numpy_reduce(op, inputs), f"allreduce {algorithm} {op} {dtype} len {length} vs numpy")
        native = native_case("allreduce", seed, length, dtype, op)
        if native is not None:
            assert_same(got, native, f"allreduce {op} {dtype} len {length} vs MPI")


@algorithms('reduce')
@pytest.mark.parametrize("case", OP_CASES, ids=_case_id)  # (applied first: it varies slowest, see native_case)
def test_reduce(comm, case, algorithm):
    dtype, op = case
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, dtype, op)
        for root in ROOTS:
            got = comm.reduce(inputs[RANK], op=op, root=root, algorithm=algorithm)
            if RANK != root:
                assert got is None
            else:
                assert_same(got, numpy_reduce(op, inputs), f"reduce {op} {dtype} len {length} root {root}")
            native = native_case("reduce", seed, length, dtype, op, root)
            if native is not None:
                assert_same(got, native, f"reduce {op} {dtype} len {length} root {root} vs MPI")


@algorithms('allreduce')
def test_allreduce_in_place(comm, algorithm):
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, np.float64)
        x = inputs[RANK].copy()
        assert comm.allreduce(x, out=x, algorithm=algorithm) is x
        assert_same(x, numpy_reduce("sum", inputs), f"allreduce {algorithm} in place len {length}")


@algorithms('reduce')
def test_reduce_in_place(comm, algorithm):
    """out=x on the root: an algorithm that receives into the result must not overwrite the input
    before reducing it."""
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, np.float64)
        for root in ROOTS:
            x = inputs[RANK].copy()
            got = comm.reduce(x, root=root, out=x if RANK == root else None, algorithm=algorithm)
            if RANK == root:
                assert got is x
                assert_same(x, numpy_reduce("sum", inputs), f"reduce {algorithm} in place len {length} root {root}")


@algorithms('reduce_scatter')
@pytest.mark.parametrize("case", OP_CASES, ids=_case_id)  # (applied first: it varies slowest, see native_case)
def test_reduce_scatter(comm, case, algorithm):
    dtype, op = case
    for seed, rows in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, (rows, 2), dtype, op)
        got = comm.reduce_scatter(inputs[RANK], op=op, algorithm=algorithm)
        want = np.array_split(numpy_reduce(op, inputs), N)[RANK]
        assert_same(got, want, f"reduce_scatter {op} {dtype} rows {rows}")
        native = native_case("reduce_scatter", seed, (rows, 2), dtype, op)
        if native is not None:
            assert_same(got, native, f"reduce_scatter {op} {dtype} rows {rows} vs MPI")


@algorithms('reduce_scatter')
@pytest.mark.parametrize("case", OP_CASES[::3], ids=_case_id)
def test_reduce_scatter_counts(comm, case, algorithm):
    """counts= (MPI's recvcounts): uneven parts, some empty, all rows on one rank, large parts."""
    dtype, op = case
    layouts = [[(3 * k + 1) % 4 for k in range(N)], [0] * (N - 1) + [5], [BIG // N + k for k in range(N)]]
    for seed, counts in enumerate(layouts):
        inputs = all_inputs(seed, N, (sum(counts), 2), dtype, op)
        got = comm.reduce_scatter(inputs[RANK], op=op, counts=counts, algorithm=algorithm)
        lo = sum(counts[:RANK])
        want = numpy_reduce(op, inputs)[lo : lo + counts[RANK]]
        assert_same(got, want, f"reduce_scatter counts={counts} {op} {dtype}")
        if native_supported(dtype, op):
            native = np.empty((counts[RANK], 2), dtype)
            WORLD.Reduce_scatter(inputs[RANK], native, [2 * c for c in counts], native_op(op, dtype))
            if op == "avg":
                native = np.true_divide(native, N).astype(dtype)
            assert_same(got, native, f"reduce_scatter counts={counts} {op} {dtype} vs MPI")
    with pytest.raises(mpiring.ArgumentError, match="counts"):
        comm.reduce_scatter(np.ones((N + 1, 2)), counts=[1] * N)  # every rank raises before any message moves
    with pytest.raises(mpiring.ArgumentError, match="counts"):
        comm.reduce_scatter(np.ones((N, 2)), counts=[1] * (N + 1))


def _rows_of(rank: int, seed: int) -> int:
    """Uneven, sometimes empty, per-rank row counts for gather and allgather."""
    return (3 * rank + seed) % 5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@algorithms('allgather')
def test_allgather(comm, dtype, algorithm):
    for seed in range(4):
        blocks = [rank_input(seed, k, (_rows_of(k, seed), 3), dtype) for k in range(N)]
        got = comm.allgather(blocks[RANK], algorithm=algorithm)
        assert_same(got, np.concatenate(blocks), f"allgather {dtype} seed {seed}")
        native = np.empty_like(got)
        WORLD.Allgatherv(blocks[RANK], [native, [b.size for b in blocks]])
        assert_same(got, native, f"allgather {dtype} seed {seed} vs MPI")
    big = [rank_input(9, k, BIG + k, dtype) for k in range(N)]
    assert_same(comm.allgather(big[RANK], algorithm=algorithm), np.concatenate(big), f"allgather {dtype} large")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@algorithms('gather')
def test_gather(comm, dtype, algorithm):
    for seed in range(3):
        blocks = [rank_input(seed, k, (_rows_of(k, seed), 2, 2), dtype) for k in range(N)]
        for root in ROOTS:
            got = comm.gather(blocks[RANK], root=root, algorithm=algorithm)
            native = np.empty((sum(len(b) for b in blocks), 2, 2), dtype) if RANK == root else None
            WORLD.Gatherv(blocks[RANK], [native, [b.size for b in blocks]] if RANK == root else None, root=root)
            if RANK != root:
                assert got is None
                continue
            assert_same(got, np.concatenate(blocks), f"gather {dtype} seed {seed} root {root}")
            assert_same(got, native, f"gather {dtype} seed {seed} root {root} vs MPI")
    big = [rank_input(9, k, BIG - k, dtype) for k in range(N)]
    got = comm.gather(big[RANK], root=N - 1, algorithm=algorithm)
    if RANK == N - 1:
        assert_same(got, np.concatenate(big), f"gather {dtype} large")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@algorithms('scatter')
def test_scatter(comm, dtype, algorithm):
    for seed, rows in enumerate(LENGTHS):
        for root in ROOTS:
            full = rank_input(seed, root, (rows, 3), dtype)
            got = comm.scatter(full if RANK == root else None, root=root, algorithm=algorithm)
            part = np.array_split(full, N)[RANK]
            assert_same(got, part, f"scatter {dtype} rows {rows} root {root}")
            counts = [len(p) * 3 for p in np.array_split(full, N)]
            native = np.empty_like(part)
            WORLD.Scatterv([full, counts] if RANK == root else None, native, root=root)
            assert_same(got, native, f"scatter {dtype} rows {rows} root {root} vs MPI")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@algorithms('broadcast')
def test_broadcast(comm, dtype, algorithm):
    for seed, length in enumerate(LENGTHS):
        for root in ROOTS:
            data = rank_input(seed, root, (length, 2), dtype)
            mine = data if RANK == root else np.zeros_like(data)
            got = comm.broadcast(mine, root=root, algorithm=algorithm)
            assert_same(got, data, f"broadcast {dtype} len {length} root {root}")
            native = mine.copy()
            WORLD.Bcast(native, root=root)
            assert_same(got, native, f"broadcast {dtype} len {length} root {root} vs MPI")
            if RANK == root:
                assert got is not mine, "broadcast must not hand the root its own input back"


def test_broadcast_many_segments(comm):
    """Large enough for the pipelined broadcast to cut the data into several segments."""
    root = N // 2
    data = rank_input(3, 0, 600_001, np.float32)
    got = comm.broadcast(data if RANK == root else np.empty_like(data), root=root)
    want = rank_input(3, 0, 600_001, np.float32)
    assert_same(got, want, "broadcast 2.4 MB")


def test_zero_dimensional(comm):
    for dtype in (np.int64, np.float64, np.complex128):
        inputs = [np.array(rank_input(1, k, 1, dtype)[0]) for k in range(N)]
        assert_same(comm.allreduce(inputs[RANK]), numpy_reduce("sum", inputs), f"0-d allreduce {dtype}")
        got = comm.reduce(inputs[RANK], op="max" if dtype != np.complex128 else "sum", root=0)
        if RANK == 0:
            assert got.shape == ()
        assert_same(comm.broadcast(inputs[RANK], root=N - 1), inputs[N - 1], f"0-d broadcast {dtype}")


@pytest.mark.parametrize("shape", [(5, 4, 3), (N, 1), (2 * N + 1, 2, 2), (1, 7), (0, 3)], ids=str)
def test_multidimensional(comm, shape):
    inputs = all_inputs(7, N, shape, np.int32)
    total = numpy_reduce("sum", inputs)
    assert_same(comm.allreduce(inputs[RANK]), total, f"allreduce {shape}")
    assert_same(comm.reduce_scatter(inputs[RANK]), np.array_split(total, N)[RANK], f"reduce_scatter {shape}")
    assert_same(comm.allgather(inputs[RANK]), np.concatenate(inputs), f"allgather {shape}")
    assert_same(comm.scatter(inputs[0] if RANK == 0 else None), np.array_split(inputs[0], N)[RANK], "scatter")


def test_non_contiguous_inputs(comm):
    inputs = all_inputs(11, N, (40, 6), np.float64)
    views = [a[::2, 1::2] for a in inputs]  # strided: not C-contiguous
    assert not views[RANK].flags.c_contiguous
    assert_same(comm.allreduce(views[RANK]), numpy_reduce("sum", views), "allreduce strided")
    assert_same(comm.allgather(views[RANK]), np.concatenate(views), "allgather strided")
    assert_same(comm.broadcast(views[RANK], root=0), views[0], "broadcast strided")
    fortran = np.asfortranarray(inputs[RANK])
    assert_same(comm.allreduce(fortran), numpy_reduce("sum", inputs), "allreduce Fortran order")


def test_array_likes(comm):
    got = comm.allreduce([RANK, 1, 2.5])
    assert_same(got, np.array([sum(range(N)), N, 2.5 * N]), "allreduce of a list")
    assert_same(comm.allgather([[RANK, RANK]]), np.array([[k, k] for k in range(N)]), "allgather of a list")


def test_out_arguments(comm):
    inputs = all_inputs(5, N, (N + 3, 2), np.float64)
    total = numpy_reduce("sum", inputs)
    out = np.full_like(inputs[RANK], np.nan)
    assert comm.allreduce(inputs[RANK], out=out) is out
    assert_same(out, total, "allreduce out=")
    x = inputs[RANK].copy()
    assert comm.allreduce(x, out=x) is x  # in place
    assert_same(x, total, "allreduce in place")
    strided = np.full((N + 3, 4), np.nan)[:, ::2]  # a non-contiguous out= is filled too
    assert comm.allreduce(inputs[RANK], out=strided) is strided
    assert_same(strided, total, "allreduce strided out=")

    part = np.array_split(total, N)[RANK]
    out = np.full_like(part, np.nan)
    assert comm.reduce_scatter(inputs[RANK], out=out) is out
    assert_same(out, part, "reduce_scatter out=")

    out = np.full((N * (N + 3), 2), np.nan)
    assert comm.allgather(inputs[RANK], out=out) is out
    assert_same(out, np.concatenate(inputs), "allgather out=")

    for root in ROOTS:
        out = np.full_like(total, np.nan) if RANK == root else None
        got = comm.reduce(inputs[RANK], root=root, out=out)
        if RANK == root:
            assert got is out
            assert_same(out, total, "reduce out=")
        y = inputs[RANK].copy()
        assert comm.broadcast(y, root=root, out=y) is y
        assert_same(y, inputs[root], "broadcast in place")
        out = np.full((N * (N + 3), 2), np.nan) if RANK == root else None
        got = comm.gather(inputs[RANK], root=root, out=out)
        if RANK == root:
            assert got is out
            assert_same(out, np.concatenate(inputs), "gather out=")
        out = np.full_like(np.array_split(inputs[root], N)[RANK], np.nan)
        assert comm.scatter(inputs[root] if RANK == root else None, root=root, out=out) is out
        assert_same(out, np.array_split(inputs[root], N)[RANK], "scatter out=")


def test_out_overlapping_input(comm):
    """out= a view overlapping the input (not the input itself) must still give the right result."""
    inputs = all_inputs(8, N, 2 * N + 2, np.int64)
    buf = np.concatenate([inputs[RANK], np.zeros(2, np.int64)])
    got = comm.allreduce(buf[:-2], out=buf[2:])
    assert_same(got, numpy_reduce("sum", inputs), "allreduce out overlapping x")


@algorithms("barrier")
def test_barrier(comm, tmp_path_factory, algorithm):
    """No rank leaves the barrier before every rank has entered it: each rank leaves a file
    before entering; after leaving, every rank must see every file of that round."""
    directory = WORLD.bcast(str(tmp_path_factory.mktemp(f"barrier-{algorithm}")) if RANK == 0 else None, root=0)
    assert_barrier_waits_for_all(lambda: comm.barrier(algorithm=algorithm), directory)


def test_allgather_of_reduce_scatter_is_allreduce(comm):
    for rows in LENGTHS:
        for op in ("sum", "max", "avg"):
            x = rank_input(rows, RANK, (rows, 2), np.float64, op)
            assert_same(comm.allgather(comm.reduce_scatter(x, op=op)), comm.allreduce(x, op=op),
                        f"allgather(reduce_scatter) rows {rows} {op}")


def test_scatter_inverts_gather(comm):
    for rows in LENGTHS:
        full = rank_input(rows, 0, (rows, 2), np.int16)
        part = comm.scatter(full if RANK == 0 else None, root=0)
        back = comm.gather(part, root=0)
        if RANK == 0:
            assert_same(back, full, f"gather(scatter) rows {rows}")


@pytest.mark.parametrize("dtype", [np.dtype(d) for d in ("bool", "int16", "float32", "complex128")], ids=str)
@pytest.mark.parametrize("ndim", sorted({2, collectives.SLOT_DIMS, collectives.SLOT_DIMS + 1, 12}))
def test_scatter_without_counts_sends_small_blocks_in_the_header_slot(comm, dtype, ndim):
    """`auto` without counts= at a few ranks of one node: every block that fits comes in its rank's
    slot, with the header, in one message; larger ones follow it, and a shape of more dimensions
    than a slot holds comes in a whole header after it. The root's rows change from call to call
    across the slot's size, and each layout repeats, so the recorded schedules meet every change
    (a rank whose recorded header no longer matches finishes by the new one)."""
    inner = (1,) * (ndim - 2) + (3,)  # each row: 3 elements, in ndim - 1 dimensions
    row_bytes = 3 * dtype.itemsize
    room = collectives.SLOT_BYTES - collectives.SLOT_DATA
    fits = room // row_bytes * N  # the most rows whose blocks fit
    sequence = [0, 1, N, fits, fits + N, 13, BIG // 3, fits, 2, fits + 1]
    slots = collectives.slots_suit(comm._ring)
    for _ in range(3):  # each layout seen, recorded, replayed
        for seed, rows in enumerate(sequence):
            root = seed % N
            full = rank_input(seed, root, (rows, *inner), dtype)
            comm.traffic.reset()
            got = comm.scatter(full if RANK == root else None, root=root)
            sent = comm.traffic.messages
            part = np.array_split(full, N)[RANK]
            assert_same(got, part, f"scatter {dtype} rows {rows} root {root} ndim {ndim}")
            native = np.empty_like(part)
            WORLD.Scatterv([full, [len(b) * 3 for b in np.array_split(full, N)]] if RANK == root else None,
                           native, root=root)
            assert_same(got, native, f"scatter {dtype} rows {rows} root {root} ndim {ndim} vs MPI")
            in_slot = slots and ndim <= collectives.SLOT_DIMS and -(-rows // N) * row_bytes <= room
            if in_slot:  # the root's slots alone: one message to every other rank
                assert sent == (N - 1 if RANK == root else 0), f"rows {rows}: {sent} messages sent"


def _slot_round_messages(core_per_rank: bool) -> int:
    """The messages this rank sends in a layout round of slots alone: one to every other rank where
    they go directly, else those of an all-gather of one slot per rank by the algorithm the round
    uses (Bruck's on one node, the node-aware one across nodes)."""
    with mpiring.Communicator() as probe:
        probe._ring.core_per_rank = core_per_rank
        if collectives.slots_sent_directly(probe._ring):
            return N - 1
        slot = np.zeros((1, collectives.layout_slot_bytes(probe._ring)), np.uint8)
        probe.allgather(slot, counts=[1] * N, algorithm="node_leader" if probe._ring.nodes.hierarchical else "bruck")
        return probe.traffic.messages


@pytest.mark.parametrize("dtype", [np.dtype(d) for d in ("bool", "int16", "float32", "complex128")], ids=str)
@pytest.mark.parametrize("core_per_rank", [True, False], ids=["a core per rank", "ranks share cores"])
def test_gather_and_allgather_without_counts_send_small_blocks_in_the_layout_slots(dtype, core_per_rank):
    """Without counts= at a few ranks, every rank's slot with its layout record and, where every
    block fits, its block reaches every other: nothing else moves. On one node with a core per
    rank (or at 2 ranks) each rank sends every other its slot, in one round; where ranks share
    cores, Bruck's all-gather carries the slots (wider ones), and across nodes the node-aware one.
    Ranks pass rows that differ from rank to rank and from call to call, across the slot's size
    and empty, each layout repeated, so recorded schedules meet every change."""
    comm = mpiring.Communicator()
    comm._ring.core_per_rank = core_per_rank  # (as if the machine had the cores, or had not: alike on every rank)
    row_bytes = 3 * dtype.itemsize
    room = collectives.layout_slot_bytes(comm._ring) - collectives.LAYOUT_BYTES
    most = room // row_bytes  # the most rows a slot takes
    slots = collectives.layout_in_slots(comm._ring)
    messages = _slot_round_messages(core_per_rank) if slots else 0
    cases = [0, 1, most, most + 1, 7, BIG // 3, most]
    for repeat in range(3):  # each layout seen, recorded, replayed
        for seed, top in enumerate(cases):
            counts = [(top + k * seed) % (top + 1) if top else 0 for k in range(N)]
            blocks = [rank_input(seed, k, (counts[k], 3), dtype) for k in range(N)]
            whole = np.concatenate(blocks)
            root = seed % N
            got = comm.gather(blocks[RANK], root=root)
            if RANK == root:
                assert_same(got, whole, f"gather {dtype} counts {counts}")
            else:
                assert got is None
            got = comm.allgather(blocks[RANK])
            assert_same(got, whole, f"allgather {dtype} counts {counts}")
            native = np.empty_like(whole)
            WORLD.Allgatherv(blocks[RANK], [native, [c * 3 for c in counts]])
            assert_same(got, native, f"allgather {dtype} counts {counts} vs MPI")
            if repeat == 0 and slots and max(counts) <= most:
                # the slots alone (counted on a first call: a replay counts what its schedule recorded)
                with mpiring.Communicator() as fresh:
                    fresh._ring.core_per_rank = core_per_rank
                    fresh.gather(blocks[RANK], root=root)
                    assert fresh.traffic.messages == messages, f"gather, counts {counts}"
                    fresh.traffic.reset()
                    fresh.allgather(blocks[RANK])
                    assert fresh.traffic.messages == messages, f"allgather, counts {counts}"
    comm.free()


def test_communicator_wraps_subcommunicators():
    """A communicator over any intracomm: here the even and odd ranks, separately."""
    sub = WORLD.Split(RANK % 2, RANK)
    ring = mpiring.Communicator(sub)
    assert ring.mpi is sub and ring.size == sub.Get_size() and ring.rank == sub.Get_rank()
    members = [k for k in range(N) if k % 2 == RANK % 2]
    assert_same(ring.allreduce(np.array([RANK])), np.array([sum(members)]), "allreduce on a split comm")
    ring.free()
    sub.Free()
