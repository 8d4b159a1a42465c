"""A communicator's hot state in Python: the same fields as `HotState`, `Counters`,
`RequestFields` and `CallFields` in the C extension (mpiring/engine/replay_c/), for where it was not built
(mpiring.engine.native picks one form or the other, once per process).

What every call reads or counts is kept in one object per communicator, which the Ring and the
Engine share and the C paths read as C fields (mpiring.engine.native):

    calls      collective calls made so far (each took a sequence number)
    served     the thread the fast paths serve: the owner while usable, else None
    owner      the thread that made the first call (None: none yet)
    timeout    the default timeout in seconds (None: no limit)
    freed      whether the communicator was freed
    broken     why the ring broke (a str), or None
    in_flight  the nonblocking calls and persistent runs not yet done (a list, never replaced)
    programs   layout key -> compiled schedule, the cache's (a dict, never replaced)
    traffic    what the communicator handed to MPI (a Traffic, never replaced)
"""

from __future__ import annotations

from typing import Any


class Counters:
    """Traffic's fields (mpiring.engine.transport.Traffic subclasses this), and `add`."""

    __slots__ = ("bytes_sent", "bytes_received", "messages")

    def __init__(self, bytes_sent: int = 0, bytes_received: int = 0, messages: int = 0) -> None:
        self.bytes_sent = bytes_sent
        self.bytes_received = bytes_received
        self.messages = messages

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.bytes_sent, self.bytes_received, self.messages) == (
            other.bytes_sent, other.bytes_received, other.messages)  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(bytes_sent={self.bytes_sent}, bytes_received={self.bytes_received}, "
                f"messages={self.messages})")

    def add(self, once: Counters) -> None:
        """Add once's counts to these."""
        self.bytes_sent += once.bytes_sent
        self.bytes_received += once.bytes_received
        self.messages += once.messages


class HotState:
    """A communicator's state that every call reads or counts (the fields above)."""

    __slots__ = ("calls", "served", "owner", "timeout", "freed", "broken", "in_flight", "programs", "traffic")

    def __init__(self, traffic: Counters) -> None:
        self.calls = 0
        self.served: int | None = None
        self.owner: int | None = None
        self.timeout: float | None = None
        self.freed = False
        self.broken: str | None = None
        self.in_flight: list[Any] = []
        self.programs: dict[tuple, Any] = {}
        self.traffic = traffic


class RequestFields:
    """A persistent request's fields that its C start and wait read and write
    (mpiring.engine.requests.PersistentRequest subclasses this)."""

    __slots__ = ("_freed", "_running", "_position", "_error", "_run")


class CallFields:
    """A call's fields that a persistent request's C start writes
    (mpiring.engine.transport.Call subclasses this)."""

    __slots__ = ("step", "number")
