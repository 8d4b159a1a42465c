"""Surviving a lost rank: noticing that a peer process is gone, and the survivors' revoke,
agree and shrink (ULFM's meaning, built without ULFM: the PyPI wheels of MPICH and Open MPI
have none that works).

MPI itself says nothing when a peer dies: a receive posted to it stays pending for ever. So a
communicator made with survival on (``Communicator(survive=True)`` or ``MPIRING_SURVIVE=1``)
keeps a TCP connection to each of its peers, served by one watcher thread per process:

    rank 0 ── socket ── rank 1          a peer that dies (os._exit, SIGKILL, a crash) has its
       \\                 /             sockets closed by the kernel: its peers read EOF at once
        ── socket ── rank 2             a peer that goes silent (a lost machine) is lost once
                                        nothing came from it for MPIRING_HEARTBEAT_TIMEOUT s

The watcher sets the communicator's `Liveness.failed`; every wait of the engine polls (a
survival communicator never blocks in one MPI_Waitall) and raises `RankLostError` when it
sees the flag. The same connections carry a revoke (every peer's waits end with
`CommunicatorRevokedError`) and the rounds of `agree`, the consensus shrink is built on.

Nothing here runs unless survival is asked for: the default stays "the launcher ends the job".
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

from mpi4py import MPI

from mpiring import environment
from mpiring.errors import ArgumentError, CommunicationError, CommunicatorRevokedError, RankLostError

# How often each rank tells its peers it is alive (a one-byte frame on each connection).
HEARTBEAT_SECONDS = 0.25
# A peer from which nothing came for this long is lost (MPIRING_HEARTBEAT_TIMEOUT overrides):
# long enough that a rank busy in a long computation holding the GIL is not taken for dead.
DEFAULT_HEARTBEAT_TIMEOUT = 10.0

# Frames: one kind byte, then for AGREE a fixed header and the lost ranks.
_HEARTBEAT, _REVOKE, _AGREE, _BYE = b"H", b"R", b"A", b"B"
_AGREE_HEAD = struct.Struct("<iiiqi")  # instance, round, decided (0/1), value, number of lost ranks
_RANK = struct.Struct("<i")

_any_loss = False  # a loss or revoke was seen in this process: MPI_Finalize would wait for the dead
_uncaught = False  # an exception reached the top: exit with status 1


def requested(survive: bool | None) -> bool:
    """Whether a Communicator made with `survive` (None: MPIRING_SURVIVE decides) survives lost ranks."""
    if survive is None:
        return bool(environment.flag("MPIRING_SURVIVE", "Communicator"))
    return bool(survive)


def heartbeat_timeout() -> float:
    """Seconds of silence after which a peer is lost (MPIRING_HEARTBEAT_TIMEOUT, default 10)."""
    seconds = environment.seconds("MPIRING_HEARTBEAT_TIMEOUT", "Communicator")
    return DEFAULT_HEARTBEAT_TIMEOUT if seconds is None else seconds


class _Peer:
    """One connection: its socket, what arrived of a frame not complete yet, and when it last spoke."""

    __slots__ = ("rank", "sock", "buffer", "heard", "lock")

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank, self.sock = rank, sock
        self.buffer = bytearray()
        self.heard = time.monotonic()
        self.lock = threading.Lock()  # the watcher's heartbeats and the caller's frames do not interleave


class Liveness:
    """What one communicator knows of its peers: the ranks lost (`lost`), whether it was revoked,
    and `failed` (either: every wait of the engine reads this one attribute). Made collectively
    (it exchanges addresses over `comm`); the watcher thread keeps it up to date."""

    def __init__(self, comm: MPI.Intracomm, silence: float | None = None) -> None:
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.silence = heartbeat_timeout() if silence is None else silence
        self.lost: set[int] = set()
        self.revoked = False
        self.failed = False
        self.detected_at: float | None = None  # time.monotonic() of the first loss seen (measurements)
        self.acknowledged: set[int] = set()
        self.left: set[int] = set()  # peers that freed the communicator (said goodbye): not lost
        self.on_failure: list[Any] = []  # called (no arguments) by the watcher when `failed` turns True
        self.changed = threading.Condition()
        self._instance = 0  # agreements made so far (each rank makes them in the same order)
        self._inbox: dict[tuple[int, int], dict[int, tuple[int, int, frozenset[int]]]] = {}
        self._decided: dict[int, tuple[int, frozenset[int]]] = {}
        self.peers: dict[int, _Peer] = {}
        _ignore_failure_signal()
        self._connect(comm)
        _WATCHER.add(self)

    # ---- making the connections ----

    def _connect(self, comm: MPI.Intracomm) -> None:
        """Every rank listens; each connects to every lower rank and accepts every higher one,
        each connection opening with the connecting rank's number."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("", 0))
        listener.listen(max(self.size, 8))
        host = socket.gethostname()
        address = _address_of(host)
        table = comm.allgather((host, address, listener.getsockname()[1]))
        try:
            for peer in range(self.rank):
                their_host, their_address, port = table[peer]
                sock = socket.create_connection(("127.0.0.1" if their_host == host else their_address, port),
                                                timeout=60)
                sock.sendall(_RANK.pack(self.rank))
                self._keep(peer, sock)
            listener.settimeout(60)
            for _ in range(self.rank + 1, self.size):
                sock, _ = listener.accept()
                sock.settimeout(60)
                peer = _RANK.unpack(_receive_exactly(sock, _RANK.size))[0]
                self._keep(peer, sock)
        finally:
            listener.close()
        comm.Barrier()  # every connection is up before any rank may leave

    def _keep(self, peer: int, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.peers[peer] = _Peer(peer, sock)

    # ---- what the watcher calls ----

    def _mark_lost(self, peer: int) -> None:
        global _any_loss
        with self.changed:
            if peer in self.lost:
                return
            self.lost.add(peer)
            if self.detected_at is None:
                self.detected_at = time.monotonic()
            _any_loss = True
            self._set_failed()
            self.changed.notify_all()
        _WATCHER.drop(self, peer)

    def _set_failed(self) -> None:
        first = not self.failed
        self.failed = True
        if first:
            for hook in self.on_failure:
                with contextlib.suppress(Exception):
                    hook()

    def _frame(self, peer: _Peer, kind: bytes, body: bytes) -> None:
        if kind == _REVOKE:
            self._revoked_by_peer()
        elif kind == _AGREE:
            instance, round_, decided, value, count = _AGREE_HEAD.unpack_from(body)
            lost = frozenset(struct.unpack_from(f"<{count}i", body, _AGREE_HEAD.size))
            with self.changed:
                if decided:
                    self._decided.setdefault(instance, (value, lost))
                elif instance not in self._decided:  # (a round of an agreement decided here already: late)
                    self._inbox.setdefault((instance, round_), {})[peer.rank] = (value, lost)
                self.changed.notify_all()
        elif kind == _BYE:  # the peer freed this communicator: its connection closes, it is not lost
            self.left.add(peer.rank)
            _WATCHER.drop(self, peer.rank)

    def _revoked_by_peer(self) -> None:
        if not self.revoked:
            self.revoke()  # passed on once: the revoker may have died before telling every rank

    # ---- the public operations ----

    def revoke(self) -> None:
        """Mark the communicator revoked here and on every live peer (their waits end at once)."""
        with self.changed:
            if self.revoked:
                return
            self.revoked = True
            self._set_failed()
            self.changed.notify_all()
        self._send_all(_REVOKE, b"")

    def error(self, collective: str) -> RankLostError | CommunicatorRevokedError:
        """The error a call on this communicator raises now that it failed."""
        if self.lost:
            return RankLostError(collective, sorted(self.lost), self.revoked)
        return CommunicatorRevokedError(collective)

    def agree(self, value: int) -> tuple[int, frozenset[int]]:
        """Consensus among the live ranks on (the bitwise AND of their `value`s, the ranks lost).

        Flooding consensus over the connections, with the watcher as a perfect failure detector
        (a dead process's sockets close): each round, every rank sends what it knows to every rank
        it believes alive and waits for the same from each of them (or its loss). A round that
        heard from the same ranks as the one before saw no new loss: every rank heard from then
        knows what this one knows, so it decides, and sends the decision, which a rank that gets it
        adopts and passes on. Every rank calls its agreements in the same order (`_instance`)."""
        instance = self._instance
        self._instance += 1
        known_value, known_lost = value, frozenset(self.lost)
        heard_before = frozenset(range(self.size)) - {self.rank}
        round_ = 0
        while True:
            round_ += 1
            self._send_all(_AGREE, _agree_body(instance, round_, 0, known_value, known_lost))
            with self.changed:
                while True:
                    if instance in self._decided:
                        decided_value, decided_lost = self._decided[instance]
                        break
                    alive = frozenset(self.peers) - self.lost
                    got = self._inbox.get((instance, round_), {})
                    if all(peer in got for peer in alive):
                        decided_value = None
                        break
                    self.changed.wait(0.05)
                if decided_value is None:
                    heard = frozenset(peer for peer in got if peer not in self.lost)
                    for their_value, their_lost in (got[peer] for peer in heard):
                        known_value &= their_value
                        known_lost |= their_lost
                    known_lost |= self.lost
                    for key in [key for key in self._inbox if key[0] == instance and key[1] <= round_]:
                        del self._inbox[key]
            if decided_value is not None:
                known_value, known_lost = decided_value, decided_lost
                break
            if heard == heard_before:
                break
            heard_before = heard
        with self.changed:
            self._decided[instance] = (known_value, known_lost)
            for key in [key for key in self._inbox if key[0] == instance]:
                del self._inbox[key]
        # the decision goes to every rank still believed alive, which passes it on in turn
        self._send_all(_AGREE, _agree_body(instance, round_, 1, known_value, known_lost))
        for peer in known_lost - self.lost:  # lost on another rank's word: the kernel will tell this one too
            self._mark_lost(peer)
        return known_value, known_lost

    def close(self) -> None:
        """Say goodbye on every connection and close it (the communicator was freed): the peers
        stop watching this rank rather than take it for lost."""
        self._send_all(_BYE, b"")
        _WATCHER.remove(self)

    # ---- sending ----

    def _send_all(self, kind: bytes, body: bytes) -> None:
        frame = kind + (struct.pack("<i", len(body)) + body if kind == _AGREE else b"")
        for peer in list(self.peers.values()):
            if peer.rank not in self.lost and peer.rank not in self.left:
                _send(peer, frame)


def _ignore_failure_signal() -> None:
    """MPICH's Hydra, launched with -disable-auto-cleanup, sends SIGUSR1 to the other ranks when one
    fails (a notice for MPI libraries that handle it); its default action would end them. The
    watcher is how a surviving rank learns of the loss, so the signal is ignored, unless the program
    handles it itself (only the main thread may set a handler)."""
    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is not None and threading.current_thread() is threading.main_thread() and \
            signal.getsignal(usr1) == signal.SIG_DFL:
        signal.signal(usr1, signal.SIG_IGN)


def _agree_body(instance: int, round_: int, decided: int, value: int, lost: frozenset[int]) -> bytes:
    ranks = sorted(lost)
    return _AGREE_HEAD.pack(instance, round_, decided, value, len(ranks)) + struct.pack(f"<{len(ranks)}i", *ranks)


def _send(peer: _Peer, frame: bytes, patience: float = 1.0) -> bool:
    """Send a whole frame (False: the connection is gone, which the watcher reports, or full). A
    peer that stopped reading fills the buffer: give up after `patience` seconds rather than block
    (a heartbeat gives up at once: the silence is the peer's to explain)."""
    with peer.lock:
        view, deadline = memoryview(frame), time.monotonic() + patience
        while view:
            try:
                sent = peer.sock.send(view)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.001)
                continue
            except OSError:
                return False
            view = view[sent:]
    return True


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("a peer closed its connection while it was being made")
        data += chunk
    return data


