"""The mpi4py drop-in (mpiring.buffer_api): every uppercase call on an mpiring Communicator
against the same call on mpi4py's COMM_WORLD, on identical fresh inputs, comparing every buffer
the call was given (so untouched parts, gaps between blocks and receive buffers off the root
must match too). As mpi4py's own tests do: every dtype mpi4py maps, every root, in-place in
each form, empty buffers; world sizes 1, 2, 3, 4, 5 and 8 (tests/run_world_sizes.py)."""

from __future__ import annotations

import numpy as np
import pytest
from exporters import DeviceOnly, DLPackOnly, LegacyDLPack
from mpi4py import MPI
from oracles import assert_same, rank_input

import mpiring

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()

# every dtype mpi4py maps to an MPI datatype that mpiring moves (float16: MPICH's MPIX_C_FLOAT16)
DTYPES = [np.dtype(d) for d in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                                "float16", "float32", "float64", "complex64", "complex128")]
# (index, dtype, root) cases of the rooted tests: every dtype and every root, each twice, paired
# differently (the whole product costs minutes at 8 ranks on 2 cores)
ROOTED = [(k, DTYPES[k % len(DTYPES)], (k // 2) % N) for k in range(2 * max(len(DTYPES), N))]
OPS = [(MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MIN, "min"), (MPI.MAX, "max"), (MPI.LAND, "land"),
       (MPI.LOR, "lor"), (MPI.LXOR, "lxor"), (MPI.BAND, "band"), (MPI.BOR, "bor"), (MPI.BXOR, "bxor")]


def native_op_valid(op, dtype) -> bool:
    """Whether MPI defines `op` on `dtype` (the oracle must accept it)."""
    kind = dtype.kind
    if op in (MPI.SUM, MPI.PROD):
        return kind in "iufc"
    if op in (MPI.MIN, MPI.MAX):
        return kind in "iuf"
    if op in (MPI.LAND, MPI.LOR, MPI.LXOR):
        return kind in "biu"
    return kind in "iu"


OP_CASES = [(op, name, d) for op, name in OPS for d in DTYPES if native_op_valid(op, d)]


def _arrays(spec):
    """Every NumPy array inside a call's arguments (specs nest them in lists and tuples)."""
    if isinstance(spec, np.ndarray):
        return [spec]
    if isinstance(spec, (list, tuple)):
        return [a for part in spec for a in _arrays(part)]
    return []


def same(method: str, make, comm, what: str = "", form: str = "blocking", compare: bool = True) -> None:
    """Run comm.<method> and WORLD.<method> on two fresh copies of make()'s arguments and compare
    every array they hold afterwards (unless not `compare`: a result MPI leaves undefined). form:
    blocking, the I-form, or the persistent *_init form (started twice, with new send contents
    the second time, against the blocking native call)."""
    mine, theirs = make(), make()
    if form == "blocking":
        getattr(comm, method)(*mine)
    elif form == "nonblocking":
        request = getattr(comm, "I" + method[0].lower() + method[1:])(*mine)
        request.Test()  # progress, never blocking (spinning on it would starve the other ranks on few cores)
        request.Wait()
    else:
        request = getattr(comm, method + "_init")(*mine)
        for _ in range(2):
            request.Start()
            request.Wait()
            getattr(WORLD, method)(*theirs)
            fresh = _arrays(make())
            for k, (a, b) in enumerate(zip(_arrays(mine), _arrays(theirs), strict=True)):
                if compare:
                    assert_same(a, b, f"{method}_init {what} array {k}")
                a[...] = b[...] = fresh[k][::-1]  # new contents (still small numbers) for the next start
        request.Free()
        return
    getattr(WORLD, method)(*theirs)
    for k, (a, b) in enumerate(zip(_arrays(mine), _arrays(theirs), strict=True)):
        if compare:
            assert_same(a, b, f"{method} ({form}) {what} array {k}")


def data(seed: int, rank: int, n: int, dtype, op: str = "sum") -> np.ndarray:
    return rank_input(seed, rank, n, dtype, op)


def typed(a: np.ndarray):
    """The predefined MPI datatype mpi4py maps the array's dtype to (the very handle it infers
    for a bare array: mpi4py refuses reductions whose send and receive handles differ)."""
    return MPI._typedict[a.dtype.char]


def spec_forms(a: np.ndarray, count: int | None = None, displ: int = 0) -> list:
    """The same message in each of mpi4py's forms."""
    count = a.size - displ if count is None else count
    forms = [[a, typed(a)], [a, count, typed(a)], [a, (count, displ), typed(a)]]
    return forms if displ or count != a.size else [a, *forms]


@pytest.fixture(scope="module")
def comm():
    with mpiring.Communicator() as c:
        yield c


FORMS = ["blocking", "nonblocking", "persistent"]


@pytest.mark.parametrize("form", FORMS)
def test_bcast(comm, form):
    for i, dtype, root in ROOTED:
        n = (7 * i + root) % 11

        def make(n=n, root=root, dtype=dtype, i=i):
            a = data(i, RANK, n + 2, dtype) if RANK == root else np.zeros(n + 2, dtype)
            forms = spec_forms(a, n, 1)  # a window in the middle: the edges stay untouched
            return (forms[(i + root) % len(forms)], root)

        same("Bcast", make, comm, f"{dtype} root {root}", form)


@pytest.mark.parametrize("form", FORMS)
def test_reduce_and_allreduce(comm, form):
    """Every op on every dtype MPI defines it for; every root; in-place as IN_PLACE and None."""
    for i, (op, name, dtype) in enumerate(OP_CASES):
        n = (5 * i) % 9
        root = i % N
        in_place = (None, MPI.IN_PLACE, "buffer")[i % 3]

        def reduce_args(n=n, dtype=dtype, name=name, op=op, root=root, i=i):
            x = data(i, RANK, n, dtype, name)
            out = np.full(n, 3, dtype)
            return (spec_forms(x)[i % 2], [out, typed(out)], op, root)

        def allreduce_args(n=n, dtype=dtype, name=name, op=op, i=i, in_place=in_place):
            x = data(i, RANK, n, dtype, name)
            if in_place != "buffer":
                return (in_place, x, op)
            return (x, np.zeros(n, dtype), op)

        same("Reduce", reduce_args, comm, f"{name} {dtype} root {root}", form)
        same("Allreduce", allreduce_args, comm, f"{name} {dtype} {in_place}", form)

        def reduce_in_place(n=n, dtype=dtype, name=name, op=op, root=root, i=i):
            x = data(i, RANK, n, dtype, name)
            if RANK == root:
                return (MPI.IN_PLACE, x, op, root)
            return (x, None, op, root)  # the receive buffer is ignored off the root

        same("Reduce", reduce_in_place, comm, f"in place {name} {dtype} root {root}", form)


@pytest.mark.parametrize("form", FORMS)
def test_scan_and_exscan(comm, form):
    """Every op on every dtype; Exscan's rank 0 result, undefined in MPI, is not compared."""
    for i, (op, name, dtype) in enumerate(OP_CASES):
        n = i % 5
        in_place = i % 3  # 0: buffers, 1: IN_PLACE, 2: None

        def args(n=n, dtype=dtype, name=name, op=op, i=i, in_place=in_place):
            x = data(i, RANK, n, dtype, name)
            if in_place:
                return ((MPI.IN_PLACE, None)[in_place - 1], [x, typed(x)], op)
            return (spec_forms(x)[i % 2], np.zeros(n, dtype), op)

        same("Scan", args, comm, f"{name} {dtype} in_place {in_place}", form)
        same("Exscan", args, comm, f"{name} {dtype} in_place {in_place}", form, compare=RANK > 0)


@pytest.mark.parametrize("form", FORMS)
def test_alltoall_and_alltoallv(comm, form):
    for i, dtype in enumerate(DTYPES):
        n = i % 3  # elements per block, 0 included
        in_place = i % 3  # 0: buffers, 1: IN_PLACE, 2: None

        def alltoall(n=n, dtype=dtype, i=i, in_place=in_place):
            x = data(i, RANK, N * n, dtype)
            if in_place:
                return ((MPI.IN_PLACE, None)[in_place - 1], [x, n, typed(x)])  # a count per rank, as MPI's
            return ([x, typed(x)], np.zeros(N * n, dtype))

        def alltoallv(dtype=dtype, i=i, in_place=in_place):
            if in_place:  # one layout for both directions: the counts must be symmetric
                sends = receives = [(RANK + j + i) % 3 for j in range(N)]
            else:
                sends = [(RANK + 2 * j + i) % 3 for j in range(N)]
                receives = [(j + 2 * RANK + i) % 3 for j in range(N)]
            gaps = [sum(receives[:j]) + j for j in range(N)]  # a gap before each block
            out = np.zeros(sum(receives) + N, dtype)
            if in_place:
                out[:] = data(i, RANK, out.size, dtype)
                return ((MPI.IN_PLACE, None)[in_place - 1], [out, (receives, gaps), typed(out)])
            x = data(i, RANK, sum(sends), dtype)
            reverse = [sum(sends[j + 1 :]) for j in range(N)]  # blocks in reverse rank order
            send = [x, (sends, reverse if i % 2 else None), typed(x)]
            return (send, [out, (receives, gaps), typed(out)])

        same("Alltoall", alltoall, comm, f"{dtype} in_place {in_place}", form)
        same("Alltoallv", alltoallv, comm, f"{dtype} in_place {in_place}", form)


def _same_array_cases(seed: int, dtype):
    """(method, make) pairs: make(aliased) gives a call's arguments with the same array as both
    buffers (aliased) or with MPI.IN_PLACE in its place, on the same fresh data."""
    root = seed % N
    counts = [(k + seed) % 3 + 1 for k in range(N)]  # no zero: the receive count differs from the input's
    displs = [sum(counts[:k]) + k for k in range(N)]  # a gap after each block
    length = displs[-1] + counts[-1] + 1

    def filled(n):
        return data(seed, RANK, n, dtype)

    def send(a, aliased):
        return a if aliased else MPI.IN_PLACE

    return [
        ("Reduce_scatter", lambda aliased: (lambda a: (send(a, aliased), a, counts, MPI.SUM))(filled(sum(counts)))),
        ("Reduce_scatter_block", lambda aliased: (lambda a: (send(a, aliased), [a, typed(a)], MPI.SUM))(
            filled(2 * N))),
        ("Allgather", lambda aliased: (lambda a: (send(a, aliased), a))(filled(2 * N))),
        ("Allgatherv", lambda aliased: (lambda a: (send(a, aliased), [a, (counts, displs), typed(a)]))(
            filled(length))),
        ("Gather", lambda aliased: (lambda a: (send(a, aliased), a, root) if RANK == root else (
            a[:2], None, root))(filled(2 * N))),
        ("Gatherv", lambda aliased: (lambda a: (send(a, aliased), [a, (counts, displs)], root) if RANK == root else (
            a[: counts[RANK]], None, root))(filled(length))),
        ("Scatter", lambda aliased: (lambda a: (a, send(a, aliased), root) if RANK == root else (
            None, a[:3], root))(filled(3 * N))),
        ("Scatterv", lambda aliased: (lambda a: ([a, (counts, displs)], send(a, aliased), root) if RANK == root else (
            None, a[: counts[RANK]], root))(filled(length))),
    ]


@pytest.mark.parametrize("form", FORMS)
def test_the_same_array_as_both_buffers_is_in_place(comm, form):
    """MPI forbids aliased buffers; mpiring takes them as in place: the same array as send and
    receive buffer gives what MPI.IN_PLACE gives natively (every buffer compared)."""
    x = data(3, RANK, 10, np.int64)
    want = x.copy()
    WORLD.Allreduce(MPI.IN_PLACE, want, MPI.SUM)
    comm.Allreduce(x, x, MPI.SUM)
    assert_same(x, want, "Allreduce(x, x)")
    for seed, dtype in enumerate((np.int64, np.float32, np.complex128)):
        for method, make in _same_array_cases(seed, dtype):
            mine, theirs = make(True), make(False)
            if form == "blocking":
                getattr(comm, method)(*mine)
            elif form == "nonblocking":
                getattr(comm, "I" + method[0].lower() + method[1:])(*mine).Wait()
            else:
                request = getattr(comm, method + "_init")(*mine)
                request.Start()
                request.Wait()
                request.Free()
            getattr(WORLD, method)(*theirs)
            distinct = list({id(a): a for a in _arrays(mine)}.values())  # the aliased array once
            for k, (a, b) in enumerate(zip(distinct, _arrays(theirs), strict=True)):
                assert_same(a, b, f"{method}({form}) with the same array twice, {dtype}, array {k}")


@pytest.mark.parametrize("form", FORMS)
def test_gather_allgather_scatter(comm, form):
    for i, dtype, root in ROOTED:
        n = (i + 2 * root) % 4  # elements per rank, 0 included
        in_place = (root + i) % 3  # 0: buffers, 1: IN_PLACE, 2: None

        def gather(n=n, root=root, dtype=dtype, i=i, in_place=in_place):
            x = data(i, RANK, n, dtype)
            out = np.zeros(N * n, dtype)
            if RANK == root:
                if in_place:
                    out[RANK * n : (RANK + 1) * n] = x
                    return ((MPI.IN_PLACE, None)[in_place - 1], [out, typed(out)], root)
                return (x, out, root)
            return (x, [out, typed(out)] if i % 2 else None, root)

        def allgather(n=n, dtype=dtype, i=i, in_place=in_place):
            x = data(i, RANK, n, dtype)
            out = np.zeros(N * n + 1, dtype)
            if in_place:
                out[RANK * n : (RANK + 1) * n] = x
            else:
                x = [x, n, typed(x)]
                return ((MPI.IN_PLACE, None)[in_place - 1], [out, n, typed(out)])  # a count per rank, as MPI's
            return (x, [out, (n, 1), typed(out)])

        def scatter(n=n, root=root, dtype=dtype, i=i, in_place=in_place):
            x = data(i, root, N * n, dtype) if RANK == root else np.zeros(N * n, dtype)
            out = np.zeros(n + 1, dtype)
            if RANK == root and in_place:
                return ([x, typed(x)], (MPI.IN_PLACE, None)[in_place - 1], root)
            return ([x, typed(x)] if RANK == root else None, [out, n, typed(out)], root)

        what = f"{dtype} root {root} in_place {in_place}"
        same("Gather", gather, comm, what, form)
        same("Allgather", allgather, comm, what, form)
        same("Scatter", scatter, comm, what, form)


def _layout(seed: int):
    """Uneven counts (some 0) and displacements: packed, with gaps, or in reverse rank order."""
    counts = [(3 * k + seed) % 4 for k in range(N)]
    style = seed % 3
    if style == 0:
        displs = [sum(counts[:k]) for k in range(N)]
    elif style == 1:
        displs = [sum(counts[:k]) + 2 * k + 1 for k in range(N)]
    else:
        displs = [sum(counts[k + 1 :]) for k in range(N)]
    return counts, displs, max((d + c for d, c in zip(displs, counts, strict=True)), default=0) + 1


@pytest.mark.parametrize("form", FORMS)
def test_v_variants(comm, form):
    for i, dtype, root in ROOTED:
        seed = i + root
        counts, displs, length = _layout(seed)
        in_place = seed % 2 == 1

        def gatherv(root=root, dtype=dtype, seed=seed, in_place=in_place):
            counts, displs, length = _layout(seed)
            x = data(seed, RANK, counts[RANK], dtype)
            out = np.zeros(length, dtype)
            if RANK == root and in_place:
                out[displs[RANK] : displs[RANK] + counts[RANK]] = x
                return (MPI.IN_PLACE, [out, (counts, displs), typed(out)], root)
            spec = [out, (counts, displs), typed(out)] if RANK == root or seed % 3 else None
            return (x, spec, root)

        def allgatherv(dtype=dtype, seed=seed, in_place=in_place):
            counts, displs, length = _layout(seed)
            x = data(seed, RANK, counts[RANK], dtype)
            out = np.zeros(length, dtype)
            if in_place:
                out[displs[RANK] : displs[RANK] + counts[RANK]] = x
                return (MPI.IN_PLACE, [out, counts, displs, typed(out)])
            return (x, [out, (counts, displs), typed(out)])

        def scatterv(root=root, dtype=dtype, seed=seed, in_place=in_place):
            counts, displs, length = _layout(seed)
            x = data(seed, root, length, dtype) if RANK == root else np.zeros(length, dtype)
            out = np.zeros(counts[RANK] + 1, dtype)
            send = [x, (counts, displs), typed(x)] if RANK == root else None
            if RANK == root and in_place:
                return (send, MPI.IN_PLACE, root)
            return (send, [out, counts[RANK], typed(out)], root)

        what = f"{dtype} root {root} counts {counts} displs {displs} in_place {in_place}"
        same("Gatherv", gatherv, comm, what, form)
        same("Allgatherv", allgatherv, comm, what, form)
        same("Scatterv", scatterv, comm, what, form)


@pytest.mark.parametrize("form", FORMS)
def test_reduce_scatter_block_and_reduce_scatter(comm, form):
    for i, (op, name, dtype) in enumerate(OP_CASES[::2]):
        n = i % 3  # each rank's block, 0 included
        counts = [(k + i) % 3 for k in range(N)]
        in_place = i % 3  # 0: buffers, 1: IN_PLACE, 2: None

        def block(n=n, dtype=dtype, name=name, op=op, i=i, in_place=in_place):
            x = data(i, RANK, N * n, dtype, name)
            if in_place:
                return ((MPI.IN_PLACE, None)[in_place - 1], [x, typed(x)], op)
            return (x, np.zeros(n, dtype), op)

        def vector(dtype=dtype, name=name, op=op, i=i, in_place=in_place, counts=counts):
            x = data(i, RANK, sum(counts), dtype, name)
            if in_place:
                return ((MPI.IN_PLACE, None)[in_place - 1], x, counts, op)
            if i % 2 and form != "persistent":  # recvcounts left out: each rank's receive count is all-gathered
                return (x, np.zeros(counts[RANK], dtype), None, op)
            return (x, [np.zeros(counts[RANK] + 1, dtype), counts[RANK], typed(x)], counts, op)

        same("Reduce_scatter_block", block, comm, f"{name} {dtype} block {n} in_place {in_place}", form)
        same("Reduce_scatter", vector, comm, f"{name} {dtype} counts {counts} in_place {in_place}", form)


def test_byte_views_and_fortran_order(comm):
    """A datatype other than the array's reinterprets its bytes, as MPI does; Fortran-ordered
    arrays are sent in memory order."""
    x = data(1, RANK, 8, np.float64)

    def as_bytes():
        return ([x.copy(), MPI.BYTE], [np.zeros(8 * N, np.float64), MPI.BYTE])

    same("Allgather", as_bytes, comm, "as MPI.BYTE")

    def fortran():
        a = np.asfortranarray(data(2, RANK, (3, 4), np.int32))
        return (a, np.zeros((4, 3), np.int32, order="F"), MPI.SUM)

    same("Allreduce", fortran, comm, "Fortran order")


def test_empty_everywhere(comm):
    for method, args in (
        ("Bcast", lambda: (np.zeros(0),)),
        ("Allreduce", lambda: (np.zeros(0), np.zeros(0))),
        ("Reduce", lambda: (np.zeros(0), np.zeros(0))),
        ("Gather", lambda: (np.zeros(0), np.zeros(0))),
        ("Allgather", lambda: (np.zeros(0), np.zeros(0))),
        ("Scatter", lambda: (np.zeros(0), np.zeros(0))),
        ("Reduce_scatter_block", lambda: (np.zeros(0), np.zeros(0))),
        ("Reduce_scatter", lambda: (np.zeros(0), np.zeros(0), [0] * N)),
        ("Allgatherv", lambda: (np.zeros(0), [np.zeros(0), [0] * N])),
        ("Alltoall", lambda: (np.zeros(0), np.zeros(0))),
        ("Alltoallv", lambda: ([np.zeros(0), [0] * N], [np.zeros(0), [0] * N])),
        ("Scan", lambda: (np.zeros(0), np.zeros(0))),
    ):
        for form in FORMS:
            same(method, args, comm, "empty", form)


def test_barrier_and_communicator_calls(comm):
    assert (comm.Get_rank(), comm.Get_size()) == (WORLD.Get_rank(), WORLD.Get_size())
    comm.Barrier()
    comm.Ibarrier().Wait()
    request = comm.Barrier_init()
    for _ in range(2):
        request.Start()
        request.Wait()
    request.Free()
    twin = comm.Dup()
    try:
        x = np.full(3, RANK, np.int64)
        out = np.zeros(3, np.int64)
        twin.Allreduce(x, out)
        assert_same(out, np.full(3, N * (N - 1) // 2, np.int64), "Allreduce on a Dup")
        assert twin.timeout == comm.timeout
    finally:
        twin.Free()
    with pytest.raises(mpiring.CommunicatorFreedError):
        twin.Barrier()


def test_many_requests_in_flight(comm):
    """Several I-form calls at once, completed with Waitall and Testall."""
    from mpiring.buffer_api import Request

    xs = [data(k, RANK, 5, np.float64) for k in range(3)]
    outs = [np.zeros(5) for _ in xs]
    gathered = np.zeros(5 * N)
    requests = [comm.Iallreduce(x, out, op) for x, out, op in zip(xs, outs, (MPI.SUM, MPI.MAX, MPI.MIN), strict=True)]
    requests.append(comm.Iallgather(xs[0], gathered))
    Request.Waitall(requests[:2])
    while not Request.Testall(requests):
        pass
    for x, out, op in zip(xs, outs, (MPI.SUM, MPI.MAX, MPI.MIN), strict=True):
        want = np.zeros(5)
        WORLD.Allreduce(x, want, op)
        assert_same(out, want, f"Iallreduce {op.Get_name() if hasattr(op, 'Get_name') else op}")
    want = np.zeros(5 * N)
    WORLD.Allgather(xs[0], want)
    assert_same(gathered, want, "Iallgather")


# Alltoallw: the datatype of the block from rank i to rank j (symmetric, so both ends agree),
# long double and MPI.BYTE among them
W_TYPES = [MPI.INT, MPI.DOUBLE, MPI.SHORT, MPI.LONG_DOUBLE, MPI.C_DOUBLE_COMPLEX, MPI.BYTE]


def _raw_bytes(seed: int, n: int) -> np.ndarray:
    """Arbitrary bytes: every byte a block moves, padding included, is compared."""
    return np.random.default_rng([seed, RANK, 7]).integers(0, 256, n).astype(np.uint8)


def _byte_layout(counts: list[int], types: list, gap: int, reverse: bool) -> tuple[list[int], int]:
    """Byte displacements of blocks `gap` bytes apart (unaligned), in rank order or reversed."""
    displs, at = [0] * N, gap
    for j in reversed(range(N)) if reverse else range(N):
        displs[j] = at
        at += counts[j] * types[j].Get_size() + gap
    return displs, at


@pytest.mark.parametrize("form", FORMS)
def test_alltoallv_of_a_counts_list(comm, form):
    """[array, counts, datatype] with counts a list, the commonest v-spec (read at once): uneven
    and empty blocks, the array's own datatype or its bytes, a tail the blocks leave alone."""
    for i, dtype in enumerate((np.float32, np.int64, np.complex128)):
        sends = [(RANK + 2 * j + i) % 3 for j in range(N)]
        receives = [(j + 2 * RANK + i) % 3 for j in range(N)]
        for datatype in (typed(np.zeros(1, dtype)), MPI.BYTE):
            scale = np.dtype(dtype).itemsize if datatype is MPI.BYTE else 1
            same("Alltoallv", lambda dtype=dtype, i=i, sends=sends, receives=receives, datatype=datatype, scale=scale: (
                [data(i, RANK, sum(sends) + 1, dtype), [c * scale for c in sends], datatype],
                [np.zeros(sum(receives) + 2, dtype), [c * scale for c in receives], datatype]),
                comm, f"{dtype} {datatype}", form)


@pytest.mark.parametrize("form", FORMS)
def test_alltoallw(comm, form):
    """Per-peer counts, datatypes and byte displacements (gaps, reverse order, unaligned), the
    pair and the four-item spec, the two-item one, and in place; against mpi4py's
    Alltoallw on the same bytes."""
    for seed in range(4):
        in_place = seed == 3

        def args(seed=seed, in_place=in_place):
            def count(i, j):  # elements from rank i to rank j
                return (i + j + seed) % 3 if in_place else (i + 2 * j + seed) % 3

            def kind(i, j):
                return W_TYPES[(i + j + seed) % len(W_TYPES)]

            receive_counts, receive_types = [count(j, RANK) for j in range(N)], [kind(j, RANK) for j in range(N)]
            receive_displs, receive_length = _byte_layout(receive_counts, receive_types, 1, reverse=True)
            received = _raw_bytes(seed + 100, receive_length + 2)
            receive = [received, (receive_counts, receive_displs), receive_types]
            if in_place:
                return (MPI.IN_PLACE, receive)
            send_counts, send_types = [count(RANK, j) for j in range(N)], [kind(RANK, j) for j in range(N)]
            send_displs, send_length = _byte_layout(send_counts, send_types, 3, reverse=False)
            sent = _raw_bytes(seed, send_length)
            send = [sent, send_counts, send_displs, send_types] if seed % 2 else [sent, (send_counts, send_displs),
                                                                                   send_types]
            return (send, receive)

        same("Alltoallw", args, comm, f"seed {seed} in_place {in_place}", form)

    def one_type(form=form):  # [buf, datatypes]: one element from byte 0 to every rank
        x = data(5, RANK, 1, np.int32)
        return ([x, [MPI.INT] * N], [np.zeros(N + 1, np.int32), ([1] * N, [4 * j for j in range(N)]), [MPI.INT] * N])

    same("Alltoallw", one_type, comm, "one element from byte 0", form)


LONG_DOUBLES = [(np.longdouble, MPI.LONG_DOUBLE), (np.clongdouble, MPI.C_LONG_DOUBLE_COMPLEX)]


@pytest.mark.parametrize("form", FORMS)
def test_long_double_moves(comm, form):
    """MPI.LONG_DOUBLE and MPI.C_LONG_DOUBLE_COMPLEX (and bare long double arrays) in the
    collectives that do not reduce, against mpi4py's native calls."""
    for seed, (dtype, datatype) in enumerate(LONG_DOUBLES):
        root = seed % N

        def bcast(dtype=dtype, datatype=datatype, root=root, seed=seed):
            a = data(seed, RANK, 5, dtype) if RANK == root else np.zeros(5, dtype)
            return ([a, (3, 1), datatype], root)

        def allgather(dtype=dtype, datatype=datatype, seed=seed):
            return (data(seed, RANK, 2, dtype), [np.zeros(2 * N, dtype), datatype])

        def gatherv(dtype=dtype, datatype=datatype, seed=seed, root=root):
            counts, displs, length = _layout(seed + 1)
            out = np.zeros(length, dtype)
            return ([data(seed, RANK, counts[RANK], dtype), datatype], [out, (counts, displs), datatype], root)

        def scatterv(dtype=dtype, datatype=datatype, seed=seed, root=root):
            counts, displs, length = _layout(seed + 1)
            x = data(seed, root, length, dtype)
            return ([x, (counts, displs), datatype], [np.zeros(counts[RANK], dtype), datatype], root)

        def alltoall(dtype=dtype, seed=seed):
            return (data(seed, RANK, 2 * N, dtype), np.zeros(2 * N, dtype))

        what = f"{np.dtype(dtype)}"
        same("Bcast", bcast, comm, what, form)
        same("Allgather", allgather, comm, what, form)
        same("Gatherv", gatherv, comm, what, form)
        same("Scatterv", scatterv, comm, what, form)
        same("Alltoall", alltoall, comm, what, form)


def _committed(datatype):
    datatype.Commit()
    return datatype


# derived datatypes whose elements lie at one stride: (name, datatype, dtype, instances in one view)
DERIVED = [
    ("contiguous", _committed(MPI.INT.Create_contiguous(3)), np.int32, 2),
    ("vector", _committed(MPI.DOUBLE.Create_vector(4, 1, 3)), np.float64, 1),
    ("vector of whole blocks", _committed(MPI.FLOAT.Create_vector(2, 3, 3)), np.float32, 2),
    ("hvector", _committed(MPI.SHORT.Create_hvector(3, 1, 6)), np.int16, 1),
    ("indexed block from element 1", _committed(MPI.INT64_T.Create_indexed_block(1, [1, 3, 5])), np.int64, 1),
    ("struct of one type", _committed(MPI.Datatype.Create_struct([2, 1], [0, 8], [MPI.INT, MPI.INT])), np.int32, 2),
]


def _positions(datatype, count: int, dtype, span: int) -> np.ndarray:
    """The elements `count` instances of `datatype` cover, in typemap order, as native MPI reads
    them (a send to itself of an array holding each element's own index)."""
    index = np.arange(span).astype(dtype)
    packed = np.zeros(datatype.Get_size() * count // np.dtype(dtype).itemsize, dtype)
    MPI.COMM_SELF.Sendrecv([index, count, datatype], 0, 0, [packed, typed(packed)], 0, 0)
    return packed.astype(np.int64)


def _run_form(comm, method: str, args: tuple, form: str) -> None:
    if form == "blocking":
        getattr(comm, method)(*args)
    elif form == "nonblocking":
        getattr(comm, "I" + method[0].lower() + method[1:])(*args).Wait()
    else:
        request = getattr(comm, method + "_init")(*args)
        request.Start()
        request.Wait()
        request.Free()


@pytest.mark.parametrize("form", FORMS)
def test_derived_datatypes(comm, form):
    """Contiguous, vector, hvector, indexed-block and struct datatypes of one element type, as
    strided views: data movement against mpi4py's native calls with the same datatypes (every
    buffer compared, so the gaps between elements must stay untouched); reductions, which MPICH
    does not define on derived datatypes, against NumPy at the elements native MPI reads."""
    for seed, (name, datatype, dtype, count) in enumerate(DERIVED):
        elements = datatype.Get_size() // np.dtype(dtype).itemsize  # per instance
        span = (datatype.lb + count * datatype.extent) // np.dtype(dtype).itemsize + 1
        root = seed % N

        def bcast(datatype=datatype, dtype=dtype, root=root, seed=seed, count=count, span=span):
            a = data(seed, RANK, span, dtype) if RANK == root else np.zeros(span, dtype)
            return ([a, count, datatype], root)

        def gather(datatype=datatype, dtype=dtype, seed=seed, count=count, span=span, root=root, elements=elements):
            flat = np.zeros(N * count * elements + 1, dtype)
            return ([data(seed, RANK, span, dtype), count, datatype], [flat, count * elements, typed(flat)], root)

        def scatter(datatype=datatype, dtype=dtype, seed=seed, count=count, span=span, root=root,
                    elements=elements):
            flat = data(seed, root, N * count * elements, dtype)
            return ([flat, typed(flat)], [np.zeros(span, dtype), count, datatype], root)

        what = f"{name} x{count}"
        same("Bcast", bcast, comm, what, form)
        same("Gather", gather, comm, what, form)
        same("Scatter", scatter, comm, what, form)

        at = _positions(datatype, count, dtype, span)
        out = np.full(span, 7, dtype)
        _run_form(comm, "Allreduce", ([data(seed, RANK, span, dtype), count, datatype], [out, count, datatype],
                                      MPI.SUM), form)
        want = np.full(span, 7, dtype)
        want[at] = np.sum([data(seed, k, span, dtype)[at] for k in range(N)], axis=0, dtype=dtype)
        assert_same(out, want, f"Allreduce ({form}) {what}")

        if count == 2:  # several instances in one view: v-variants and recvcounts count instances
            same("Allgatherv", lambda datatype=datatype, dtype=dtype, seed=seed, elements=elements: (
                [data(seed, RANK, (RANK % 2 + 1) * elements, dtype), (RANK % 2 + 1), datatype],
                [np.zeros((2 * N + 1) * elements, dtype), ([k % 2 + 1 for k in range(N)],
                                                           [2 * k + 1 for k in range(N)]), datatype]),
                 comm, what, form)
            same("Alltoallv", lambda datatype=datatype, dtype=dtype, seed=seed, elements=elements: (
                [data(seed, RANK, N * elements, dtype), ([1] * N, None), datatype],
                [np.zeros(N * elements, dtype), ([1] * N, None), datatype]), comm, what, form)
            # these instances are contiguous: the same call on plain elements is the oracle
            counts = [k % 2 + 1 for k in range(N)]
            x = data(seed, RANK, sum(counts) * elements, dtype)
            out = np.zeros(counts[RANK] * elements, dtype)
            _run_form(comm, "Reduce_scatter", ([x, datatype], [out, datatype], counts, MPI.SUM), form)
            want = np.zeros_like(out)
            WORLD.Reduce_scatter(x, want, [c * elements for c in counts], MPI.SUM)
            assert_same(out, want, f"Reduce_scatter ({form}) {what}")


@pytest.mark.parametrize("form", FORMS)
def test_dlpack_buffers_with_a_datatype(comm, form):
    """A DLPack host object in a spec that names its datatype reads and writes its memory."""
    def args():
        x, out = data(4, RANK, 6, np.float64), np.zeros(6)
        return ([DLPackOnly(x), MPI.DOUBLE], [DLPackOnly(out), 6, MPI.DOUBLE], MPI.SUM), (x, out)

    (mine, (_, out)), (_, (x, want)) = args(), args()
    if form == "blocking":
        comm.Allreduce(*mine)
    elif form == "nonblocking":
        comm.Iallreduce(*mine).Wait()
    else:
        request = comm.Allreduce_init(*mine)
        request.Start()
        request.Wait()
        request.Free()
    WORLD.Allreduce(x, want, MPI.SUM)
    assert_same(out, want, f"Allreduce ({form}) of DLPack objects")


def test_dlpack_buffers_without_a_datatype_bring_their_own(comm):
    """A DLPack host object (a CPU tensor, a JAX array) in a spec without a datatype is read with
    the dtype its DLPack export gives, as mpi4py reads it."""
    x, out = data(4, RANK, 6, np.float32), np.zeros(6, np.float32)
    comm.Allreduce(DLPackOnly(x), DLPackOnly(out), MPI.SUM)
    want = np.empty(6, np.float32)
    WORLD.Allreduce(x, want, MPI.SUM)
    assert_same(out, want, "Allreduce of DLPack objects without a datatype")


def _user_op():
    return MPI.Op.Create(lambda a, b, t: None, commute=True)


BAD_CALLS = [
    ("MAXLOC", "op", lambda c: c.Allreduce(np.zeros(2), np.zeros(2), MPI.MAXLOC)),
    ("MINLOC", "op", lambda c: c.Reduce(np.zeros(2), np.zeros(2), MPI.MINLOC)),
    ("REPLACE", "op", lambda c: c.Reduce_scatter_block(np.zeros(N), np.zeros(1), MPI.REPLACE)),
    ("a user-defined", "op", lambda c: c.Allreduce(np.zeros(2), np.zeros(2), USER_OP)),
    ("MPI.Op", "op", lambda c: c.Allreduce(np.zeros(2), np.zeros(2), "sum")),
    ("derived datatype whose elements are not of one dtype at one stride", "sendbuf",
     lambda c: c.Allreduce([np.zeros(8), 1, MPI.DOUBLE.Create_vector(2, 2, 3)], np.zeros(4))),
    ("not evenly spaced", "buf", lambda c: c.Bcast([np.zeros(12), 2, UNEVEN])),
    ("dtlib cannot map", "buf", lambda c: c.Bcast([np.zeros(8), 1, MPI.DOUBLE.Create_resized(0, 16)])),
    ("pair types", "buf", lambda c: c.Bcast([np.zeros(4, np.int32), MPI.TWOINT])),
    ("MPI_FLOAT_INT", "sendbuf", lambda c: c.Allreduce([np.zeros(4), MPI.FLOAT_INT], np.zeros(4), MPI.SUM)),
    ("reductions of MPI_LONG_DOUBLE", "recvbuf",
     lambda c: c.Allreduce([np.zeros(2, np.longdouble), MPI.LONG_DOUBLE], [np.zeros(2, np.longdouble),
                                                                            MPI.LONG_DOUBLE])),
    ("reductions of long double", "recvbuf", lambda c: c.Scan(np.zeros(2, np.clongdouble),
                                                              np.zeros(2, np.clongdouble))),
    ("device buffers are not supported", "buf", lambda c: c.Bcast(DeviceOnly())),
    ("DLPack buffers without a datatype", "buf", lambda c: c.Bcast(LegacyDLPack(np.zeros(2)))),
    ("MPI.BOTTOM", "sendbuf", lambda c: c.Alltoallw([MPI.BOTTOM, ([1] * N, [0] * N), [MPI.INT] * N],
                                                    [np.zeros(N, np.int32), ([1] * N, [4 * k for k in range(N)]),
                                                     [MPI.INT] * N])),
    ("one per rank", "recvbuf", lambda c: c.Alltoallw([np.zeros(N), MPI.DOUBLE],
                                                      [np.zeros(N), ([1] * N, [0] * N), [MPI.DOUBLE] * (N + 1)])),
    ("runs past", "recvbuf", lambda c: c.Alltoallw([np.zeros(N), [MPI.DOUBLE] * N],
                                                   [np.zeros(N), ([1] * N, [8 * N] * N), [MPI.DOUBLE] * N])),
    ("derived datatype in Alltoallw", "recvbuf",
     lambda c: c.Alltoallw([np.zeros(2 * N), [MPI.DOUBLE] * N],
                           [np.zeros(2 * N), ([1] * N, [16 * k for k in range(N)]), [DERIVED[0][1]] * N])),
    ("not contiguous", "buf", lambda c: c.Bcast(np.zeros((4, 4))[:, 1])),
    ("runs past", "buf", lambda c: c.Bcast([np.zeros(4), 5, MPI.DOUBLE])),
    ("runs past", "buf", lambda c: c.Bcast([np.zeros(4), (3, 2), MPI.DOUBLE])),
    ("whole number", "buf", lambda c: c.Bcast([np.zeros(3, np.int8), MPI.INT])),
    ("not a buffer", "buf", lambda c: c.Bcast(object())),
    ("equal blocks" if N > 1 else "takes", "recvbuf" if N > 1 else "sendbuf",
     lambda c: c.Allgather(np.zeros(1), np.zeros(2 * N + 1 if N > 1 else 0))),
    ("other buffer takes", "sendbuf", lambda c: c.Allgather(np.zeros(2), np.zeros(N))),
    ("other buffer takes", "sendbuf", lambda c: c.Allreduce(np.zeros(3), np.zeros(2))),
    ("datatype int32 but the other buffer float64", "sendbuf",
     lambda c: c.Allreduce(np.zeros(2, np.int32), np.zeros(2))),
    ("one per rank", "recvbuf", lambda c: c.Allgatherv(np.zeros(1), [np.zeros(N + 1), [1] * (N + 1)])),
    ("runs past", "recvbuf", lambda c: c.Allgatherv(np.zeros(1), [np.zeros(N), ([1] * N, [N] * N)])),
    ("non-negative", "recvbuf", lambda c: c.Allgatherv(np.zeros(1), [np.zeros(N), [-1] * N])),
    ("recvcounts", "recvcounts", lambda c: c.Reduce_scatter(MPI.IN_PLACE, np.zeros(N))),
    ("one per rank", "recvcounts", lambda c: c.Reduce_scatter(np.zeros(N), np.zeros(1), [1] * (N + 1))),
    ("needs an integer", "op", lambda c: c.Allreduce(np.zeros(2), np.zeros(2), MPI.BAND)),
    ("Info", "info", lambda c: c.Allreduce_init(np.zeros(2), np.zeros(2), MPI.SUM, "info")),
    ("MAXLOC", "op", lambda c: c.Scan(np.zeros(2), np.zeros(2), MPI.MAXLOC)),
    ("datatype", "sendbuf", lambda c: c.Alltoallv([np.zeros(N, np.int64), [1] * N], [np.zeros(N), [1] * N])),
    ("runs past", "recvbuf", lambda c: c.Alltoallv([np.zeros(N), [1] * N], [np.zeros(N), [2] * N])),
    ("datatype", "sendbuf", lambda c: c.Alltoallv([np.zeros(N, np.int64), [1] * N, MPI.INT64_T],
                                                  [np.zeros(N), [1] * N, MPI.DOUBLE])),
    ("runs past", "recvbuf", lambda c: c.Alltoallv([np.zeros(N), [1] * N, MPI.DOUBLE],
                                                   [np.zeros(N), [2] * N, MPI.DOUBLE])),
    ("non-negative", "recvbuf", lambda c: c.Alltoallv([np.zeros(N), [1] * N, MPI.DOUBLE],
                                                      [np.zeros(N), [-1] * N, MPI.DOUBLE])),
    ("one per rank", "sendbuf", lambda c: c.Alltoallv([np.zeros(N + 1), [1] * (N + 1), MPI.DOUBLE],
                                                      [np.zeros(N), [1] * N, MPI.DOUBLE])),
]
USER_OP = None
UNEVEN = _committed(MPI.DOUBLE.Create_indexed_block(1, [0, 2, 4]))  # extent 5: two instances are not one stride


@pytest.mark.parametrize("bad", BAD_CALLS, ids=[f"{b[1]}-{k}" for k, b in enumerate(BAD_CALLS)])
def test_bad_specs_raise_on_every_rank_before_any_message(comm, bad):
    global USER_OP
    if USER_OP is None:
        USER_OP = _user_op()
    words, argument, call = bad
    comm.traffic.reset()
    with pytest.raises(mpiring.ArgumentError, match=words) as raised:
        call(comm)
    assert raised.value.argument == argument
    assert comm.traffic.messages == 0
    out = np.zeros(2)
    comm.Allreduce(np.ones(2), out)  # the communicator still works
    assert_same(out, np.full(2, float(N)), "Allreduce after a refused call")


@pytest.mark.skipif(N < 2, reason="needs a root and another rank")
def test_root_only_buffers_are_ignored_elsewhere(comm):
    """Off the root, Gather/Reduce ignore recvbuf and Scatter ignores sendbuf, whatever they are."""
    root = N - 1
    junk = "anything" if RANK != root else None
    out = np.zeros(N, np.int32) if RANK == root else junk
    comm.Gather(np.full(1, RANK, np.int32), out, root=root)
    if RANK == root:
        assert_same(out, np.arange(N, dtype=np.int32), "Gather")
    got = np.zeros(1, np.int32)
    comm.Scatter(np.arange(N, dtype=np.int32) if RANK == root else junk, got, root=root)
    assert_same(got, np.array([RANK], np.int32), "Scatter")
    total = np.zeros(1) if RANK == root else junk
    comm.Reduce(np.ones(1), total, MPI.SUM, root=root)
    if RANK == root:
        assert_same(total, np.array([float(N)]), "Reduce")
