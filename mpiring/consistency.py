"""Cross-rank consistency checks: with MPIRING_CHECK=1 every collective first compares a small
fingerprint of its call across the ranks, and raises `CollectiveMismatchError` on every rank,
naming the ranks and the fields that differ, instead of hanging or returning wrong data.

The fingerprint of a call (one fixed-size record per rank):

    field        compared for                                   value
    seq          every collective                               calls made on this communicator
    collective   every collective                               "allreduce", ...
    algorithm    every collective                               as asked for ("auto", "ring", ...)
    op           reduce, allreduce, reduce_scatter, scan,       "sum", ...
                 exscan
    root         broadcast, reduce, gather, scatter             the root rank
    dtype        all but barrier and scatter without counts=    numpy's dtype.str ("<f8": byte order too)
    shape        broadcast, reduce, allreduce, reduce_scatter,  the whole shape
                 alltoall, scan, exscan
    row shape    gather, allgather, alltoallv, scatter with     shape[1:] (row counts may differ)
                 counts=
    counts       gather, allgather, reduce_scatter, scatter     counts= as given, or none
                 (every rank passes the same list)

Without counts=, scatter's non-root ranks know neither the dtype nor the shape (only the root
holds the data), so scatter compares only seq, collective, algorithm, root and counts; with
counts= they compare their out=, the root its x. When the collectives themselves
differ, only that (and seq) is reported: the other fields of different collectives do not
compare meaningfully.

The exchange is one step of mpiring's own point-to-point transport: every rank sends its record
to every other rank and receives theirs, on a tag no collective uses, so a rank that never
arrives is named directly by a timeout ("still waiting to receive from rank 3"). Because the
records have a fixed size and a private tag, the exchange itself always matches up, whatever
the ranks called. It is blocking even for the nonblocking collectives: `icollective` returns
only after every rank has issued the same call (a debugging mode, not a fast one).

A rank whose own arguments failed before its record went out (Engine._refuse) still
exchanges one, carrying its ArgumentError, and every other rank raises that error too.

After a mismatch every rank has raised and no message is left in flight, so the communicator
stays usable (unless the sequence numbers differed: then the ranks' call counters, which also
pick the message tags, disagree, and later collectives would not match).

Checking is decided when the `Communicator` is created (MPIRING_CHECK, or `check=`); the ranks
agree then, and it is on for all of them if any rank asked for it, so a rank that checks never
waits for records from one that does not. Off, it costs one `is not None` test (and three
positional arguments) per call; docs/reliability.md has the measured cost when on.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import numpy

from mpiring import environment
from mpiring.backend import NUMPY, dtype_token
from mpiring.catalogue import JOINING, REDUCING, ROOTED
from mpiring.engine.ring import Ring
from mpiring.engine.run import run_to_end
from mpiring.engine.transport import Call, Steps
from mpiring.errors import ArgumentError, ArgumentTypeError, CollectiveMismatchError

_BY_ROWS = (*JOINING, "scatter")  # collectives whose ranks agree on rows' shape, not the whole
_COUNTED = ("gather", "allgather", "reduce_scatter", "scatter")  # counts= is the same on every rank

# Collective calls take tags from 1 up (Ring.next_tag), never 0: 0 is the check's own.
CHECK_TAG = 0

_TEXT = 32  # bytes for a name in a record; longer names are shortened with a checksum
_MAX_DIMS = 8  # dimensions stored as numbers; a longer shape is also compared by checksum
_UNKNOWN = -1
_PROBLEM = 192  # bytes for the problem of a refused argument; longer ones are cut
_ERROR_KINDS = (None, ArgumentError, ArgumentTypeError)  # error_kind indexes this

RECORD = numpy.dtype([
    ("seq", "<i8"),
    ("collective", f"S{_TEXT}"),
    ("algorithm", f"S{_TEXT}"),
    ("op", f"S{_TEXT}"),
    ("root", "<i8"),
    ("dtype", f"S{_TEXT}"),
    ("ndim", "<i8"),
    ("dims", "<i8", (_MAX_DIMS,)),
    ("shape_crc", "<i8"),
    ("counts_crc", "<i8"),  # counts= (a checksum of the list), _UNKNOWN where none was given
    # a rank that refused its own arguments: the ArgumentError's kind (0: none), argument, problem
    ("error_kind", "<i8"),
    ("argument", f"S{_TEXT}"),
    ("problem", f"S{_PROBLEM}"),
])
assert RECORD.fields["seq"][1] == 0 and RECORD.itemsize % 8 == 0  # Checker writes seq as word 0




class CallMismatchError(CollectiveMismatchError):
    """The ranks' fingerprints of one collective call differ (MPIRING_CHECK).

    `fields` names what differs ("dtype", "shape", ...); `ranks` are the ranks outside the
    largest group that agrees on every differing field (on a tie, the group holding the lowest
    rank counts as the reference); `groups` maps each field to {value: [ranks]}.
    """

    def __init__(self, collective: str, groups: dict[str, dict[str, list[int]]], ranks: list[int]) -> None:
        self.fields = list(groups)
        self.groups = groups
        self.ranks = ranks
        parts = []
        for name, by_value in groups.items():
            parts.append(f"{name} " + " but ".join(f"{value} on {_ranks(who)}" for value, who in by_value.items()))
        super().__init__(
            collective,
            f"the ranks called it differently (MPIRING_CHECK): {'; '.join(parts)}; "
            f"{_ranks(ranks)} {'differs' if len(ranks) == 1 else 'differ'} from the rest",
        )


def wanted(check: bool | None) -> bool:
    """Whether this rank asks for checks: `check=` if given, else MPIRING_CHECK."""
    if check is not None:
        if not isinstance(check, bool | numpy.bool_):  # check="no" must not turn checks on
            raise ArgumentTypeError("Communicator", "check", f"must be True, False or None, got {check!r}")
        return bool(check)
    return bool(environment.flag("MPIRING_CHECK", "Communicator"))


class Checker:
    """Compares each collective call's fingerprint across the ranks of one communicator."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.seq = 0  # calls checked so far: the same on every rank while they agree
        # One table, reused by every call (the exchange completes before compare returns): a
        # record per rank, seen as raw bytes for MPI and for the all-equal fast path.
        self.table = numpy.zeros(ring.size, RECORD)
        self._rows = self.table.view(numpy.uint8).reshape(ring.size, -1)
        self._words = self.table.view(numpy.int64).reshape(ring.size, -1)  # word 0 is seq
        self._sends, self._receives = _pairs(ring, self._rows)

    def compare(self, call: Call, x: Any = None, op: str | None = None, root: int | None = None,
                counts: Any = None) -> None:
        """Exchange this call's fingerprint with every rank; raise CallMismatchError on a difference.

        `x` is the checked input array (None where the collective has none or this rank cannot
        know it), `op`, `root` and `counts` as the call was given them.
        """
        self.seq += 1
        ring, collective = self.ring, call.collective
        dtype, shape = "", None
        if x is not None:  # (None: barrier, and scatter without counts= everywhere but its root)
            dtype, shape = dtype_token(x.dtype), tuple(x.shape[1:] if collective in _BY_ROWS else x.shape)
        self._rows[ring.rank] = _record(
            collective, call.algorithm, op if collective in REDUCING else None,
            root if collective in ROOTED else None, dtype, shape,
            None if counts is None else tuple(int(n) for n in counts),
        )
        self._exchange(call)
        records = self.table.tobytes()
        if records == records[: RECORD.itemsize] * ring.size:
            return  # the usual case: every record is the same, byte for byte
        refused = self.table["error_kind"].nonzero()[0]
        if refused.size:  # another rank refused its arguments: raise its error here too
            raise _refusal(collective, self.table[refused[0]], int(refused[0]))
        groups = _differences(self.table)
        if groups:
            raise CallMismatchError(collective, groups, _odd_ranks(groups, ring.size))

    def refuse(self, collective: str, timeout: float | None, error: ArgumentError) -> None:
        """This rank raises `error` for its own arguments before it could compare the call: take
        part in the exchange anyway, with a record that carries the error, so that every other
        rank raises the same ArgumentError rather than waiting for this one."""
        self.seq += 1
        record = numpy.zeros(1, RECORD)
        record["collective"] = _text(collective)
        record["error_kind"] = _ERROR_KINDS.index(type(error)) if type(error) in _ERROR_KINDS else 1
        record["argument"] = _text(error.argument)
        record["problem"] = error.problem.encode()[:_PROBLEM]
        self._rows[self.ring.rank] = record.view(numpy.uint8)
        self._exchange(Call(collective, "auto", CHECK_TAG, timeout))

    def _exchange(self, call: Call) -> None:
        """Send this rank's record (with this call's seq) to every rank and receive theirs."""
        ring = self.ring
        self._words[ring.rank, 0] = self.seq
        # The check's own messages are not the collective's: keep them out of the traffic counts
        # (tests and benchmarks compare those with the algorithms' byte counts).
        traffic = ring.traffic
        saved = (traffic.bytes_sent, traffic.bytes_received, traffic.messages)
        checking = Call(call.collective, f"consistency check before {call.algorithm}", CHECK_TAG, call.timeout)
        try:
            run_to_end(ring, _exchange(ring, self._sends, self._receives), checking)
        finally:
            traffic.bytes_sent, traffic.bytes_received, traffic.messages = saved