def _address_of(host: str) -> str:
    """This host's address as peers on other machines reach it (MPIRING_SURVIVAL_ADDRESS overrides)."""
    chosen = environment.text("MPIRING_SURVIVAL_ADDRESS")
    if chosen:
        return chosen
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


class _Watcher:
    """The one thread per process that reads every survival connection and sends heartbeats."""

    def __init__(self) -> None:
        self.selector: selectors.BaseSelector | None = None
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.livenesses: list[Liveness] = []

    def add(self, liveness: Liveness) -> None:
        with self.lock:
            if self.selector is None:
                self.selector = selectors.DefaultSelector()
            for peer in liveness.peers.values():
                self.selector.register(peer.sock, selectors.EVENT_READ, (liveness, peer))
            self.livenesses.append(liveness)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="mpiring-survival", daemon=True)
                self.thread.start()

    def drop(self, liveness: Liveness, rank: int) -> None:
        peer = liveness.peers.get(rank)
        if peer is None:
            return
        with self.lock, contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(peer.sock)
        with contextlib.suppress(OSError):
            peer.sock.close()

    def remove(self, liveness: Liveness) -> None:
        with self.lock:
            if liveness in self.livenesses:
                self.livenesses.remove(liveness)
        for rank in list(liveness.peers):
            self.drop(liveness, rank)
        liveness.peers.clear()

    def _run(self) -> None:
        next_beat = 0.0
        while True:
            with self.lock:
                selector = self.selector
            try:
                events = selector.select(timeout=HEARTBEAT_SECONDS / 2)
            except (OSError, ValueError):  # a socket closed under select: look again
                events = []
            now = time.monotonic()
            for key, _ in events:
                liveness, peer = key.data
                self._read(liveness, peer, now)
            if now >= next_beat:
                next_beat = now + HEARTBEAT_SECONDS
                with self.lock:
                    livenesses = list(self.livenesses)
                for liveness in livenesses:
                    for peer in list(liveness.peers.values()):
                        if peer.rank in liveness.lost or peer.rank in liveness.left:
                            continue
                        if now - peer.heard > liveness.silence:
                            liveness._mark_lost(peer.rank)
                        else:
                            _send(peer, _HEARTBEAT, 0.0)  # a closed connection shows as EOF on reading

    def _read(self, liveness: Liveness, peer: _Peer, now: float) -> None:
        try:
            data = peer.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # EOF: the peer's process is gone
            if peer.rank not in liveness.left:
                liveness._mark_lost(peer.rank)
            return
        peer.heard = now
        buffer = peer.buffer
        buffer += data
        while buffer:
            kind = bytes(buffer[:1])
            if kind == _AGREE:
                if len(buffer) < 5:
                    return
                length = struct.unpack_from("<i", buffer, 1)[0]
                if len(buffer) < 5 + length:
                    return
                body = bytes(buffer[5:5 + length])
                del buffer[:5 + length]
                liveness._frame(peer, kind, body)
            else:
                del buffer[:1]
                if kind != _HEARTBEAT:
                    liveness._frame(peer, kind, b"")


