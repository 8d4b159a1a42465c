"""Every environment variable mpiring reads is read here, each kind with one rule.

    variable                   kind              read when                    meaning
    MPIRING_TIMEOUT            seconds | none    a Communicator is made       default timeout of its calls
    MPIRING_CHECK              yes/no            a Communicator is made       consistency checks (reliability.md)
    MPIRING_ALGO               algorithm names   import, Communicator made    algorithm overrides (mpiring.selection)
    MPIRING_DEBUG              yes/no            import, Communicator made    say which algorithm and path ran
    MPIRING_SWITCH_POINTS      a JSON file       import, Communicator made    switch points replacing auto's rows
                                                                               (mpiring.selection, docs/tuning.md)
    MPIRING_CUDA_AWARE         yes/no            every device call            device pointers may go to MPI
    MPIRING_GPU_IPC            yes/no            every device call            node-local device buffers by CUDA IPC
    MPIRING_GPU_SEGMENT_BYTES  positive integer  a staged backend is made     segment size of staged transfers
    MPIRING_GPU_HOST_BYTES     integer >= 0      a device backend is made     largest device message run on host
                                                                               copies (mpiring.gpu.host_route; 0: none)
    MPIRING_SCRATCH_BYTES      positive integer  a Communicator is made       most scratch bytes kept for reuse
    MPIRING_INFLIGHT_BYTES     positive integer  a Communicator is made       most bytes nonblocking calls hold
    MPIRING_COMPILED           yes/no            a call is recorded           0: replay it in Python, not in C
    MPIRING_PERSISTENT_SENDS   yes/no            a Communicator is made       device plans send by persistent requests
                                                                               (default: yes, except under Open MPI)
    MPIRING_BUSY_POLL          yes/no            a Communicator is made       waits test without offering the core
                                                                               (default: a core per rank on the machine)
    MPIRING_VIRTUAL_NODES      N[:round-robin]   a Communicator is made       split each node into virtual nodes
                               or sizes 3,1                                   (mpiring.topology)
    MPIRING_NODE_AWARE         yes/no            a Communicator is made       0: auto ignores the nodes
    MPIRING_SURVIVE            yes/no            a Communicator is made       survive a lost rank (mpiring.survival)
    MPIRING_HEARTBEAT_TIMEOUT  seconds           a surviving one is made      a peer silent this long is lost
    MPIRING_SURVIVAL_ADDRESS   an address        a surviving one is made      where other machines reach this rank
    MPIRING_HUGE_PAGES         yes/no            a large host array is made   0: no 2 MiB pages (mpiring.host_memory)
    MPIRING_FABRIC             a file            the cost model loads one     the calibrated fabric (mpiring.cost_model)
    MPIRING_TORCH_PROGRESS     yes/no            a torch process group made   1: a progress thread runs its collectives
                                                                               (mpiring.torch; default: no)

yes/no: 1, true, yes, on or 0, false, no, off, in any case; unset or empty means "not set".
Anything else raises ArgumentError naming the variable, before any message moves.
"""

from __future__ import annotations

import math
import os

from mpiring.errors import ArgumentError

YES = ("1", "true", "yes", "on")
NO = ("0", "false", "no", "off")


def text(name: str) -> str:
    """The variable's value, stripped ("" when unset)."""
    return os.environ.get(name, "").strip()


def yes_no(word: str, name: str, what: str) -> bool | None:
    """A yes/no word as True or False, "" as None; `what` names the caller in the error."""
    lowered = word.strip().lower()
    if not lowered:
        return None
    if lowered in YES:
        return True
    if lowered in NO:
        return False
    raise ArgumentError(what, name, f"must be 1 or 0 (true/false, yes/no, on/off), got {word!r}")


def flag(name: str, what: str) -> bool | None:
    """A yes/no variable: True, False, or None when unset or empty."""
    return yes_no(text(name), name, what)


def seconds(name: str, what: str) -> float | None:
    """A number of seconds, math.inf for none/inf/off; None when unset or empty."""
    value = text(name)
    if not value:
        return None
    if value.lower() in ("none", "inf", "off"):
        return math.inf
    try:
        return float(value)
    except ValueError:
        raise ArgumentError(what, name, f"must be a number of seconds or none, got {value!r}") from None


def positive_int(name: str, what: str) -> int | None:
    """A positive integer; None when unset or empty."""
    return _count(name, what, 1)


def count(name: str, what: str) -> int | None:
    """An integer >= 0; None when unset or empty."""
    return _count(name, what, 0)


def _count(name: str, what: str, least: int) -> int | None:
    value = text(name)
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        kind = "positive" if least else "non-negative"
        raise ArgumentError(what, name, f"must be a {kind} number of bytes, got {value!r}")
    return number
