"""What each collective brings to the benchmark: one row per collective, nothing else.

As in nccl-tests (src/common.h), a collective supplies only its pieces and the harness
(`mpiring.bench.harness`) does the timing, checking and reporting once:

- `per_rank`: whether the size S counts every rank's block (S = count * typesize * n, count
  per rank) or one array (S = count * typesize);
- `bus_factor(n)`: busbw = algbw * bus_factor, nccl-tests' factors;
- `input_elems` / `output_elems`: buffer lengths on this rank (None: no buffer here);
- `ours` / `native`: one call of mpiring's collective and of mpi4py's own one;
- `plain`: mpiring's call as a first-time user writes it, without out= and counts= (`FORMS`);
- `message`: the `[buf, count, type]` of one buffer as mpi4py's OSU demos write it (the
  `dropin-mmap` form): count in elements of the MPI type, one rank's block, as MPI's count of a
  uniform collective is; alltoallv's `[buf, (counts, displs), type]`;
- `native_in_place`: mpi4py's call with `MPI.IN_PLACE` where MPI allows it (the `dropin-inplace`
  form, `InPlace`): the call, its receive buffer's length, and where the input goes before the
  call and the result is after it. None for broadcast (Bcast has no in-place form: its one buffer
  is already both) and barrier (no buffers): there the form is the `dropin` call;
- `ceiling`: for calls mpiring does not plan (device buffers; planned calls replay their plan's
  own messages instead, mpiring.bench.harness.ceiling), the point-to-point schedule of mpiring's
  ring algorithm for that collective, as a
  list of steps `(elements sent right | None, elements received from left | None)`. The harness
  replays it with bare Sendrecv/Send/Recv on preallocated buffers: no reduction, no Python
  bookkeeping, so its time is what the transport allows for the ring's messages.

Every ring algorithm sends only to its right neighbour (rank+1) and receives only from its left
(rank-1), which is why a step needs no peer ranks.

    | collective     | S (bytes)          | bus factor | ring schedule replayed as the ceiling       |
    | allreduce      | count*typesize     | 2(n-1)/n   | n-1 shifts of count/n chunks, twice         |
    | reduce_scatter | count*typesize*n   | (n-1)/n    | n-1 shifts of one block                     |
    | allgather      | count*typesize*n   | (n-1)/n    | n-1 shifts of one block                     |
    | reduce         | count*typesize     | 1          | n-1 shifts, then chunks chained to the root |
    | broadcast      | count*typesize     | 1          | segments pipelined down the chain           |
    | gather         | count*typesize*n   | (n-1)/n    | blocks chained to the root, farthest first  |
    | scatter        | count*typesize*n   | (n-1)/n    | blocks chained from the root, farthest first|
    | barrier        | 0                  | -          | a 0-byte token around the ring twice        |
    | alltoall       | count*typesize*n   | (n-1)/n    | n-1 shifts of one block (the pairwise       |
    | alltoallv      | count*typesize*n   | (n-1)/n    |   exchange's bytes and messages, to rank+1) |
    | scan, exscan   | count*typesize     | 1          | segments pipelined down the chain 0..n-1    |

alltoallv runs with even counts, given on both sides (no count exchange), against Alltoallv.
exscan's rank 0 has no result (MPI leaves it undefined), so its check skips that rank.

MPI.IN_PLACE, per collective (`native_in_place`; the receive buffer holds this rank's input
before the call, except where a send buffer is left):

    | collective     | call                                    | the input, before          | the result, after        |
    | reduce         | root: Reduce(IN_PLACE, recvbuf)         | root: in recvbuf           | root: recvbuf            |
    | allreduce      | Allreduce(IN_PLACE, recvbuf)            | in recvbuf                 | recvbuf                  |
    | gather         | root: Gather(IN_PLACE, recvbuf)         | root: its block of recvbuf | root: recvbuf            |
    | allgather      | Allgather(IN_PLACE, recvbuf)            | its block of recvbuf       | recvbuf                  |
    | scatter        | root: Scatter(sendbuf, IN_PLACE)        | root: in sendbuf           | root: its block, sendbuf |
    | reduce_scatter | Reduce_scatter_block(IN_PLACE, recvbuf) | in recvbuf (every block)   | its first block          |
    | alltoall(v)    | Alltoall(v)(IN_PLACE, recvbuf)          | in recvbuf                 | recvbuf                  |
    | scan, exscan   | (Ex)scan(IN_PLACE, recvbuf)             | in recvbuf                 | recvbuf                  |

The other ranks of the rooted ones call as in the `dropin` form (reduce, gather: their send
buffer; scatter: their receive buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy
from mpi4py import MPI

from mpiring.algorithms.scan_ring import SEGMENT_BYTES as SCAN_SEGMENT_BYTES
from mpiring.bench.options import UsageError
from mpiring.engine.partition import split_bounds
from mpiring.ops import AVG, BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MIN, PROD, SUM

# One ceiling step: elements sent to the right neighbour, elements received from the left one.
CeilingStep = tuple[int | None, int | None]
CeilingSchedule = Callable[[int, int, int, int, int], list[CeilingStep]]

# Segment size of the broadcast ceiling's pipelined chain. It mirrors the ring broadcast's
# segmenting (mpiring/algorithms/broadcast_ring.py) so the ceiling moves the same messages;
# if the core retunes its segments, retune this with it.
BROADCAST_SEGMENT_BYTES = 512 * 1024

# mpi4py's native reductions. mpiring's avg is a sum divided by n afterwards, so the native side
# runs a sum and the check divides (the division is not timed).
NATIVE_OPS = {SUM: MPI.SUM, PROD: MPI.PROD, MIN: MPI.MIN, MAX: MPI.MAX, AVG: MPI.SUM, BAND: MPI.BAND,
              BOR: MPI.BOR, BXOR: MPI.BXOR, LAND: MPI.LAND, LOR: MPI.LOR, LXOR: MPI.LXOR}
# NumPy reduces bools as logical or / and, but MPI allows only logical ops on C_BOOL.
NATIVE_BOOL_OPS = {SUM: MPI.LOR, PROD: MPI.LAND, MIN: MPI.LAND, MAX: MPI.LOR, BAND: MPI.LAND, BOR: MPI.LOR,
                   BXOR: MPI.LXOR, LAND: MPI.LAND, LOR: MPI.LOR, LXOR: MPI.LXOR}


@dataclass(frozen=True)
class Setup:
    """What a row's calls need, fixed for one collective and algorithm."""

    comm: Any  # mpiring.Communicator
    mpi: MPI.Intracomm  # the communicator the native collective runs on
    rank: int
    size: int
    root: int
    op: str
    algorithm: str | None
    mpi_type: MPI.Datatype
    mpi_op: MPI.Op