_WATCHER = _Watcher()


def _note_uncaught(kind: type, value: BaseException, traceback: Any) -> None:
    global _uncaught
    _uncaught = True
    _previous_hook(kind, value, traceback)


_previous_hook = sys.excepthook
sys.excepthook = _note_uncaught


def exit_after_loss(status: int) -> None:
    """Leave now with `status`, without MPI_Finalize, if this process saw a rank lost (a command's
    own end: the exit handler below cannot see sys.exit's status); return if it saw none."""
    if _any_loss and MPI.Is_initialized() and not MPI.Is_finalized():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


def _at_exit() -> None:
    """After a loss, MPI_Finalize (which mpi4py calls at exit) waits for the lost ranks for ever:
    a process that saw one leaves without it, with status 1 after an uncaught exception, else 0."""
    if _any_loss and MPI.Is_initialized() and not MPI.Is_finalized():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1 if _uncaught else 0)


atexit.register(_at_exit)


# Create_group's tags for shrink: each attempt its own, so that an attempt a loss abandoned
# never matches the next one's messages.
_SHRINK_TAG = 7000


def watch(ring: Any) -> None:
    """Connect to every peer of `ring` (collective) and watch them (Communicator with survival):
    a loss takes every later call off the fast paths, so that each one raises RankLostError."""
    ring.liveness = Liveness(ring.comm)
    ring.liveness.on_failure.append(lambda: setattr(ring, "served", None))