@functools.lru_cache(maxsize=512)
def _record(
    collective: str, algorithm: str, op: str | None, root: int | None, dtype: str, shape: tuple[int, ...] | None,
    counts: tuple[int, ...] | None = None,
) -> numpy.ndarray:
    """A call's record with seq 0, as bytes (calls repeat, so records are cached; seq is set per call)."""
    record = numpy.zeros(1, RECORD)
    record["collective"], record["algorithm"], record["op"] = _text(collective), _text(algorithm), _text(op or "")
    record["root"] = _UNKNOWN if root is None else root
    record["dtype"] = _text(dtype)
    record["ndim"] = _UNKNOWN
    if shape is not None:
        record["ndim"] = len(shape)
        record["dims"][0, : min(len(shape), _MAX_DIMS)] = shape[:_MAX_DIMS]
        record["shape_crc"] = zlib.crc32(repr(tuple(int(n) for n in shape)).encode())
    record["counts_crc"] = _UNKNOWN if counts is None else zlib.crc32(repr(counts).encode())
    return record.view(numpy.uint8)


def make_checker(ring: Ring, check: bool | None, timeout: float | None) -> Checker | None:
    """A Checker if any rank of `ring` asks for checks (see `wanted`), else None. Collective.

    Every rank takes part in the agreement, checking or not, so that either all ranks check
    or none do.
    """
    mine = wanted(check)
    if ring.size == 1:
        return Checker(ring) if mine else None
    flags = numpy.zeros(ring.size, numpy.int64)
    flags[ring.rank] = int(mine)
    agreeing = Call("Communicator", "consistency check agreement", CHECK_TAG, timeout)
    traffic = ring.traffic
    saved = (traffic.bytes_sent, traffic.bytes_received, traffic.messages)
    try:
        run_to_end(ring, _exchange(ring, *_pairs(ring, flags.view(numpy.uint8).reshape(ring.size, -1))), agreeing)
    finally:
        traffic.bytes_sent, traffic.bytes_received, traffic.messages = saved
    return Checker(ring) if flags.any() else None


