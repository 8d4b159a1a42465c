"""Each collective as one generator of steps: agree on the layout where ranks cannot know it
alone, place the output, run the chosen algorithm, return the result.

The public `Communicator` validates arguments and drives these generators; the algorithms in
`mpiring.algorithms` only move and combine flat buffers.
"""

from __future__ import annotations

import zlib
from functools import partial
from typing import Any

import numpy

from mpiring import identity
from mpiring.algorithms import ALGORITHMS, IN_PLACE
from mpiring.algorithms.allgather_bruck import allgather_bruck
from mpiring.algorithms.allgather_node_leader import allgather_node_leader
from mpiring.algorithms.broadcast_binomial import broadcast_binomial
from mpiring.algorithms.broadcast_node_leader import broadcast_node_leader
from mpiring.backend import NUMPY, NumpyBackend, dtype_from_token, dtype_token, is_bfloat16
from mpiring.engine.partition import bounds_from_counts, row_bounds
from mpiring.engine.recording import Unschedulable
from mpiring.engine.ring import Ring
from mpiring.engine.transport import Call, Steps
from mpiring.errors import ArgumentError, CollectiveMismatchError
from mpiring.selection import choose
from mpiring.validation import check_out, out_problem

# Per-rank record of the layout exchange that gather and allgather run first.
# rows, signature (dtype and trailing shape), state of out= (see below), whether the rank's block came
# in its slot (below)
LAYOUT_FIELDS = 4
LAYOUT_BYTES = LAYOUT_FIELDS * 8
_NO_OUT, _BAD_OUT = -1, -2

# The header the scatter root sends ahead of the data: status, ndim, dtype, then the shape.
_MAX_DIMS = 64
HEADER_BYTES = (3 + _MAX_DIMS) * 8
_ACCEPTED, _REJECTED, _IN_SLOT, _LONG = 0, 1, 2, 3  # its status: the data follows; x was rejected;
# the data came with it (in a slot, below); the shape has more dimensions than a slot holds

# Slots: at up to SLOT_MAX_RANKS ranks, the layout round of a gather, all-gather or scatter
# without counts= sends fixed messages of SLOT_BYTES (as much as Open MPI passes on its fastest
# path; WIDE_SLOT_BYTES where layout_slot_bytes says) per rank, which a rank can receive before it
# knows any other rank's rows: the layout (a gather's or all-gather's record of each rank, a
# scatter's header from the root, on one node) and, where every block fits in the rest, the data
# too (one round, rather than the layout's and then the data's). A scatter's slot holds up to
# SLOT_DIMS dimensions; a shape of more goes in a whole header after it (_LONG).
SLOT_BYTES = 256
WIDE_SLOT_BYTES = LAYOUT_BYTES + 1024  # (layout_slot_bytes)
SLOT_MAX_RANKS = 8
SLOT_DIMS = 9
SLOT_DATA = (3 + SLOT_DIMS) * 8  # where a scatter slot's block starts


class Output:
    """Where a collective writes: the caller's out= when it can take the writes directly,
    otherwise a fresh array (copied into out= at the end).

    Writing straight into out= needs it C-contiguous and not overlapping the input, except
    when it *is* the input and the algorithm reads each input element before writing it
    (`in_place_ok`).
    """

    def __init__(
        self, backend: NumpyBackend, out: Any, shape: tuple[int, ...], dtype: Any,
        source: Any = None, in_place_ok: bool = False,
    ) -> None:
        self._backend = backend
        self._copy_into = None
        direct = out is not None and out.flags.c_contiguous and (
            source is None
            or (in_place_ok and out is source)
            or not backend.may_share_memory(out, source)
        )
        if direct:
            self.array = out
        else:
            self.array = backend.empty(shape, dtype)
            self._copy_into = out
        self.flat = self.array.reshape(-1)

    def result(self) -> Any:
        if self._copy_into is None:
            return self.array
        self._backend.copy(self._copy_into, self.array)
        return self._copy_into


def slots_suit(ring: Ring) -> bool:
    """Whether a scatter's header goes in slots (see SLOT_BYTES): a few ranks, all on one node."""
    return 1 < ring.size <= SLOT_MAX_RANKS and len(ring.nodes.nodes) == 1