def lost(liveness: Liveness | None) -> list[int]:
    """Communicator.lost: the ranks known lost, sorted (none without survival)."""
    return [] if liveness is None else sorted(liveness.lost)


def is_revoked(liveness: Liveness | None) -> bool:
    """Communicator.is_revoked."""
    return liveness is not None and liveness.revoked


def revoke(liveness: Liveness | None) -> None:
    """Communicator.revoke: refused by name on a communicator without survival."""
    if liveness is None:
        raise ArgumentError("revoke", "survive", "this communicator was made without survival (make it with "
                            "survive=True, or set MPIRING_SURVIVE=1; docs/lost-rank.md)")
    liveness.revoke()


def agree(ring: Any, mpi: MPI.Intracomm, flag: Any) -> int:
    """Communicator.agree: over the watchers' connections, or MPI's allreduce with BAND without survival."""
    value = _flag("agree", flag)
    if ring.liveness is None:
        return int(mpi.allreduce(value, op=MPI.BAND))
    ring.claim("agree")
    return int(ring.liveness.agree(value)[0])


def acknowledge_lost(liveness: Liveness | None) -> int:
    """Communicator.acknowledge_lost: how many ranks are acknowledged lost now."""
    if liveness is None:
        return 0
    liveness.acknowledged = set(liveness.lost)
    return len(liveness.acknowledged)