def _pairs(ring: Ring, rows: Any) -> tuple[list, list]:
    """(sends, receives) that give every other rank this rank's row of `rows` and fill theirs."""
    others = [k for k in range(ring.size) if k != ring.rank]
    return [(rows[ring.rank], k) for k in others], [(rows[k], k) for k in others]


def _exchange(ring: Ring, sends: list, receives: list) -> Steps:
    """All the rows in one step: every rank sends to and receives from every other rank."""
    yield ring.post(NUMPY, CHECK_TAG, sends=sends, receives=receives)


def _refusal(collective: str, record: Any, rank: int) -> ArgumentError:
    """The ArgumentError another rank raised for its own arguments, as this rank raises it."""
    kind = _ERROR_KINDS[int(record["error_kind"])]
    problem = record["problem"].decode(errors="replace")
    return kind(collective, record["argument"].decode(errors="replace"), f"{problem} (on rank {rank}; MPIRING_CHECK "
                "makes every rank raise it)")


def _text(value: str) -> bytes:
    raw = value.encode()
    if len(raw) <= _TEXT:
        return raw
    return raw[: _TEXT - 9] + b"~" + f"{zlib.crc32(raw):08x}".encode()


def _shape_text(record: Any) -> str:
    ndim = int(record["ndim"])
    if ndim == _UNKNOWN:
        return "unknown"
    dims = [int(n) for n in record["dims"][: min(ndim, _MAX_DIMS)]]
    if ndim > _MAX_DIMS:
        return f"({', '.join(map(str, dims))}, ... {ndim} dims, checksum {int(record['shape_crc']):08x})"
    return repr(tuple(dims))