def layout_in_slots(ring: Ring) -> bool:
    """Whether a gather's or all-gather's layout round all-gathers slots (each rank's record and
    room for a small block) rather than records alone: at a few ranks, on any nodes."""
    return 1 < ring.size <= SLOT_MAX_RANKS


def slots_sent_directly(ring: Ring) -> bool:
    """Whether those slots go in one round, each rank's to every other: as a scatter's header (one
    node), and where that round is not more messages than Bruck's (2 ranks) or the machine has a
    core per rank (where ranks take turns on a core, each message costs a turn, so Bruck's lg p
    rounds win; across nodes the node-aware all-gather's leaders alone cross the network)."""
    return slots_suit(ring) and (ring.size == 2 or ring.core_per_rank)


def layout_slot_bytes(ring: Ring) -> int:
    """A gather's or all-gather's layout slot: SLOT_BYTES, or WIDE_SLOT_BYTES where ranks of one
    node take turns on cores (Bruck's rounds carry the slots): there each message costs a turn and
    its bytes little, so a wider slot saves the data round of more calls. Across nodes every byte
    of a slot crosses a link, whether it holds a block or not."""
    if slots_sent_directly(ring) or len(ring.nodes.nodes) > 1:
        return SLOT_BYTES
    return WIDE_SLOT_BYTES


def _host_side(backend: NumpyBackend) -> NumpyBackend:
    """The backend of a collective's own metadata (layouts, headers): the call's own where its
    arrays live on the host (while a schedule is recorded, the recording one), else NumPy's."""
    return NUMPY if backend.on_device else backend


def _signature(dtype: Any, trailing: tuple[int, ...]) -> int:
    return zlib.crc32(f"{dtype_token(dtype)}|{trailing}".encode())


def _describe(dtype: Any, trailing: tuple[int, ...]) -> str:
    return f"dtype {dtype}, rows of shape {trailing}"


def _exchange_layout(ring: Ring, call: Call, x: Any, out: Any, out_rows_needed: bool, backend: NumpyBackend) -> Steps:
    """All-gather every rank's row count, with its dtype and row shape signature and the rows of
    its out= (`_layout_rows` checks that they fit together). Returns (the table: every rank's;
    the slots, where the ranks sent them, else None).

    At up to SLOT_MAX_RANKS ranks every rank's slot (layout_slot_bytes) goes to every other (in
    one round where slots_sent_directly, else by the table's all-gather): its record, then, where
    it fits and x is on the host (`auto`), its block, so a small gather or all-gather needs no
    other message."""
    trailing = tuple(x.shape[1:])
    out_state, _ = _out_state(out if out_rows_needed else None, trailing, x.dtype, backend)
    p, r = ring.size, ring.rank
    table = ring.metadata(p * LAYOUT_FIELDS, NUMPY.xp.int64)
    record = table[r * LAYOUT_FIELDS :][:LAYOUT_FIELDS]
    if not layout_in_slots(ring):
        record[:] = (x.shape[0], _signature(x.dtype, trailing), out_state, 0)
        yield from _all_gather_table(ring, backend, call, table, LAYOUT_FIELDS)
        return table, None
    host = _host_side(backend)
    width = layout_slot_bytes(ring)
    in_slot = x.nbytes <= width - LAYOUT_BYTES and not backend.on_device and call.algorithm in (None, "auto")
    record[:] = (x.shape[0], _signature(x.dtype, trailing), out_state, int(in_slot))
    slots = ring.metadata(p * width, numpy.uint8).reshape(p, width)  # rank k's in row k (this rank's: sent)
    slots[r, :LAYOUT_BYTES] = record.view(numpy.uint8)
    if in_slot and x.nbytes:
        host.copy(slots[r, LAYOUT_BYTES : LAYOUT_BYTES + x.nbytes], backend.flat(x).view(numpy.uint8))
    others = [(r + k) % p for k in range(1, p)]
    if slots_sent_directly(ring):
        yield ring.post(host, call.tag, sends=[(slots[r], k) for k in others],
                        receives=[(slots[k], k) for k in others])
    else:
        yield from _all_gather_table(ring, backend, call, slots.reshape(-1), width)
    records = table.view(numpy.uint8).reshape(p, LAYOUT_BYTES)
    for k in others:  # (copies, so that a replay checks the table it received: WORK_EXPECT)
        host.copy(records[k], slots[k, :LAYOUT_BYTES])
    return table, slots


