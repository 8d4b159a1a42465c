"""The node-aware algorithms on virtual node maps (MPIRING_VIRTUAL_NODES), even and uneven nodes
and ranks not in node order, against NumPy on regenerated inputs and mpi4py's native collectives;
every form (recorded and replayed, nonblocking, persistent) and `auto`'s choice on several nodes.
The same tests run across the emulated cluster's real nodes (tests/run_world_sizes.py --cluster)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from mpi4py import MPI
from oracles import (
    all_inputs,
    assert_barrier_waits_for_all,
    assert_same,
    native_case,
    native_op,
    native_scan,
    native_supported,
    numpy_reduce,
    rank_input,
)

import mpiring
from mpiring.algorithms import ALGORITHMS

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
LENGTHS = sorted({0, 1, N, 13, 40_001})
ROOTS = sorted({0, N - 1, N // 2})
# "": the nodes MPI reports; then blocks, round-robin (ranks not in node order) and, where every
# rank shares one node (block sizes must add up to each node's ranks), uneven blocks
_SHARED = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
ONE_NODE = _SHARED.Get_size() == N
_SHARED.Free()
UNEVEN = [f"{N - 1},1", "1,2" + ",1" * (N - 3), "3"] if N >= 3 and ONE_NODE else []
SPECS = sorted({"", "2", "2:round-robin", *UNEVEN})
CASES = [(np.dtype(d), op) for d in ("float64", "int32", "float32") for op in ("sum", "max", "avg", "prod")
         if not (op == "avg" and d == "int32")]
# every op and every dtype once: their handling does not change with the world size, which 1-4
# ranks test in every pairing; 8 oversubscribed ranks test the maps and the algorithms
EACH_ONCE = [(np.dtype("float64"), "sum"), (np.dtype("int32"), "max"), (np.dtype("float32"), "avg"),
             (np.dtype("float64"), "prod")]
if N >= 8:
    CASES = EACH_ONCE
NODE_AWARE = {c: [a for a in table if a.startswith("node_")] for c, table in ALGORITHMS.items()}


@pytest.fixture(params=SPECS, ids=lambda spec: f"nodes={spec or 'mpi'}")
def nodes_comm(request, monkeypatch):
    monkeypatch.setenv("MPIRING_VIRTUAL_NODES", request.param)
    with mpiring.Communicator() as comm:
        yield comm


def _same_everywhere(result: np.ndarray, what: str) -> None:
    bits = WORLD.allgather(result.tobytes())
    assert all(b == bits[0] for b in bits), f"{what}: ranks got different bits"


def test_the_node_map_covers_every_rank_once(nodes_comm):
    nodes = nodes_comm._ring.nodes
    assert sorted(r for node in nodes.nodes for r in node) == list(range(N))
    assert WORLD.allgather(nodes.nodes) == [nodes.nodes] * N  # every rank sees the same map
    assert nodes.leaders == tuple(node[0] for node in nodes.nodes)


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["allreduce"], "auto"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_allreduce(nodes_comm, case, algorithm):
    dtype, op = case
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, dtype, op)
        out = np.empty_like(inputs[RANK])
        for run in range(3):  # seen, recorded, replayed
            got = nodes_comm.allreduce(inputs[RANK], op=op, algorithm=algorithm, out=out if run else None)
            what = f"allreduce {algorithm} {op} {dtype} len {length} run {run}"
            assert_same(got, numpy_reduce(op, inputs), what)
        _same_everywhere(got, what)
        native = native_case("allreduce", seed, length, dtype, op)
        if native is not None:
            assert_same(got, native, f"allreduce {algorithm} {op} {dtype} len {length} vs MPI")
        in_place = inputs[RANK].copy()
        assert nodes_comm.allreduce(in_place, op=op, algorithm=algorithm, out=in_place) is in_place
        assert_same(in_place, numpy_reduce(op, inputs), f"in-place {what}")


@pytest.mark.parametrize("case", EACH_ONCE, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_allreduce_node_pipelined_in_many_segments(nodes_comm, monkeypatch, case):
    """Segments of 248 bytes per rank or less: dozens to hundreds of them in flight through the pipeline,
    uneven in length, every form (at 8 ranks, whose segments are twice as long, dozens: each step
    there is many turns on the cores). Each op and dtype once: test_allreduce pairs them all on
    this algorithm; here the segments' arithmetic is under test."""
    monkeypatch.setattr(importlib.import_module("mpiring.algorithms.allreduce_node_pipelined"), "PIECE_BYTES", 62)
    dtype, op = case
    for seed, length in enumerate((4_001 if N < 8 else 1_001, 249, 250)):
        inputs = all_inputs(seed, N, length, dtype, op)
        want = numpy_reduce(op, inputs)
        out = np.empty_like(inputs[RANK])
        for run in range(3):  # seen, recorded, replayed
            got = nodes_comm.allreduce(inputs[RANK], op=op, algorithm="node_pipelined", out=out if run else None)
            assert_same(got, want, f"node_pipelined {op} {dtype} len {length} run {run}")
        _same_everywhere(got, f"node_pipelined {op} {dtype} len {length}")
        in_place = inputs[RANK].copy()
        nodes_comm.allreduce(in_place, op=op, algorithm="node_pipelined", out=in_place)
        assert_same(in_place, want, f"in-place node_pipelined {op} {dtype} len {length}")
        assert_same(nodes_comm.iallreduce(inputs[RANK], op=op, algorithm="node_pipelined").wait(), want, "iallreduce")
        x = inputs[RANK].copy()
        request = nodes_comm.allreduce_init(x, out=out, op=op, algorithm="node_pipelined")
        for run in range(2):
            request.start()
            request.wait()
            assert_same(out, want, f"persistent node_pipelined {op} {dtype} len {length} run {run}")


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["allreduce"], "auto"])
def test_allreduce_nonblocking_and_persistent(nodes_comm, algorithm):
    inputs = all_inputs(7, N, 1001, np.dtype("float64"), "sum")
    want = numpy_reduce("sum", inputs)
    assert_same(nodes_comm.iallreduce(inputs[RANK], algorithm=algorithm).wait(), want, "iallreduce")
    x, out = inputs[RANK].copy(), np.empty_like(inputs[RANK])
    request = nodes_comm.allreduce_init(x, out=out, algorithm=algorithm)
    for run in range(3):
        x[:] = inputs[RANK] * (run + 1)
        request.start()
        request.wait()
        assert_same(out, want * (run + 1), f"persistent run {run}")


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["broadcast"], "auto"])
@pytest.mark.parametrize("root", ROOTS)
def test_broadcast(nodes_comm, algorithm, root):
    for seed, length in enumerate(LENGTHS):
        want = all_inputs(seed, N, length, np.dtype("float32"))[root]
        x = want.copy() if RANK == root else np.zeros_like(want)
        for run in range(3):
            got = nodes_comm.broadcast(x, root=root, algorithm=algorithm)
            assert_same(got, want, f"broadcast {algorithm} root {root} len {length} run {run}")
        assert_same(nodes_comm.broadcast(x, root=root, algorithm=algorithm, out=x), want, "in place")
        native = x.copy()
        WORLD.Bcast(native, root=root)
        assert_same(native, want, "MPI's broadcast")


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["reduce"], "auto"])
@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_reduce(nodes_comm, algorithm, root, case):
    dtype, op = case
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, dtype, op)
        for run in range(3):
            got = nodes_comm.reduce(inputs[RANK], op=op, root=root, algorithm=algorithm)
            what = f"reduce {algorithm} {op} {dtype} root {root} len {length} run {run}"
            if RANK == root:
                assert_same(got, numpy_reduce(op, inputs), what)
            else:
                assert got is None, what
        native = native_case("reduce", seed, length, dtype, op, root)
        if native is not None:
            assert_same(got, native, f"{what} vs MPI")


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["allgather"], "auto"])
def test_allgather(nodes_comm, algorithm):
    """Even, ragged and empty chunks, with and without counts= (the layout round then runs first)."""
    for seed, rows_of in enumerate((lambda r: 2, lambda r: r % 3, lambda r: 0 if r == 1 else 20_001 // N)):
        rows = [rows_of(r) for r in range(N)]
        inputs = [rank_input(seed, r, (rows[r], 3), np.float32) for r in range(N)]
        want = np.concatenate(inputs)
        out = np.empty_like(want)
        for run in range(3):
            got = nodes_comm.allgather(inputs[RANK], algorithm=algorithm)
            assert_same(got, want, f"allgather {algorithm} rows {rows} run {run}")
            got = nodes_comm.allgather(inputs[RANK], algorithm=algorithm, counts=rows, out=out)
            assert_same(got, want, f"allgather {algorithm} rows {rows} counts= run {run}")
        assert_same(np.concatenate(WORLD.allgather(inputs[RANK])), want, "mpi4py's allgather")


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["barrier"], "auto"])
def test_barrier(nodes_comm, tmp_path_factory, algorithm):
    """No rank leaves before every rank has entered: each leaves a file first, and after the
    barrier every rank sees every file of that round."""
    directory = WORLD.bcast(str(tmp_path_factory.mktemp(f"barrier-{algorithm}")) if RANK == 0 else None, root=0)
    assert_barrier_waits_for_all(lambda: nodes_comm.barrier(algorithm=algorithm), directory)


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["alltoall"], "auto"])
def test_alltoall(nodes_comm, algorithm):
    """Equal blocks of 0, 1 and several rows, every block told apart by its source and destination."""
    for rows in (0, 1, 3):
        x = np.stack([np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + 1000 * RANK + 10 * d
                      for d in range(N)]).reshape(N * rows, 2)
        want = np.stack([np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + 1000 * s + 10 * RANK
                         for s in range(N)]).reshape(N * rows, 2)
        out = np.empty_like(x)
        for run in range(3):
            got = nodes_comm.alltoall(x, algorithm=algorithm)
            assert_same(got, want, f"alltoall {algorithm} rows {rows} run {run}")
            assert_same(nodes_comm.alltoall(x, algorithm=algorithm, out=out), want, f"out= run {run}")
        native = np.empty_like(x)
        WORLD.Alltoall(x, native)
        assert_same(native, want, "mpi4py's Alltoall")


