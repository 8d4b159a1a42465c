"""Message tags: which receive may match which message (docs/engine.md, "Tags").

A communicator's tags run from 0 to its MPI_TAG_UB (2^29-1 in the MPICH wheel, 2^31-1 in Open
MPI's, at least 32767 by the standard). With Q an eighth of that space:

    0            the consistency check's own exchange (MPIRING_CHECK)
    [1, Q)       sequence tags: each nonblocking call takes the next one on every rank, so calls
                 in flight at once never mix
    [Q, 2Q)      persistent tags: one per persistent request, for its life (its runs are ordered)
    [2Q, 4Q)     blocking tags: generation x call identity (below), and notices (NOTICE)
    [4Q, 8Q)     a transport's second message kind (the IPC path's acknowledgements: tag + 4Q)

A blocking tag is `2Q + generation * 2^IDENTITY_BITS + identity`:

    identity (mpiring.identity): | collective | dtype | op | algorithm | root mod 8 | layout round |
                                     4 bits     5 bits  4 bits  3 bits      3 bits       1 bit
    generation: calls that raised on this rank so far (Ring.failures), modulo what fits

Blocking calls run one at a time in the same order on every rank, and MPI keeps the messages
between two ranks on one tag in order, so calls with the same identity may share a tag (and a
plan's persistent requests can be bound to it). Calls that differ in identity never match each
other's messages, and a rank whose call raised alone never matches the messages its peers sent
for that call. Where the tag space is too small for identities (MPI_TAG_UB below 2^27), only the
layout-round bit is kept.
"""

from __future__ import annotations

IDENTITY_BITS = 20
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
        self.ack_offset = 4 * space  # tag + ack_offset: a transport's acknowledgement of tag
        self._persistent = space
        self._blocking = 2 * space
        room = 2 * space
        self.identity_bits = IDENTITY_BITS if room >> IDENTITY_BITS >= _MIN_GENERATIONS else 1
        self._identity_mask = (1 << self.identity_bits) - 1
        self._generations = room >> self.identity_bits

    def sequence(self, calls: int) -> int:
        """The sequence tag of the call numbered `calls`, in [1, Q)."""
        return calls % (self._persistent - 1) + 1

    def persistent(self, made: int) -> int:
        """The tag of the persistent request numbered `made`, in [Q, 2Q)."""
        return self._persistent + made % self._persistent

    def blocking(self, failures: int, identity: int) -> int:
        """The tag of a blocking call of `identity` after `failures` failed calls on this rank."""
        generation = failures % self._generations
        return self._blocking + (generation << self.identity_bits) + (identity & self._identity_mask)

    def notice(self, failures: int) -> int | None:
        """The tag of a notice from a rank that has seen `failures` failed calls (None where the
        tag space has no room for identities: no notices there)."""
        if self.identity_bits < IDENTITY_BITS:
            return None
        return self.blocking(failures, NOTICE | failures & _NOTICE_COUNT)

    def is_notice(self, tag: int) -> bool:
        return self.is_blocking(tag) and self.split(tag)[1] >> 16 == NOTICE >> 16

    def is_blocking(self, tag: int) -> bool:
        return self._blocking <= tag < self.ack_offset

    def with_identity(self, tag: int, bits: int) -> int:
        """A blocking `tag` with identity fields it left at zero now set to `bits` (the algorithm,
        once chosen); any other tag unchanged."""
        return tag + (bits & self._identity_mask) if self.is_blocking(tag) else tag

    def split(self, tag: int) -> tuple[int, int]:
        """A blocking tag's (generation, identity)."""
        offset = tag - self._blocking
        return offset >> self.identity_bits, offset & self._identity_mask