def _all_gather_table(ring: Ring, backend: NumpyBackend, call: Call, table: Any, width: int) -> Steps:
    """All-gather a layout round's table of `width` elements per rank (words of records, or bytes
    of slots): a few KiB at most, so by the latency-optimal all-gather (Bruck's ceil(lg p) steps),
    or across nodes by the node-aware one, whose leaders alone cross the network, in one round."""
    exchange = allgather_node_leader if ring.nodes.hierarchical else allgather_bruck
    yield from exchange(ring, _host_side(backend), call.tag, table, list(range(0, (ring.size + 1) * width, width)))


def _layout_rows(ring: Ring, call: Call, x: Any, out: Any, out_rows_needed: bool, backend: NumpyBackend,
                 table: Any) -> list[int]:
    """Every rank's rows, from a layout table. Raises the same error on every rank when the ranks'
    arrays and out= do not fit together, since every rank then holds the same table."""
    _, own_problem = _out_state(out if out_rows_needed else None, tuple(x.shape[1:]), x.dtype, backend)
    rows = table[0::LAYOUT_FIELDS]
    total = int(rows.sum())
    _check_agreement(ring, call.collective, x, table[1::LAYOUT_FIELDS], table[2::LAYOUT_FIELDS],
                     [total] * ring.size, own_problem)
    return [int(n) for n in rows]


def _blocks_in_slots(table: Any, slots: Any) -> bool:
    """Whether every rank's block came in its slot of the layout round."""
    return slots is not None and bool(table[3::LAYOUT_FIELDS].all())


def _copy_from_slots(ring: Ring, backend: NumpyBackend, x: Any, flat_out: Any, bounds: list[int], slots: Any) -> None:
    """Every rank's block into its place in `flat_out` (bounds in elements): this rank's from x,
    the others' from their slots."""
    data = flat_out.view(numpy.uint8)
    size = flat_out.itemsize
    for k in range(ring.size):
        start, stop = bounds[k] * size, bounds[k + 1] * size
        if stop > start:
            source = backend.flat(x).view(numpy.uint8) if k == ring.rank else backend.asarray(
                slots[k, LAYOUT_BYTES : LAYOUT_BYTES + stop - start])
            backend.copy(data[start:stop], source)


def _out_state(out: Any, trailing: tuple[int, ...], dtype: Any, backend: NumpyBackend) -> tuple[int, str | None]:
    """What a rank tells the others of its out= in a layout exchange: its rows, _NO_OUT or _BAD_OUT
    (with the problem, raised here and named on the other ranks)."""
    if out is None:
        return _NO_OUT, None
    problem = _out_problem_except_rows(out, trailing, dtype, backend)
    return (_BAD_OUT if problem else out.shape[0]), problem


def _check_agreement(ring: Ring, collective: str, x: Any, signatures: Any, out_states: Any, totals: list[int],
                     own_problem: str | None) -> None:
    """After a layout exchange every rank holds the same table, so each raises the same error:
    when some rank's dtype or row shape differs from rank 0's, or some rank's out= cannot take
    its `totals[k]` rows."""
    differing = [k for k in range(ring.size) if signatures[k] != signatures[0]]
    if differing:
        raise CollectiveMismatchError(
            collective,
            f"ranks {differing} passed arrays whose dtype or row shape differs from rank 0's "
            f"(this rank {ring.rank}: {_describe(x.dtype, tuple(x.shape[1:]))})",
        )
    for k in range(ring.size):
        if out_states[k] == _BAD_OUT:
            problem = own_problem if k == ring.rank else f"rejected on rank {k} (see the error there)"
            raise ArgumentError(collective, "out", problem)
        if out_states[k] >= 0 and out_states[k] != totals[k]:
            raise ArgumentError(
                collective, "out", f"has {out_states[k]} rows on rank {k}, expected {totals[k]} (all ranks' rows)"
            )