# uneven row counts, some empty: every rank's, then all on one rank, then large parts
RAGGED = [[(3 * r + 1) % 4 for r in range(N)], [0] * (N - 1) + [5], [20_001 // N + r for r in range(N)]]


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["gather"], "auto"])
@pytest.mark.parametrize("root", ROOTS)
def test_gather(nodes_comm, algorithm, root):
    """Ragged and empty blocks, with and without counts= (the layout round then runs first)."""
    for seed, rows in enumerate(RAGGED):
        inputs = [rank_input(seed, r, (rows[r], 3), np.float32) for r in range(N)]
        want = np.concatenate(inputs)
        out = np.empty_like(want) if RANK == root else None
        for run in range(3):  # seen, recorded, replayed
            what = f"gather {algorithm} root {root} rows {rows} run {run}"
            got = nodes_comm.gather(inputs[RANK], root=root, algorithm=algorithm)
            got_counts = nodes_comm.gather(inputs[RANK], root=root, algorithm=algorithm, counts=rows, out=out)
            if RANK == root:
                assert_same(got, want, what)
                assert got_counts is out
                assert_same(got_counts, want, f"{what} counts=")
            else:
                assert got is None and got_counts is None, what
        native = WORLD.gather(inputs[RANK], root=root)
        if RANK == root:
            assert_same(np.concatenate(native), want, "mpi4py's gather")


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["scatter"], "auto"])
@pytest.mark.parametrize("root", ROOTS)
def test_scatter(nodes_comm, algorithm, root):
    """numpy.array_split's parts and ragged counts=, some empty; the header round runs first
    without counts=."""
    for seed, rows in enumerate(RAGGED):
        whole = rank_input(seed, root, (sum(rows), 3), np.float64)
        x = whole if RANK == root else None
        even = np.array_split(whole, N)[RANK]
        lo = sum(rows[:RANK])
        mine = whole[lo : lo + rows[RANK]]
        out = np.empty_like(mine)
        for run in range(3):
            what = f"scatter {algorithm} root {root} rows {rows} run {run}"
            assert_same(nodes_comm.scatter(x, root=root, algorithm=algorithm), even, what)
            got = nodes_comm.scatter(x, root=root, algorithm=algorithm, counts=rows, out=out)
            assert got is out
            assert_same(got, mine, f"{what} counts=")
        native = WORLD.scatter(np.split(whole, np.cumsum(rows)[:-1]) if RANK == root else None, root=root)
        assert_same(native, mine, "mpi4py's scatter")


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["reduce_scatter"], "auto"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_reduce_scatter(nodes_comm, case, algorithm):
    """numpy.array_split's parts (against MPI's Reduce_scatter too) and ragged counts=."""
    dtype, op = case
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, (length, 2), dtype, op)
        want = np.array_split(numpy_reduce(op, inputs), N)[RANK]
        for run in range(3):
            got = nodes_comm.reduce_scatter(inputs[RANK], op=op, algorithm=algorithm)
            assert_same(got, want, f"reduce_scatter {algorithm} {op} {dtype} len {length} run {run}")
        native = native_case("reduce_scatter", seed, (length, 2), dtype, op)
        if native is not None:
            assert_same(got, native, f"reduce_scatter {algorithm} {op} {dtype} len {length} vs MPI")
    for seed, counts in enumerate(RAGGED):
        inputs = all_inputs(seed, N, (sum(counts), 2), dtype, op)
        lo = sum(counts[:RANK])
        want = numpy_reduce(op, inputs)[lo : lo + counts[RANK]]
        out = np.empty_like(want)
        for run in range(3):
            got = nodes_comm.reduce_scatter(inputs[RANK], op=op, counts=counts, out=out, algorithm=algorithm)
            assert got is out
            assert_same(got, want, f"reduce_scatter {algorithm} {op} {dtype} counts={counts} run {run}")
        if native_supported(dtype, op):
            native = np.empty_like(want)
            WORLD.Reduce_scatter(inputs[RANK], native, [2 * c for c in counts], native_op(op, dtype))
            if op == "avg":
                native = np.true_divide(native, N).astype(dtype)
            assert_same(got, native, f"reduce_scatter {algorithm} {op} {dtype} counts={counts} vs MPI")


