"""The mpi4py drop-in (mpiring.buffer_api): every uppercase call on an mpiring Communicator
against the same call on mpi4py's COMM_WORLD, on identical fresh inputs, comparing every buffer
the call was given (so untouched parts, gaps between blocks and receive buffers off the root
must match too). As mpi4py's own tests do: every dtype mpi4py maps, every root, in-place in
each form, empty buffers; world sizes 1, 2, 3, 4, 5 and 8 (tests/run_world_sizes.py)."""

from __future__ import annotations

import numpy as np
import pytest
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


def _user_op():
    return MPI.Op.Create(lambda a, b, t: None, commute=True)


BAD_CALLS = [
    ("MAXLOC", "op", lambda c: c.Allreduce(np.zeros(2), np.zeros(2), MPI.MAXLOC)),
    ("MINLOC", "op", lambda c: c.Reduce(np.zeros(2), np.zeros(2), MPI.MINLOC)),
    ("REPLACE", "op", lambda c: c.Reduce_scatter_block(np.zeros(N), np.zeros(1), MPI.REPLACE)),
    ("a user-defined", "op", lambda c: c.Allreduce(np.zeros(2), np.zeros(2), USER_OP)),
    ("MPI.Op", "op", lambda c: c.Allreduce(np.zeros(2), np.zeros(2), "sum")),
    ("derived", "sendbuf", lambda c: c.Allreduce([np.zeros(4), MPI.DOUBLE.Create_contiguous(2)], np.zeros(4))),
    ("MPI_FLOAT_INT", "sendbuf", lambda c: c.Allreduce([np.zeros(4), MPI.FLOAT_INT], np.zeros(4), MPI.SUM)),
    ("MPI_LONG_DOUBLE", "buf", lambda c: c.Bcast([np.zeros(4), MPI.LONG_DOUBLE])),
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
]
USER_OP = None


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