def shrink(liveness: Liveness, comm: MPI.Intracomm, make: Any, seconds: float = math.inf) -> Any:
    """The survivors' new communicator (Communicator.shrink): agree on who is lost, make an MPI
    communicator of the others (MPI_Comm_create_group, collective over them alone) and `make`
    a Communicator on it. Making it is collective and would never end if a survivor were lost
    meanwhile: it runs in a thread while this one watches, and a loss starts it over without
    the newly lost (the abandoned attempt's thread stays blocked in MPI; the process leaves
    without MPI_Finalize). Where MPI itself does not return within `seconds` (a process killed
    mid-operation can leave MPI's shared memory broken: docs/lost-rank.md), CommunicationError."""
    deadline = time.monotonic() + seconds
    attempt = 0
    while True:
        _, lost = liveness.agree(1)
        survivors = [rank for rank in range(liveness.size) if rank not in lost]
        made: dict[str, Any] = {}

        def build(survivors: list[int] = survivors, tag: int = _SHRINK_TAG + attempt, made: dict = made) -> None:
            try:
                group = comm.Get_group()
                theirs = group.Incl(survivors)
                new = comm.Create_group(theirs, tag)
                theirs.Free()
                group.Free()
                made["communicator"] = make(new)
            except BaseException as error:  # handed to the caller
                made["error"] = error

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:  # no second thread may call MPI: no watching
            build()
        else:
            thread = threading.Thread(target=build, name="mpiring-shrink", daemon=True)
            thread.start()
            while thread.is_alive() and not (liveness.lost - lost):
                if time.monotonic() > deadline:
                    raise CommunicationError("shrink", f"MPI did not make the survivors' communicator within "
                                             f"{seconds:g} s (MPI_Comm_create_group has not returned; a rank "
                                             "killed in the middle of a message can leave MPI's shared memory "
                                             "broken: docs/lost-rank.md)")
                thread.join(0.005)
            if thread.is_alive():  # a survivor was lost while the communicator was made: again without it
                attempt += 1
                continue
        if "error" in made:
            raise made["error"]
        return made["communicator"]


def _flag(what: str, flag: Any) -> int:
    """agree's flag as an int (a bool or an integer; ULFM's is an int)."""
    if isinstance(flag, bool):
        return int(flag)
    if not isinstance(flag, int):
        raise ArgumentError(what, "flag", f"must be an int or a bool, got {flag!r}")
    if not -2**63 <= flag < 2**63:
        raise ArgumentError(what, "flag", f"must fit in 64 bits, got {flag!r}")
    return flag