@pytest.mark.parametrize("algorithm", [*NODE_AWARE["scan"], "auto"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_scan_and_exscan(nodes_comm, case, algorithm):
    """On maps whose nodes are not in rank order the node-aware scan runs a flat one: the same results."""
    dtype, op = case
    for seed, length in enumerate(LENGTHS):
        inputs = all_inputs(seed, N, length, dtype, op)
        out = np.empty_like(inputs[RANK])
        for run in range(3):
            what = f"scan {algorithm} {op} {dtype} len {length} run {run}"
            got = nodes_comm.scan(inputs[RANK], op=op, algorithm=algorithm, out=out if run else None)
            assert_same(got, numpy_reduce(op, inputs[: RANK + 1]), what)
            got_ex = nodes_comm.exscan(inputs[RANK], op=op, algorithm=algorithm)
            if RANK == 0:
                assert got_ex is None, f"ex{what}"
            else:
                assert_same(got_ex, numpy_reduce(op, inputs[:RANK]), f"ex{what}")
        native = native_scan(inputs[RANK], op, exclusive=False)
        if native is not None:
            assert_same(got, native, f"scan {algorithm} {op} {dtype} len {length} vs MPI")
        native = native_scan(inputs[RANK], op, exclusive=True)
        if native is not None:
            assert_same(got_ex, native, f"exscan {algorithm} {op} {dtype} len {length} vs MPI")


@pytest.mark.parametrize("algorithm", ["node_leader", "auto"])
def test_rooted_and_scans_nonblocking_and_persistent(nodes_comm, algorithm):
    """gather, scatter, reduce_scatter, scan and exscan in flight together, then as persistent
    requests started three times on new data."""
    rows = RAGGED[0]
    x = rank_input(3, RANK, (rows[RANK], 2), np.float64)
    whole = np.concatenate([rank_input(3, r, (rows[r], 2), np.float64) for r in range(N)])
    inputs = all_inputs(4, N, (2 * N + 1, 2), np.dtype("int32"))
    total = numpy_reduce("sum", inputs)
    root = N - 1
    requests = [nodes_comm.igather(x, root=root, algorithm=algorithm),
                nodes_comm.iscatter(whole if RANK == root else None, root=root, counts=rows, out=np.empty_like(x),
                                    algorithm=algorithm),
                nodes_comm.ireduce_scatter(inputs[RANK], algorithm=algorithm),
                nodes_comm.iscan(inputs[RANK], algorithm=algorithm),
                nodes_comm.iexscan(inputs[RANK], algorithm=algorithm)]
    gathered, scattered, reduced, scanned, exscanned = [r.wait() for r in reversed(requests)][::-1]
    if RANK == root:
        assert_same(gathered, whole, "igather")
    assert_same(scattered, x, "iscatter")
    assert_same(reduced, np.array_split(total, N)[RANK], "ireduce_scatter")
    assert_same(scanned, numpy_reduce("sum", inputs[: RANK + 1]), "iscan")
    assert exscanned is None if RANK == 0 else np.array_equal(exscanned, numpy_reduce("sum", inputs[:RANK]))
    y = inputs[RANK].copy()
    out_rs = np.empty_like(np.array_split(total, N)[RANK])
    out_scan, out_ex = np.empty_like(y), np.empty_like(y)
    xs, out_gather, out_scatter = x.copy(), np.empty_like(whole), np.empty_like(x)
    wholes = whole.copy()
    persistent = [nodes_comm.gather_init(xs, root=root, out=out_gather if RANK == root else None, counts=rows,
                                         algorithm=algorithm),
                  nodes_comm.scatter_init(wholes if RANK == root else None, root=root, out=out_scatter, counts=rows,
                                          algorithm=algorithm),
                  nodes_comm.reduce_scatter_init(y, out=out_rs, algorithm=algorithm),
                  nodes_comm.scan_init(y, out=out_scan, algorithm=algorithm),
                  nodes_comm.exscan_init(y, out=out_ex, algorithm=algorithm)]
    for run in range(3):
        y[:] = inputs[RANK] * (run + 1)
        xs[:], wholes[:] = x * (run + 1), whole * (run + 1)
        for request in persistent:
            request.start()
        for request in persistent:
            request.wait()
        if RANK == root:
            assert_same(out_gather, whole * (run + 1), f"persistent gather run {run}")
        assert_same(out_scatter, x * (run + 1), f"persistent scatter run {run}")
        assert_same(out_rs, np.array_split(total, N)[RANK] * (run + 1), f"persistent reduce_scatter run {run}")
        assert_same(out_scan, numpy_reduce("sum", inputs[: RANK + 1]) * (run + 1), f"persistent scan run {run}")
        if RANK:
            assert_same(out_ex, numpy_reduce("sum", inputs[:RANK]) * (run + 1), f"persistent exscan run {run}")


def test_auto_runs_node_aware_algorithms_on_several_nodes(monkeypatch):
    """On a map of several nodes with several ranks on some, `auto` records node-aware
    algorithms for the collectives that have them; on one node, flat ones."""
    monkeypatch.setenv("MPIRING_VIRTUAL_NODES", "2")
    x = np.ones(1 << 16)
    with mpiring.Communicator() as comm:
        for _ in range(2):
            comm.allreduce(x)
            comm.broadcast(x)
            comm.reduce_scatter(x)
        hierarchical = comm._ring.nodes.hierarchical
        if ONE_NODE:  # two virtual nodes, of several ranks from 3 ranks on
            assert hierarchical is (N >= 3)
        for collective in ("allreduce", "broadcast", "reduce_scatter"):  # allgather's layout round is tested above
            chosen = comm.plan_of(collective, x).call.algorithm
            assert chosen.startswith("node_") is hierarchical, (collective, chosen)
        # a small scatter crosses once into each other node; a large one runs the flat choice
        for rows in (N, 1 << 14):
            whole = np.ones(rows) if RANK == 0 else None
            counts = [len(part) for part in np.array_split(np.empty(rows), N)]
            mine = np.empty(counts[RANK])
            for _ in range(2):
                comm.scatter(whole, out=mine, counts=counts)
            chosen = comm.plan_of("scatter", whole, mine, counts=counts).call.algorithm
            assert chosen.startswith("node_") is (hierarchical and rows == N), (rows, chosen)
