"""Exceptions raised by mpiring. Every one names the collective that raised it."""

from __future__ import annotations


class MpiringError(Exception):
    """Base class of every exception mpiring raises."""


class ArgumentError(MpiringError, ValueError):
    """A collective was called with an argument it cannot accept.

    Raised on every rank that sees the bad argument, before any message moves, so the
    communicator stays usable.
    """

    def __init__(self, collective: str, argument: str, problem: str) -> None:
        self.collective = collective
        self.argument = argument
        self.problem = problem
        super().__init__(f"{collective}: argument '{argument}': {problem}")


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of a type or dtype the collective cannot take (object, string, structured,
    longdouble or datetime arrays; an op its dtype has no meaning for): a TypeError, as Python
    and NumPy raise for such mistakes, and still an ArgumentError."""


class CommunicationError(MpiringError, RuntimeError):
    """MPI reported an error, or a message did not have the size this rank expected.

    The usual cause is ranks that passed different shapes, lengths or dtypes to the same
    collective. mpiring raises instead of returning data that could be silently wrong.
    """

    # every message this rank sent in the call had gone when it raised, so no peer's data can
    # change after it left (mpiring.engine.notice_board: it posts nothing then)
    sends_done = False

    def __init__(self, collective: str, problem: str) -> None:
        self.collective = collective
        super().__init__(f"{collective}: {problem}")


class CollectiveMismatchError(MpiringError):
    """Ranks called the same collective with arguments that do not fit together.

    Raised on every rank, naming the ranks and what differs, instead of hanging or
    returning wrong data.
    """

    def __init__(self, collective: str, problem: str) -> None:
        self.collective = collective
        super().__init__(f"{collective}: {problem}")


class MessageMismatchError(CollectiveMismatchError, CommunicationError):
    """A peer this rank waits for sent a message of another call: the ranks called different
    collectives, or with different dtypes, ops, roots or algorithms, or a call raised on one of
    them only (docs/engine.md, tags). Raised while waiting, on the ranks that see such a message;
    like any failed call it leaves messages in flight, so the communicator is broken afterwards."""

    def __init__(self, collective: str, problem: str) -> None:
        self.collective = collective
        MpiringError.__init__(self, f"{collective}: {problem}")


class CollectiveTimeout(MpiringError, TimeoutError):
    """A collective waited longer than its timeout (``timeout=`` or ``MPIRING_TIMEOUT``).

    Names the collective, the algorithm, the step it was in and the peer ranks whose messages
    had not arrived or been taken: usually a rank that skipped the collective, called a different
    one, or died. The call's receives still posted are cancelled, so nothing is written into its
    arrays afterwards; its sends may still read `x` (and an `out=` it sends from) until the peers
    take them, so leave those unwritten while the job goes on. The communicator takes no more calls.
    """

    def __init__(self, collective: str, algorithm: str, step: int, waiting_on: list[str], seconds: float,
                 notice_from: int | None = None) -> None:
        self.collective = collective
        self.algorithm = algorithm
        self.step = step
        self.waiting_on = waiting_on
        self.seconds = seconds
        self.notice_from = notice_from  # the peer that timed out and whose notice ended this wait
        why = "" if notice_from is None else (f"rank {notice_from} timed out in this call and left it, and its "
                                              "notice ended this rank's wait; ")
        super().__init__(
            f"{collective} ({algorithm}) timed out after {seconds:g} s in step {step}, "
            f"still waiting to {', '.join(waiting_on)} ({why}its receives were cancelled; its sends may still "
            "read x until those ranks take them: do not write x while the job goes on)"
        )


class CommunicatorFreedError(MpiringError, RuntimeError):
    """A collective was called on a Communicator after its free()."""

    def __init__(self, collective: str) -> None:
        self.collective = collective
        super().__init__(f"{collective}: this Communicator was freed (free() or the end of its `with` block); "
                         "make a new one")


class CommunicatorBrokenError(CommunicationError):
    """A collective was called on a Communicator that timed out or failed in an earlier call on
    this rank. Messages of that call may still be in flight and could match a later call's, so
    no later call on it is trusted: make a new Communicator."""

    def __init__(self, collective: str, cause: str) -> None:
        super().__init__(collective, f"this Communicator broke on this rank in {cause}; messages of that call "
                                     "may still be in flight, so it takes no more calls: make a new Communicator")


class ConcurrentUseError(MpiringError, RuntimeError):
    """A second thread called a Communicator (its first caller's). Calls must come in the same
    order on every rank, which two threads cannot promise, so the communicator breaks on this
    rank (later calls raise CommunicatorBrokenError) rather than mix the threads' data."""

    def __init__(self, collective: str) -> None:
        self.collective = collective
        super().__init__(f"{collective}: called from a second thread; a Communicator serves the thread that "
                         "first called it (make one per thread), and this one is now broken on this rank")


class Unconverted:
    """Stands in for an argument that could not be seen as an array (mpiring.interop): the
    collective's own argument check raises `error` in its place, so the refusal takes the path
    of any bad argument (raised before a message moves, the ranks' calls kept in step), and an
    argument the collective ignores (x off scatter's root, out= off reduce's) stays ignored."""

    __slots__ = ("error",)

    def __init__(self, error: ArgumentError) -> None:
        self.error = error


class RankLostError(CommunicationError):
    """A rank of the communicator is gone (its process died, or its machine went silent), seen by
    a communicator made with survival on (``survive=True`` or MPIRING_SURVIVE=1; docs/lost-rank.md).

    Raised on every survivor: by the call that was waiting when the loss was seen (its receives
    cancelled, so nothing lands in its arrays later) and by every later call. `lost` names the
    lost ranks (this communicator's numbers). The communicator then takes only `revoke()`,
    `agree()`, `shrink()` and `free()`: shrink to the survivors and go on there."""

    def __init__(self, collective: str, lost: list[int], revoked: bool = False) -> None:
        self.lost = list(lost)
        self.revoked = revoked
        names = ", ".join(map(str, self.lost))
        super().__init__(collective, f"rank{'s' if len(self.lost) > 1 else ''} {names} of this communicator "
                                     "is lost (its process is gone); the call did not complete here, and the "
                                     "communicator takes no more collectives: shrink() it to the survivors")


class CommunicatorRevokedError(CommunicationError):
    """A rank revoked the communicator (`revoke()`, ULFM's MPI_Comm_revoke): every rank's waits
    end with this error, and it takes only `agree()`, `shrink()` and `free()` from then on."""

    def __init__(self, collective: str) -> None:
        super().__init__(collective, "this communicator was revoked (revoke() on some rank); it takes no more "
                                     "collectives: shrink() it, or free() it")