def _out_problem_except_rows(out: Any, trailing: tuple[int, ...], dtype: Any, backend: NumpyBackend) -> str | None:
    rows = out.shape[0] if backend.is_array(out) and out.ndim >= 1 else 0
    return out_problem(out, (rows, *trailing), dtype, backend)


def _row_size(shape: tuple[int, ...]) -> int:
    size = 1
    for extent in shape[1:]:
        size *= extent
    return size


def _algorithm(ring: Ring, call: Call, nbytes: int) -> Any:
    """The algorithm to run: the one asked for, or the one "auto" picks for this size.

    Every rank must pass the same nbytes, so gather and all-gather decide after the layout
    exchange and scatter after the header. A blocking call's tag then names the algorithm too
    (mpiring.identity), so ranks that chose differently never match each other's messages.
    """
    call.algorithm = choose(call.collective, call.algorithm, nbytes, ring.size, ring.nodes)
    call.tag = ring.tags.with_identity(call.tag, identity.of_algorithm(call.collective, call.algorithm))
    return ALGORITHMS[call.collective][call.algorithm]


def broadcast(ring: Ring, backend: NumpyBackend, call: Call, x: Any, root: int, out: Any) -> Steps:
    target = Output(backend, out, x.shape, x.dtype, source=x, in_place_ok=True)
    src = backend.flat(x) if ring.rank == root and target.array is not x else None  # the root sends x, copies it
    yield from _algorithm(ring, call, x.nbytes)(ring, backend, call.tag, root, target.flat, src)
    return target.result()


def in_float32(collective: Any, ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any,
               **arguments: Any) -> Steps:
    """Run a reducing `collective` on bfloat16 `x` in float32 and round once per element.

    A bfloat16 ring would round every partial sum to 8 bits of mantissa, p-1 times; here every
    element is reduced in float32 (the partial results travel as float32, twice the bytes) and
    rounded to bfloat16 once, at the end (round to nearest even, ml_dtypes' cast). The float32
    results are the same bits on every rank (as for any float32 call), so the rounded ones are too.
    """
    wide = backend.empty(x.shape, numpy.float32)
    backend.copy(wide, x)  # exact: every bfloat16 is a float32
    result = yield from collective(ring, backend, call, wide, out=None, **arguments)
    if result is None:  # a rank without a result (reduce off the root, exscan's rank 0)
        return None
    target = out if out is not None else backend.empty(result.shape, x.dtype)
    backend.copy(target, result)
    return target


def reduce(ring: Ring, backend: NumpyBackend, call: Call, x: Any, op: str, root: int, out: Any) -> Steps:
    if is_bfloat16(x.dtype):
        return (yield from in_float32(reduce, ring, backend, call, x, out, op=op, root=root))
    target = Output(backend, out, x.shape, x.dtype, source=x, in_place_ok=True) if ring.rank == root else None
    flat_out = target.flat if target else None
    yield from _algorithm(ring, call, x.nbytes)(ring, backend, call.tag, root, backend.flat(x), flat_out, op)
    return target.result() if target else None


def allreduce(ring: Ring, backend: NumpyBackend, call: Call, x: Any, op: str, out: Any) -> Steps:
    if is_bfloat16(x.dtype):
        return (yield from in_float32(allreduce, ring, backend, call, x, out, op=op))
    target = Output(backend, out, x.shape, x.dtype, source=x, in_place_ok=True)
    yield from _algorithm(ring, call, x.nbytes)(ring, backend, call.tag, backend.flat(x), target.flat, op)
    return target.result()