def _field_values(record: Any) -> dict[str, str]:
    """The comparable fields of one rank's record, as the text an error shows."""
    collective = record["collective"].decode()
    shown = {
        "collective": collective,
        "seq": f"call #{int(record['seq'])}",
        "algorithm": repr(record["algorithm"].decode()),
    }
    if collective in REDUCING:
        shown["op"] = repr(record["op"].decode())
    if collective in ROOTED:
        shown["root"] = str(int(record["root"]))
    if record["dtype"]:  # empty where this rank has no data to describe (barrier, scatter)
        shown["dtype"] = record["dtype"].decode()
        shown["row shape" if collective in _BY_ROWS else "shape"] = _shape_text(record)
    if collective in _COUNTED:
        crc = int(record["counts_crc"])
        shown["counts"] = "none" if crc == _UNKNOWN else f"a list (checksum {crc:08x})"
    return shown


def _differences(table: Any) -> dict[str, dict[str, list[int]]]:
    """{field: {value: [ranks]}} for every field on which the ranks' records differ."""
    values = [_field_values(record) for record in table]
    fields = ["collective", "seq"]
    if len({v["collective"] for v in values}) == 1:
        fields += [name for name in ("algorithm", "op", "root", "dtype", "shape", "row shape", "counts")
                   if name in values[0]]
    groups: dict[str, dict[str, list[int]]] = {}
    for name in fields:
        by_value: dict[str, list[int]] = {}
        for rank, shown in enumerate(values):
            by_value.setdefault(shown.get(name, "none"), []).append(rank)
        if len(by_value) > 1:
            groups[name] = by_value
    if "dtype" in groups:  # dtype.str is exact but terse ("<f4"): show numpy's names
        groups["dtype"] = {_dtype_name(value): who for value, who in groups["dtype"].items()}
    return groups


def _dtype_name(text: str) -> str:
    try:
        return numpy.dtype(text).name
    except TypeError:
        return text


def _odd_ranks(groups: dict[str, dict[str, list[int]]], size: int) -> list[int]:
    """The ranks outside the largest group agreeing on every differing field."""
    key_of = {rank: tuple(_value_of(rank, by_value) for by_value in groups.values()) for rank in range(size)}
    members: dict[tuple, list[int]] = {}
    for rank in range(size):
        members.setdefault(key_of[rank], []).append(rank)
    reference = max(members.values(), key=lambda who: (len(who), -who[0]))
    return [rank for rank in range(size) if rank not in reference]


def _value_of(rank: int, by_value: dict[str, list[int]]) -> str:
    for value, who in by_value.items():
        if rank in who:
            return value
    return ""


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
