"""Message tags: which receive may match which message (docs/engine.md, "Tags").

A communicator's tags run from 0 to its MPI_TAG_UB (2^29-1 in the MPICH wheel, 2^31-1 in Open
MPI's, at least 32767 by the standard). With Q an eighth of that space:

    0            the consistency check's own exchange (MPIRING_CHECK)
    [1, Q)       sequence tags: each nonblocking call takes the next sequence number on every
                 rank, so calls in flight at once never mix, with the kind of call beside it
    [Q, 2Q)      persistent tags: one per persistent request, for its life (its runs are ordered)
    [2Q, 4Q)     blocking tags: generation x sequence x call identity (below), and notices (NOTICE)
    4Q           the farewell: a rank's last message on a communicator it frees (engine.farewell)
    (4Q, 8Q)     a transport's second message kind (the IPC path's acknowledgements: tag + 4Q)

A blocking tag is `2Q + (generation * 2^SEQUENCE_BITS + sequence) * 2^IDENTITY_BITS + identity`:

    identity (mpiring.identity): | collective | dtype | op | algorithm | root mod 8 | layout round |
                                     4 bits     5 bits  4 bits  3 bits      3 bits       1 bit
    sequence: the call's number on this communicator mod 2^SEQUENCE_BITS (host calls; calls on
              device buffers, whose plans bind their tags for life, take 0)
    generation: calls that raised on this rank so far (Ring.failures), modulo what fits

Blocking calls run one at a time in the same order on every rank, and MPI keeps the messages
between two ranks on one tag in order. Calls that differ in identity never match each other's
messages; nor do consecutive calls (their sequence numbers differ), so a rank that skips or
repeats a call waits instead of taking another call's data; and a rank whose call raised alone
never matches the messages its peers sent for that call. Where the tag space is too small
(MPI_TAG_UB below 2^27), only the layout-round bit is kept, and no sequence number.

A nonblocking call's tag is `1 + sequence * 2^KIND_BITS + kind`, kind the identity's collective,
dtype and op fields (13 bits), where the space has room for 2^12 sequence numbers (MPI_TAG_UB
from 2^28), else its sequence number alone: ranks that start different kinds of calls at the
same place never match each other's messages. A persistent request's is `Q + made * 2^KIND_BITS
+ kind` the same way, `made` counting the requests made on the communicator (mod 2^13 in the
MPICH wheel's space: two requests alive at once share a tag only 8192 requests apart).
"""

from __future__ import annotations

IDENTITY_BITS = 20
SEQUENCE_BITS = 3  # a blocking call's sequence number mod 8 (the tag space of the MPICH wheel: 2^29)
KIND_BITS = 13  # a nonblocking call's kind: the identity's collective, dtype and op fields
_KIND_SHIFT = 7  # where those fields start in an identity (mpiring.identity: op at bit 7)
# A notice: an empty message a rank sends every other rank on its blocking tags when a blocking
# call raised there (waiting.leave_notice). Its identity is NOTICE (a collective code no collective
# has, 15) plus the rank's count of failed calls mod 2^16, so a notice is only taken for one of
# this rank's own generation for 65536 failures, not 2^7 (generations wrap sooner).
NOTICE = 15 << 16
_NOTICE_COUNT = (1 << 16) - 1
MIN_TAG_UB = 32767  # the MPI standard's least MPI_TAG_UB
_MIN_GENERATIONS = 16  # identities are kept in the tag only if at least this many generations fit