def reduce_scatter(ring: Ring, backend: NumpyBackend, call: Call, x: Any, op: str, out: Any,
                   counts: list[int] | None = None) -> Steps:
    """`counts`: every rank's rows of the result (checked to add up to x's rows); None splits
    x as numpy.array_split does."""
    rows = row_bounds(x.shape[0], ring.size, counts)
    r = ring.rank
    shape = (rows[r + 1] - rows[r], *x.shape[1:])  # out= was checked against it (Communicator)
    if is_bfloat16(x.dtype):
        return (yield from in_float32(reduce_scatter, ring, backend, call, x, out, op=op, counts=counts))
    target = Output(backend, out, shape, x.dtype, source=x)
    bounds = [b * _row_size(x.shape) for b in rows]
    algorithm = _algorithm(ring, call, x.nbytes)
    yield from algorithm(ring, backend, call.tag, backend.flat(x), bounds, op, target.flat)
    return target.result()


def allgather(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any, rows: list[int] | None = None) -> Steps:
    """`rows`: every rank's row count when the caller knows them (counts=)."""
    if rows is None:
        table, slots = yield from _exchange_layout(ring, call, x, out, True, backend)
        return (yield from ring.after_layout(table, partial(_allgather_after_layout, slots=slots), backend, call,
                                             x, out))
    return (yield from _allgather_rows(ring, backend, call, x, out, rows))


def _allgather_after_layout(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any, table: Any,
                            slots: Any) -> Steps:
    rows = _layout_rows(ring, call, x, out, True, backend, table)
    return (yield from _allgather_rows(ring, backend, call, x, out, rows, slots if _blocks_in_slots(table, slots)
                                       else None))


def _allgather_rows(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any, rows: list[int],
                    slots: Any = None) -> Steps:
    """`slots`: the layout round's, where every block came in them."""
    target = Output(backend, out, (sum(rows), *x.shape[1:]), x.dtype, source=x)
    bounds = bounds_from_counts(rows, _row_size(x.shape))
    if slots is not None:
        call.algorithm = "scattered"  # (what ran: every rank sent its block to every other)
        _copy_from_slots(ring, backend, x, target.flat, bounds, slots)
        return target.result()
    algorithm = _algorithm(ring, call, target.array.nbytes)
    yield from algorithm(ring, backend, call.tag, target.flat, bounds, src=backend.flat(x))
    return target.result()


def gather(ring: Ring, backend: NumpyBackend, call: Call, x: Any, root: int, out: Any,
           rows: list[int] | None = None) -> Steps:
    """`rows`: every rank's row count when the caller knows them (counts=)."""
    if rows is None:
        is_root = ring.rank == root
        table, slots = yield from _exchange_layout(ring, call, x, out if is_root else None, is_root, backend)
        return (yield from ring.after_layout(table, partial(_gather_after_layout, root=root, slots=slots), backend,
                                             call, x, out))
    return (yield from _gather_rows(ring, backend, call, x, root, out, rows))


def _gather_after_layout(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any, table: Any,
                         root: int, slots: Any) -> Steps:
    is_root = ring.rank == root
    rows = _layout_rows(ring, call, x, out if is_root else None, is_root, backend, table)
    return (yield from _gather_rows(ring, backend, call, x, root, out, rows,
                                    slots if _blocks_in_slots(table, slots) else None))


def _gather_rows(ring: Ring, backend: NumpyBackend, call: Call, x: Any, root: int, out: Any,
                 rows: list[int], slots: Any = None) -> Steps:
    """`slots`: the layout round's, where every block came in them."""
    is_root = ring.rank == root
    total_shape = (sum(rows), *x.shape[1:])
    target = Output(backend, out, total_shape, x.dtype, source=x) if is_root else None
    bounds = bounds_from_counts(rows, _row_size(x.shape))
    if slots is not None:
        call.algorithm = "linear"  # (what ran: every rank sent its block to the root, among others)
        if target:
            _copy_from_slots(ring, backend, x, target.flat, bounds, slots)
        return target.result() if target else None
    flat_out = target.flat if target else None
    algorithm = _algorithm(ring, call, bounds[-1] * x.dtype.itemsize)
    yield from algorithm(ring, backend, call.tag, root, backend.flat(x), flat_out, bounds)
    return target.result() if target else None