@dataclass
class Buffers:
    """One size's buffers. `x`/`ours` feed mpiring, `native_x`/`native` feed mpi4py.

    A buffer is None on ranks that have none (scatter's input and gather's result off the root).
    For in-place rows (broadcast) the input *is* the result: `x is ours`, `native_x is native`.
    A form may hold ready messages (lists) in place of the arrays (the dropin-mmap form's).
    """

    x: Any
    ours: Any
    native_x: Any
    native: Any
    counts: tuple[int, ...] = ()  # every rank's block, in elements (as MPI's uniform collectives know it)


def _scale(setup: Setup, itemsize: int) -> int:
    """MPI's count of one element: the data movers' type is MPI.BYTE."""
    return itemsize if setup.mpi_type == MPI.BYTE else 1


def _message(setup: Setup, buf: Any, itemsize: int, counts: tuple[int, ...]) -> list:
    """[buf, count, type], count one rank's block (MPI's count of a uniform collective)."""
    return [buf, counts[setup.rank] * _scale(setup, itemsize), setup.mpi_type]


def _message_v(setup: Setup, buf: Any, itemsize: int, counts: tuple[int, ...]) -> list:
    """A v-variant's [buf, (counts, displs), type], as mpi4py's OSU alltoallv demo writes it."""
    scaled = [c * _scale(setup, itemsize) for c in counts]
    return [buf, (scaled, [sum(scaled[:k]) for k in range(len(scaled))]), setup.mpi_type]