class Tags:
    """The tag ranges of one communicator."""

    def __init__(self, tag_ub: int | None) -> None:
        space = (max(tag_ub or 0, MIN_TAG_UB) + 1) // 8  # Q in the table above
        self.ack_offset = 4 * space  # tag + ack_offset: a transport's acknowledgement of tag (> 0)
        self.farewell = 4 * space
        self._persistent = space
        self._blocking = 2 * space
        room = 2 * space
        wide = room >> (IDENTITY_BITS + SEQUENCE_BITS) >= _MIN_GENERATIONS
        self.identity_bits = IDENTITY_BITS if wide else 1
        self.sequence_bits = SEQUENCE_BITS if wide else 0
        self._identity_mask = (1 << self.identity_bits) - 1
        self._sequence_mask = (1 << self.sequence_bits) - 1
        self.sequence_shift = self.identity_bits  # where a blocking tag's sequence number sits
        self._generations = room >> (self.identity_bits + self.sequence_bits)
        self._kinds = (space - 1) >> KIND_BITS >= 1 << 12  # room for nonblocking calls' kinds

    def sequence(self, calls: int, identity: int = 0) -> int:
        """The tag of the nonblocking call numbered `calls`, of this identity, in [1, Q)."""
        return 1 + self._with_kind(calls, identity, self._persistent - 1)

    def persistent(self, made: int, identity: int = 0) -> int:
        """The tag of the persistent request numbered `made`, of this identity, in [Q, 2Q)."""
        return self._persistent + self._with_kind(made, identity, self._persistent)

    def _with_kind(self, number: int, identity: int, room: int) -> int:
        if not self._kinds:
            return number % room
        kind = identity >> _KIND_SHIFT & ((1 << KIND_BITS) - 1)
        return (number % (room >> KIND_BITS) << KIND_BITS) + kind

    def blocking(self, failures: int, identity: int, calls: int = 0) -> int:
        """The tag of the blocking call numbered `calls` (0: a device call, or a notice), of
        `identity`, after `failures` failed calls on this rank."""
        generation = failures % self._generations
        slot = (generation << self.sequence_bits) + (calls & self._sequence_mask)
        return self._blocking + (slot << self.identity_bits) + (identity & self._identity_mask)

    def with_sequence(self, tag: int, calls: int) -> int:
        """A blocking tag made for one call, for the call numbered `calls` (a schedule's replay)."""
        return numbered(self.numbering(tag), tag, calls)

    def notice(self, failures: int, calls: int = 0) -> int | None:
        """The tag of a notice from a rank that has seen `failures` failed calls, that it left the
        call numbered `calls` (None where the tag space has no room for identities: no notices)."""
        if self.identity_bits < IDENTITY_BITS:
            return None
        return self.blocking(failures, NOTICE | failures & _NOTICE_COUNT, calls)

    def notice_of(self, tag: int, failures: int) -> bool:
        """Whether `tag` is a notice from a rank of this failure count (any call it left)."""
        return self.is_notice(tag) and self.split(tag)[2] & _NOTICE_COUNT == failures & _NOTICE_COUNT

    def is_notice(self, tag: int) -> bool:
        return self.is_blocking(tag) and self.split(tag)[2] >> 16 == NOTICE >> 16

    def is_blocking(self, tag: int) -> bool:
        return self._blocking <= tag < self.ack_offset

    def with_identity(self, tag: int, bits: int) -> int:
        """A blocking `tag` with identity fields it left at zero now set to `bits` (the algorithm,
        once chosen); any other tag unchanged."""
        return tag + (bits & self._identity_mask) if self.is_blocking(tag) else tag

    def numbering(self, tag: int) -> tuple[int, int, int]:
        """How a recorded call's tag takes each call's number (the C replay's (base, shift,
        mask), as `with_sequence`); (0, 0, 0) for a tag that carries none."""
        if not self.is_blocking(tag) or not self.sequence_bits:
            return 0, 0, 0
        return self._blocking, self.sequence_shift, self._sequence_mask

    def split(self, tag: int) -> tuple[int, int, int]:
        """A blocking tag's (generation, sequence number, identity)."""
        offset = tag - self._blocking
        slot = offset >> self.identity_bits
        return slot >> self.sequence_bits, slot & self._sequence_mask, offset & self._identity_mask

    def sequence_of(self, tag: int) -> tuple[int, int] | None:
        """A nonblocking call's or persistent request's tag as (place, kind), where the place is
        its number (a persistent one's offset by 2^32); None where tags carry no kind."""
        if not self._kinds or not 1 <= tag < self._blocking:
            return None
        offset, base = (tag - 1, 0) if tag < self._persistent else (tag - self._persistent, 1 << 32)
        return base + (offset >> KIND_BITS), offset & ((1 << KIND_BITS) - 1)


def numbered(numbering: tuple[int, int, int], tag: int, calls: int) -> int:
    """`tag` for the call numbered `calls`, by a recorded call's `numbering` (Tags.numbering:
    replay_c/run.c's `numbered` is the same); a tag below its base, or a numbering without a
    mask, carries no number."""
    first, mask, shift = number_field(numbering, tag)
    return first + ((calls & mask) << shift)


def number_field(numbering: tuple[int, int, int], tag: int) -> tuple[int, int, int]:
    """Where `numbered` puts a call's number into `tag`, as (the tag numbered 0, mask, shift): the
    call numbered n has tag `first + ((n & mask) << shift)`, arithmetic a replay does per call."""
    base, shift, mask = numbering
    if not mask or tag < base:
        return tag, 0, 0
    return base + ((tag - base) & ~(mask << shift)), mask, shift