def scatter(
    ring: Ring, backend: NumpyBackend, call: Call, x: Any, root: int, out: Any, root_problem: ArgumentError | None,
    counts: list[int] | None = None, layout: tuple[tuple[int, ...], Any] | None = None,
) -> Steps:
    """`x` matters on the root only; a problem with it there is sent to every rank in the header.

    `layout` (the whole shape and the dtype, known to every rank through counts=) skips the
    header; `counts` splits x into parts of those rows instead of as numpy.array_split does.
    """
    if layout is None:
        if slots_suit(ring):
            header, slot, whole = yield from _scatter_slots(ring, backend, call, x, root, root_problem)
        else:
            header, slot, whole = (yield from _scatter_header(ring, backend, call, x, root, root_problem)), None, None
        return (yield from ring.after_layout(header, partial(_scatter_after_header, root=root, counts=counts,
                                                             slot=slot, whole=whole), backend, call, x, out))
    return (yield from _scatter_layout(ring, backend, call, x, root, out, counts, layout))


def _scatter_after_header(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any, header: Any, root: int,
                          counts: list[int] | None, slot: Any, whole: Any) -> Steps:
    """The scatter once the root's header has arrived (a rank whose x was rejected at the root
    raises). Where its slot said _LONG, the whole header comes next (`whole`: the root's own)."""
    if header[0] == _REJECTED:
        raise ArgumentError("scatter", "x", f"rejected on the root, rank {root} (see the error there)")
    if header[0] == _LONG:
        if whole is None:
            if ring.recorder is not None:  # its table holds too few dimensions to check a replay's shape by
                raise Unschedulable("a scatter header of more dimensions than a slot holds")
            whole = ring.metadata(HEADER_BYTES // 8, numpy.int64)
            yield ring.post(_host_side(backend), call.tag, receives=[(whole, root)])
        header = whole
    ndim, dtype = int(header[1]), _decode_dtype(int(header[2]), backend)
    shape = tuple(int(n) for n in header[3 : 3 + ndim])
    return (yield from _scatter_layout(ring, backend, call, x, root, out, counts, (shape, dtype),
                                       header[0] == _IN_SLOT, slot))


def _scatter_layout(ring: Ring, backend: NumpyBackend, call: Call, x: Any, root: int, out: Any,
                    counts: list[int] | None, layout: tuple[tuple[int, ...], Any], in_slots: bool = False,
                    slot: Any = None) -> Steps:
    """The data of a scatter whose layout every rank knows: by the algorithm, or, where the
    header's slots brought every block (`in_slots`), from this rank's `slot` (the root: from x)."""
    shape, dtype = layout
    rows = row_bounds(shape[0], ring.size, counts)
    r = ring.rank
    mine_shape = (rows[r + 1] - rows[r], *shape[1:])
    check_out("scatter", out, mine_shape, dtype, backend)
    target = Output(backend, out, mine_shape, dtype, source=x if ring.rank == root else None)
    bounds = [b * _row_size(shape) for b in rows]
    src = backend.flat(x) if ring.rank == root else None
    if in_slots:
        call.algorithm = "linear"  # (what ran: the root sent every block)
        block = src[bounds[r] : bounds[r + 1]] if r == root else backend.asarray(
            slot[SLOT_DATA : SLOT_DATA + target.flat.nbytes])
        if block.size:
            backend.copy(target.flat.view(numpy.uint8), block.view(numpy.uint8))
        return target.result()
    algorithm = _algorithm(ring, call, bounds[-1] * dtype.itemsize)
    yield from algorithm(ring, backend, call.tag, root, src, target.flat, bounds)
    return target.result()


def _scatter_slots(ring: Ring, backend: NumpyBackend, call: Call, x: Any, root: int,
                   root_problem: ArgumentError | None) -> Steps:
    """The root sends every other rank a slot: its header, then that rank's block where every
    block fits (status _IN_SLOT: x on the host, `auto`), or, for a shape of more than SLOT_DIMS
    dimensions, the whole header after it (_LONG). Returns (the table: the slot's header; the
    slot received, or None on the root; the whole header the root sent after its slots, or None)."""
    host = _host_side(backend)
    if ring.rank != root:
        slot = ring.metadata(SLOT_BYTES, numpy.uint8)
        yield ring.post(host, call.tag, receives=[(slot, root)])
        return slot[:SLOT_DATA].view(numpy.int64), slot, None
    long = root_problem is None and x.ndim > SLOT_DIMS
    header = _header_of(ring.metadata(SLOT_DATA // 8, numpy.int64), None if long else x, root_problem)
    whole = None
    if long:
        header[0], header[1], header[2] = _LONG, x.ndim, _encode_dtype(x.dtype)
        whole = _header_of(ring.metadata(HEADER_BYTES // 8, numpy.int64), x, None)
    elif root_problem is None:
        row = _row_size(x.shape) * x.dtype.itemsize
        bounds = [b * row for b in row_bounds(x.shape[0], ring.size, None)]
        widest = max(bounds[k + 1] - bounds[k] for k in range(ring.size))
        if widest <= SLOT_BYTES - SLOT_DATA and not backend.on_device and call.algorithm in (None, "auto"):
            header[0] = _IN_SLOT
    others = [(root + k) % ring.size for k in range(1, ring.size)]
    slots = ring.metadata(len(others) * SLOT_BYTES, numpy.uint8).reshape(len(others), SLOT_BYTES)
    slots[:, :SLOT_DATA] = header.view(numpy.uint8)
    if header[0] == _IN_SLOT:
        data = backend.flat(x).view(numpy.uint8)
        for slot, k in zip(slots, others, strict=True):
            if bounds[k + 1] > bounds[k]:
                host.copy(slot[SLOT_DATA : SLOT_DATA + bounds[k + 1] - bounds[k]], data[bounds[k] : bounds[k + 1]])
    sends = list(zip(slots, others, strict=True))
    if whole is not None:  # after the slot, to the same rank with the same tag: MPI keeps their order
        sends += [(whole, k) for k in others]
    yield ring.post(host, call.tag, sends=sends)
    if root_problem is not None:
        raise root_problem
    return header, None, whole


def _header_of(header: Any, x: Any, root_problem: ArgumentError | None) -> Any:
    """`header` (int64 words) filled for x: status, ndim, dtype, shape (x None: the status alone)."""
    header[:] = 0
    header[0] = _REJECTED if root_problem is not None else _ACCEPTED
    if root_problem is None and x is not None:
        header[1], header[2] = x.ndim, _encode_dtype(x.dtype)
        header[3 : 3 + x.ndim] = x.shape
    return header


def _scatter_header(ring: Ring, backend: NumpyBackend, call: Call, x: Any, root: int,
                    root_problem: ArgumentError | None) -> Steps:
    """The root tells every rank the shape and dtype of x (or that it rejected x: it raises its
    own problem here, the others in _scatter_after_header)."""
    header = ring.metadata(HEADER_BYTES // 8, NUMPY.xp.int64)
    if ring.rank == root:
        _header_of(header, x, root_problem)
    # small: ceil(lg p) hops; across nodes, one crossing into each node
    header_broadcast = broadcast_node_leader if ring.nodes.hierarchical else broadcast_binomial
    yield from header_broadcast(ring, _host_side(backend), call.tag, root, header)
    if header[0] == _REJECTED and root_problem is not None:
        raise root_problem
    return header


def alltoall(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any) -> Steps:
    """Block j of `x` (axis 0 cut in size equal parts) goes to rank j; block i of the result came
    from rank i."""
    algorithm = _algorithm(ring, call, x.nbytes)
    target = Output(backend, out, x.shape, x.dtype, source=x, in_place_ok=(call.collective, call.algorithm) in IN_PLACE)
    block = x.size // ring.size
    bounds = [k * block for k in range(ring.size + 1)]
    yield from algorithm(ring, backend, call.tag, backend.flat(x), bounds, target.flat, bounds)
    return target.result()


def alltoallv(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any, send_counts: list[int],
              recv_counts: list[int] | None) -> Steps:
    """send_counts[j] rows of `x`, in order, go to rank j; recv_counts[i] rows come from rank i
    (exchanged first when None)."""
    if recv_counts is None:
        table = yield from _exchange_counts(ring, call, x, out, send_counts, backend)
        return (yield from ring.after_layout(table, partial(_alltoallv_after_counts, send_counts=send_counts),
                                             backend, call, x, out))
    return (yield from _alltoallv_counts(ring, backend, call, x, out, send_counts, recv_counts))


def _alltoallv_after_counts(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any, table: Any,
                            send_counts: list[int]) -> Steps:
    recv_counts = _counts_received(ring, call, x, out, backend, table)
    return (yield from _alltoallv_counts(ring, backend, call, x, out, send_counts, recv_counts))


def _alltoallv_counts(ring: Ring, backend: NumpyBackend, call: Call, x: Any, out: Any, send_counts: list[int],
                      recv_counts: list[int]) -> Steps:
    row = _row_size(x.shape)
    algorithm = _algorithm(ring, call, 0)  # the ranks' sizes differ; one algorithm serves every size
    in_place_ok = (call.collective, call.algorithm) in IN_PLACE and send_counts == recv_counts
    target = Output(backend, out, (sum(recv_counts), *x.shape[1:]), x.dtype, source=x, in_place_ok=in_place_ok)
    send_bounds, recv_bounds = bounds_from_counts(send_counts, row), bounds_from_counts(recv_counts, row)
    yield from algorithm(ring, backend, call.tag, backend.flat(x), send_bounds, target.flat, recv_bounds)
    return target.result()


def _exchange_counts(ring: Ring, call: Call, x: Any, out: Any, send_counts: list[int], backend: NumpyBackend) -> Steps:
    """All-to-all-v's layout round: all-gather every rank's send counts (with its dtype and row
    shape signature and the rows of its out=), so every rank knows the whole count matrix
    (`_counts_received` checks it). Returns the table."""
    p, r = ring.size, ring.rank
    trailing = tuple(x.shape[1:])
    out_state, _ = _out_state(out, trailing, x.dtype, backend)
    width = p + 2
    table = ring.metadata(p * width, NUMPY.xp.int64)
    table[r * width : (r + 1) * width] = (*send_counts, _signature(x.dtype, trailing), out_state)
    yield from _all_gather_table(ring, backend, call, table, width)
    return table


def _counts_received(ring: Ring, call: Call, x: Any, out: Any, backend: NumpyBackend, table: Any) -> list[int]:
    """This rank's receive counts from the count matrix; raises the same error on every rank
    where the ranks do not fit together."""
    p, r = ring.size, ring.rank
    _, own_problem = _out_state(out, tuple(x.shape[1:]), x.dtype, backend)
    matrix = table.reshape(p, p + 2)
    totals = [int(n) for n in matrix[:, :p].sum(axis=0)]  # rank k receives column k
    _check_agreement(ring, call.collective, x, matrix[:, p], matrix[:, p + 1], totals, own_problem)
    return [int(n) for n in matrix[:, r]]


def scan(ring: Ring, backend: NumpyBackend, call: Call, x: Any, op: str, out: Any, exclusive: bool = False) -> Steps:
    """Rank r gets the reduction over ranks 0..r (`exclusive`: 0..r-1, and rank 0 None)."""
    if is_bfloat16(x.dtype):
        return (yield from in_float32(scan, ring, backend, call, x, out, op=op, exclusive=exclusive))
    empty = exclusive and ring.rank == 0  # takes part, but has no result
    algorithm = _algorithm(ring, call, x.nbytes)
    in_place_ok = (call.collective, call.algorithm) in IN_PLACE
    target = None if empty else Output(backend, out, x.shape, x.dtype, source=x, in_place_ok=in_place_ok)
    yield from algorithm(ring, backend, call.tag, backend.flat(x), None if empty else target.flat, op, exclusive)
    return None if empty else target.result()


def barrier(ring: Ring, backend: NumpyBackend, call: Call) -> Steps:  # backend: the same signature as the others
    yield from _algorithm(ring, call, 0)(ring, call.tag)


def _encode_dtype(dtype: Any) -> int:
    return int.from_bytes(dtype_token(dtype).encode().ljust(8, b"\0"), "little")


def _decode_dtype(code: int, backend: NumpyBackend) -> Any:
    return dtype_from_token(code.to_bytes(8, "little").rstrip(b"\0").decode(), backend.xp)