@dataclass(frozen=True)
class InPlace:
    """A collective's call with MPI.IN_PLACE, as a mpi4py program writes it (the dropin-inplace form)."""

    # the call: `native` is the receive buffer that holds the input (None where this rank has
    # none), `native_x` the send buffer where one is left (scatter's root; reduce's and gather's
    # other ranks)
    call: Callable[[Setup, Buffers], Any]
    # (count, n, at_root) -> the receive buffer's length in elements; None: no buffer on this rank
    elems: Callable[[int, int, bool], int | None]
    # (setup, x, receive buffer) -> puts this rank's input x where the call reads it, and returns
    # where the call leaves this rank's result (None: no result on this rank)
    stage: Callable[[Setup, Any, Any], Any]


@dataclass(frozen=True)
class Collective:
    """One collective's entry in the benchmark table (see the module docstring)."""

    name: str
    per_rank: bool
    bus_factor: Callable[[int], float]
    # (count, n, at_root) -> this rank's buffer length in elements; None: no buffer on this rank
    input_elems: Callable[[int, int, bool], int | None]
    output_elems: Callable[[int, int, bool], int | None]
    ours: Callable[[Setup, Buffers], Any]
    native: Callable[[Setup, Buffers], Any]
    plain: Callable[[Setup, Buffers], Any]  # ours without out= and counts=: returns the result
    ceiling: CeilingSchedule  # (n, rank, root, count, itemsize) -> steps
    reduces: bool = False  # takes --op
    rooted: bool = False  # takes --root
    in_place: bool = False  # the input buffer receives the result
    # (rank, n) -> how many ranks' data this rank's result reduces: avg's divisor in the check,
    # and 0 where the rank has no result to check
    averaged_over: Callable[[int, int], int] = lambda rank, n: n
    # (setup, buffer object, element size, every rank's block in elements) -> [buf, count, type]
    message: Callable[[Setup, Any, int, tuple[int, ...]], list] = _message
    native_in_place: InPlace | None = None  # None: no in-place form (the dropin call)


def native_datatype(dtype: numpy.dtype, reduces: bool) -> MPI.Datatype:
    """The MPI datatype the native collective sees. Data movers get raw bytes, as mpiring's
    transport sends them; reductions need MPI's own type for the dtype."""
    if not reduces:
        return MPI.BYTE
    try:
        return MPI.Datatype.fromcode(dtype.char)
    except (KeyError, ValueError) as error:
        raise UsageError(f"--dtype {dtype}: this MPI has no datatype to reduce it ({error})") from None


def native_op(op: str, dtype: numpy.dtype) -> MPI.Op:
    return (NATIVE_BOOL_OPS if dtype.kind == "b" else NATIVE_OPS)[op]


def _typed(setup: Setup, buf: Any) -> list | None:
    """[buf, type]; a message already made (a list: the dropin-mmap form's) and None pass as they are."""
    if buf is None or buf.__class__ is list:
        return buf
    return [buf, setup.mpi_type]


def _typed_v(setup: Setup, buf: Any, counts: tuple[int, ...]) -> list:
    """A v-variant's buffer: `counts` in elements, as MPI counts them in setup.mpi_type (bytes
    for the data movers); a message already made passes as it is."""
    if buf.__class__ is list:
        return buf
    return [buf, [c * _scale(setup, buf.itemsize) for c in counts], setup.mpi_type]


# ---- MPI.IN_PLACE: where the input goes before the call, and the result is after it ----------


def _in_recvbuf(setup: Setup, x: Any, buf: Any) -> Any:
    """The receive buffer holds the input; the result replaces it."""
    buf[...] = x
    return buf


def _at_root(stage: Callable[[Setup, Any, Any], Any]) -> Callable[[Setup, Any, Any], Any]:
    """`stage` at the root; the other ranks send their input as it is and get no result."""
    return lambda s, x, buf: stage(s, x, buf) if s.rank == s.root else None


def _in_block(setup: Setup, x: Any, buf: Any, block: int) -> Any:
    """The input is block `block` of the receive buffer (gather's root, allgather); the result is
    the whole receive buffer."""
    buf[block * x.size:(block + 1) * x.size] = x
    return buf


def _first_block(setup: Setup, x: Any, buf: Any) -> Any:
    """Reduce_scatter_block: the receive buffer holds every block of the input; the result is its first."""
    buf[...] = x
    return buf[: buf.size // setup.size]


def _root_block(setup: Setup, x: Any, buf: Any) -> Any:
    """Scatter: the root's block stays in its send buffer (nothing to put in place); the other
    ranks receive into their receive buffer."""
    if setup.rank != setup.root:
        return buf
    count = x.size // setup.size
    return x[setup.root * count:(setup.root + 1) * count]


def _in_place_send(setup: Setup, buffers: Buffers) -> Any:
    """MPI.IN_PLACE at the root, the send buffer on the other ranks (reduce, gather)."""
    return MPI.IN_PLACE if setup.rank == setup.root else _typed(setup, buffers.native_x)



# ---- ceiling schedules: the ring algorithms' messages, sizes in elements ---------------------


def _shifts(n: int, sizes: list[int], first: int) -> list[CeilingStep]:
    """n-1 ring shifts: step s sends chunk (first - s) and receives chunk (first - s - 1)."""
    return [(sizes[(first - s) % n], sizes[(first - s - 1) % n]) for s in range(n - 1)]


def _chunks(count: int, n: int) -> list[int]:
    bounds = split_bounds(count, n)
    return [bounds[k + 1] - bounds[k] for k in range(n)]


def _to_root(n: int, rank: int, root: int, sizes: list[int]) -> list[CeilingStep]:
    """Ring gather: position q forwards blocks q, q-1, ..., 1; the root takes n-1 blocks."""
    q = (rank - root) % n

    def block(position: int) -> int:
        return sizes[(root + position) % n]

    if q == 0:
        return [(None, block(n - 1 - s)) for s in range(n - 1)]
    return [(block(q - s), block(q - 1 - s) if s < q - 1 else None) for s in range(q)]


def _from_root(n: int, rank: int, root: int, sizes: list[int]) -> list[CeilingStep]:
    """Ring scatter: the root sends blocks n-1, ..., 1; position q keeps block q, forwards the rest."""
    q = (rank - root) % n

    def block(position: int) -> int:
        return sizes[(root + position) % n]

    if q == 0:
        return [(block(n - 1 - t), None) for t in range(n - 1)]
    return [(block(q + n - 1 - t) if t >= q else None, block(q + n - 2 - t)) for t in range(q - 1, n - 1)]


def _chain(n: int, rank: int, root: int, count: int, itemsize: int,
           segment_bytes: int = BROADCAST_SEGMENT_BYTES) -> list[CeilingStep]:
    """Pipelined broadcast chain: at step t, position q forwards segment t-q, receives t-q+1."""
    if n == 1:
        return []
    nbytes = count * itemsize
    # As the ring broadcast: segments only pay off when some rank both receives and forwards.
    segments = 1 if n <= 2 or nbytes <= segment_bytes else -(-nbytes // segment_bytes)
    seg = _chunks(count, segments)
    q, last = (rank - root) % n, n - 1
    first_step = 0 if q == 0 else q - 1
    final_step = segments - 1 + (q if q < last else q - 1)
    steps = []
    for t in range(first_step, final_step + 1):
        send = seg[t - q] if q < last and 0 <= t - q < segments else None
        receive = seg[t - q + 1] if q > 0 and 0 <= t - q + 1 < segments else None
        steps.append((send, receive))
    return steps


def _token_laps(n: int, rank: int, root: int, count: int, itemsize: int) -> list[CeilingStep]:
    """Ring barrier: a 0-byte token collects everyone (lap one), then releases them (lap two)."""
    if n == 1:
        return []
    if rank == 0:
        return [(0, 0), (0, None)]
    return [(None, 0), (0, 0)] + ([(0, None)] if rank != n - 1 else [])


# ---- the forms of a call ------------------------------------------------------------------

# What each form of a call is, and the native call a mpi4py user would write for the same job.
FORMS = {
    "best": "the same arrays every call, out= and counts= given; native: the same buffers",
    "plain": "out= and counts= left out, mpiring makes the result; native: a new output array each call",
    "fresh": "a new input array each call, no out= or counts=; native: a new input copy and a new output",
    "dropin": "the mpi4py drop-in (comm.Allreduce(x, y) ...) on the same buffers; native: the same call on MPI",
    "dropin-mmap": "the drop-in with mpi4py's OSU demos' messages: [buf, count, type], buf an anonymous mmap "
                   "(plain pages), made once per buffer set; native: the same messages on MPI",
    "dropin-inplace": "the drop-in with MPI.IN_PLACE wherever MPI allows it (Bcast, Barrier: their dropin call); "
                      "native: the same call on MPI",
}
# The forms that call mpiring through mpi4py's API: they pass MPI's ops, so --op avg sums there
# (MPI has no average) on both sides.
DROP_IN_FORMS = ("dropin", "dropin-mmap", "dropin-inplace")

# ---- the table -----------------------------------------------------------------------------

COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective(
            "broadcast", per_rank=False, rooted=True, in_place=True,
            bus_factor=lambda n: 1.0,
            input_elems=lambda c, n, at_root: c,
            output_elems=lambda c, n, at_root: c,
            ours=lambda s, b: s.comm.broadcast(b.x, s.root, out=b.ours, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.broadcast(b.x, s.root, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Bcast(_typed(s, b.native), s.root),
            ceiling=_chain,
        ),
        Collective(
            "reduce", per_rank=False, reduces=True, rooted=True,
            bus_factor=lambda n: 1.0,
            input_elems=lambda c, n, at_root: c,
            output_elems=lambda c, n, at_root: c if at_root else None,
            ours=lambda s, b: s.comm.reduce(b.x, s.op, s.root, out=b.ours, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.reduce(b.x, s.op, s.root, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Reduce(_typed(s, b.native_x), _typed(s, b.native), s.mpi_op, s.root),
            native_in_place=InPlace(
                call=lambda s, b: s.mpi.Reduce(_in_place_send(s, b), _typed(s, b.native), s.mpi_op, s.root),
                elems=lambda c, n, at_root: c if at_root else None,
                stage=_at_root(_in_recvbuf),
            ),
            ceiling=lambda n, r, root, c, _: _shifts(n, _chunks(c, n), r - 1) + _to_root(
                n, r, root, _chunks(c, n)
            ),
        ),
        Collective(
            "allreduce", per_rank=False, reduces=True,
            bus_factor=lambda n: 2 * (n - 1) / n,
            input_elems=lambda c, n, at_root: c,
            output_elems=lambda c, n, at_root: c,
            ours=lambda s, b: s.comm.allreduce(b.x, s.op, out=b.ours, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.allreduce(b.x, s.op, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Allreduce(_typed(s, b.native_x), _typed(s, b.native), s.mpi_op),
            native_in_place=InPlace(
                call=lambda s, b: s.mpi.Allreduce(MPI.IN_PLACE, _typed(s, b.native), s.mpi_op),
                elems=lambda c, n, at_root: c,
                stage=_in_recvbuf,
            ),
            ceiling=lambda n, r, root, c, _: _shifts(n, _chunks(c, n), r - 1) + _shifts(n, _chunks(c, n), r),
        ),
        Collective(
            "gather", per_rank=True, rooted=True,
            bus_factor=lambda n: (n - 1) / n,
            input_elems=lambda c, n, at_root: c,
            output_elems=lambda c, n, at_root: c * n if at_root else None,
            ours=lambda s, b: s.comm.gather(b.x, s.root, out=b.ours, counts=b.counts, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.gather(b.x, s.root, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Gather(_typed(s, b.native_x), _typed(s, b.native), s.root),
            native_in_place=InPlace(
                call=lambda s, b: s.mpi.Gather(_in_place_send(s, b), _typed(s, b.native), s.root),
                elems=lambda c, n, at_root: c * n if at_root else None,
                stage=_at_root(lambda s, x, buf: _in_block(s, x, buf, s.root)),
            ),
            ceiling=lambda n, r, root, c, _: _to_root(n, r, root, [c] * n),
        ),
        Collective(
            "allgather", per_rank=True,
            bus_factor=lambda n: (n - 1) / n,
            input_elems=lambda c, n, at_root: c,
            output_elems=lambda c, n, at_root: c * n,
            ours=lambda s, b: s.comm.allgather(b.x, out=b.ours, counts=b.counts, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.allgather(b.x, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Allgather(_typed(s, b.native_x), _typed(s, b.native)),
            native_in_place=InPlace(
                call=lambda s, b: s.mpi.Allgather(MPI.IN_PLACE, _typed(s, b.native)),
                elems=lambda c, n, at_root: c * n,
                stage=lambda s, x, buf: _in_block(s, x, buf, s.rank),
            ),
            ceiling=lambda n, r, root, c, _: _shifts(n, [c] * n, r),
        ),
        Collective(
            "scatter", per_rank=True, rooted=True,
            bus_factor=lambda n: (n - 1) / n,
            input_elems=lambda c, n, at_root: c * n if at_root else None,
            output_elems=lambda c, n, at_root: c,
            ours=lambda s, b: s.comm.scatter(b.x, s.root, out=b.ours, counts=b.counts, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.scatter(b.x, s.root, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Scatter(_typed(s, b.native_x), _typed(s, b.native), s.root),
            native_in_place=InPlace(
                call=lambda s, b: s.mpi.Scatter(
                    _typed(s, b.native_x), MPI.IN_PLACE if s.rank == s.root else _typed(s, b.native), s.root
                ),
                elems=lambda c, n, at_root: None if at_root else c,
                stage=_root_block,
            ),
            ceiling=lambda n, r, root, c, _: _from_root(n, r, root, [c] * n),
        ),
        Collective(
            "reduce_scatter", per_rank=True, reduces=True,
            bus_factor=lambda n: (n - 1) / n,
            input_elems=lambda c, n, at_root: c * n,
            output_elems=lambda c, n, at_root: c,
            ours=lambda s, b: s.comm.reduce_scatter(b.x, s.op, out=b.ours, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.reduce_scatter(b.x, s.op, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Reduce_scatter_block(
                _typed(s, b.native_x), _typed(s, b.native), s.mpi_op
            ),
            native_in_place=InPlace(  # the receive buffer holds every rank's block: the input's length
                call=lambda s, b: s.mpi.Reduce_scatter_block(MPI.IN_PLACE, _typed(s, b.native), s.mpi_op),
                elems=lambda c, n, at_root: c * n,
                stage=_first_block,
            ),
            ceiling=lambda n, r, root, c, _: _shifts(n, [c] * n, r - 1),
        ),
        Collective(
            "barrier", per_rank=False,
            bus_factor=lambda n: 0.0,  # moves no data: time only
            input_elems=lambda c, n, at_root: None,
            output_elems=lambda c, n, at_root: None,
            ours=lambda s, b: s.comm.barrier(algorithm=s.algorithm),
            plain=lambda s, b: s.comm.barrier(algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Barrier(),
            ceiling=_token_laps,
        ),
        Collective(
            "alltoall", per_rank=True,
            bus_factor=lambda n: (n - 1) / n,
            input_elems=lambda c, n, at_root: c * n,
            output_elems=lambda c, n, at_root: c * n,
            ours=lambda s, b: s.comm.alltoall(b.x, out=b.ours, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.alltoall(b.x, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Alltoall(_typed(s, b.native_x), _typed(s, b.native)),
            native_in_place=InPlace(
                call=lambda s, b: s.mpi.Alltoall(MPI.IN_PLACE, _typed(s, b.native)),
                elems=lambda c, n, at_root: c * n,
                stage=_in_recvbuf,
            ),
            ceiling=lambda n, r, root, c, _: _shifts(n, [c] * n, r),
        ),
        Collective(
            "alltoallv", per_rank=True,
            bus_factor=lambda n: (n - 1) / n,
            input_elems=lambda c, n, at_root: c * n,
            output_elems=lambda c, n, at_root: c * n,
            ours=lambda s, b: s.comm.alltoallv(b.x, b.counts, b.counts, out=b.ours, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.alltoallv(b.x, b.counts, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Alltoallv(_typed_v(s, b.native_x, b.counts), _typed_v(s, b.native, b.counts)),
            native_in_place=InPlace(
                call=lambda s, b: s.mpi.Alltoallv(MPI.IN_PLACE, _typed_v(s, b.native, b.counts)),
                elems=lambda c, n, at_root: c * n,
                stage=_in_recvbuf,
            ),
            message=_message_v,
            ceiling=lambda n, r, root, c, _: _shifts(n, [c] * n, r),
        ),
        Collective(
            "scan", per_rank=False, reduces=True,
            bus_factor=lambda n: 1.0,
            input_elems=lambda c, n, at_root: c,
            output_elems=lambda c, n, at_root: c,
            ours=lambda s, b: s.comm.scan(b.x, s.op, out=b.ours, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.scan(b.x, s.op, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Scan(_typed(s, b.native_x), _typed(s, b.native), s.mpi_op),
            native_in_place=InPlace(
                call=lambda s, b: s.mpi.Scan(MPI.IN_PLACE, _typed(s, b.native), s.mpi_op),
                elems=lambda c, n, at_root: c,
                stage=_in_recvbuf,
            ),
            ceiling=lambda n, r, root, c, size: _chain(n, r, 0, c, size, SCAN_SEGMENT_BYTES),
            averaged_over=lambda rank, n: rank + 1,
        ),
        Collective(
            "exscan", per_rank=False, reduces=True,
            bus_factor=lambda n: 1.0,
            input_elems=lambda c, n, at_root: c,
            output_elems=lambda c, n, at_root: c,
            ours=lambda s, b: s.comm.exscan(b.x, s.op, out=b.ours, algorithm=s.algorithm),
            plain=lambda s, b: s.comm.exscan(b.x, s.op, algorithm=s.algorithm),
            native=lambda s, b: s.mpi.Exscan(_typed(s, b.native_x), _typed(s, b.native), s.mpi_op),
            native_in_place=InPlace(  # rank 0's receive buffer is left as it was (its result is undefined)
                call=lambda s, b: s.mpi.Exscan(MPI.IN_PLACE, _typed(s, b.native), s.mpi_op),
                elems=lambda c, n, at_root: c,
                stage=_in_recvbuf,
            ),
            ceiling=lambda n, r, root, c, size: _chain(n, r, 0, c, size, SCAN_SEGMENT_BYTES),
            averaged_over=lambda rank, n: rank,
        ),
    )
}
