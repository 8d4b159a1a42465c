"""Ranks lost on purpose, for tests/test_lost_rank.py (and scripts/measure_lost_rank.py), run as

    mpiexec -disable-auto-cleanup -n K python tests/lost_rank_scenarios.py '<stages as JSON>' DIR

Each stage loses one rank (its world number: "victim") while every rank runs one collective
("op") again and again on the current communicator, checking each result that comes back
against NumPy on inputs regenerated from the world ranks. How the victim goes ("how"):

    exit      it calls os._exit from a timer thread "delay" s into the loop (inside a call, mostly)
    sigkill   the first survivor kills it with SIGKILL "delay" s into the loop (from outside)
    between   it leaves between two calls, after "calls" of them
    wait      it starts the nonblocking form of the op and leaves before waiting for it
    shrink    it leaves between calls, and "victim2" leaves at "point" of the survivors' agree and
              shrink (leave_in_shrink)
    revoke    nobody is lost: the rank "victim" revokes the communicator "delay" s into the loop

Every survivor then expects RankLostError naming the lost rank (CommunicatorRevokedError for
revoke), shrinks, checks the new communicator's members and an allreduce on it, and agrees.
At the end each survivor prints one line, "RESULT <json>", with what it saw and when (time.time()
values, so that detection and recovery times can be measured across processes); each lost rank
writes the time it went into DIR.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time

import numpy as np

import mpiring
from mpiring import survival
from mpiring.errors import CommunicatorRevokedError, RankLostError

GUARD_SECONDS = 30.0  # a survivor that sees no error this long says so (the test fails, nothing hangs)


def inputs(world: int, op: str, size: int, n: int) -> np.ndarray:
    """What world rank `world` contributes (integer-valued floats: sums are exact in any order)."""
    base = np.arange(size, dtype=np.float64) % 97 + world * 1000
    if op in ("allgather", "gather", "iallgather"):
        return base.reshape(1, size)
    if op in ("reduce_scatter", "alltoall", "ialltoall"):
        return np.tile(base, n).reshape(n, size) + np.arange(n).reshape(n, 1) * 7
    return base


def expected(op: str, members: list[int], me: int, size: int) -> np.ndarray | None:
    """The op's result on this rank, from NumPy alone."""
    n = len(members)
    xs = [inputs(w, op, size, n) for w in members]
    rank = members.index(me)
    if op in ("allreduce", "iallreduce", "allreduce_init"):
        return np.sum(xs, axis=0)
    if op in ("broadcast", "ibroadcast"):
        return xs[n - 1]  # the root is the last rank: the others wait for it
    if op == "reduce":
        return np.sum(xs, axis=0) if rank == 0 else None
    if op in ("allgather", "iallgather"):
        return np.concatenate(xs)
    if op == "gather":
        return np.concatenate(xs) if rank == 0 else None
    if op == "reduce_scatter":
        return np.sum(xs, axis=0)[rank]
    if op in ("alltoall", "ialltoall"):
        return np.stack([x[rank] for x in xs])
    if op == "scan":
        return np.sum(xs[: rank + 1], axis=0)
    if op == "barrier":
        return None
    raise ValueError(op)


def start(comm: mpiring.Communicator, op: str, x: np.ndarray) -> object:
    """The op's nonblocking form, started."""
    if op == "iallreduce":
        return comm.iallreduce(x)
    if op == "ibroadcast":
        return comm.ibroadcast(x, root=comm.size - 1)
    if op == "iallgather":
        return comm.iallgather(x)
    return comm.ialltoall(x)


def call(comm: mpiring.Communicator, op: str, x: np.ndarray, persistent: dict) -> np.ndarray | None:
    """Run the op once, blocking (a nonblocking op: started and waited for; persistent: one run)."""
    if op == "allreduce_init":
        request = persistent.get(id(comm))
        if request is None:
            request = persistent[id(comm)] = comm.allreduce_init(x)
        request.start()
        return request.wait()
    if op.startswith("i"):
        return start(comm, op, x).wait()
    if op == "broadcast":
        return comm.broadcast(x, root=comm.size - 1)
    if op == "barrier":
        comm.barrier()
        return None
    return getattr(comm, op)(x)


def leave(directory: str, stage: int) -> None:
    with open(os.path.join(directory, f"lost-{stage}"), "w") as file:
        file.write(repr(time.time()))
    os._exit(7)


def leave_in_shrink(point: str, directory: str, name: str) -> None:
    """Leave at `point` of the survivors' recovery: entering agree() ("agree"), entering shrink's
    own agreement ("shrink"), after it, as the survivors make their MPI communicator ("create"),
    or while they make the new Communicator on it ("make")."""
    if point == "agree":
        leave(directory, name)
    agree = survival.Liveness.agree
    calls = []

    def agree_then_leave(self, value):
        calls.append(value)
        if point == "shrink" and len(calls) == 2:
            leave(directory, name)
        result = agree(self, value)
        if point == "create" and len(calls) == 2:
            leave(directory, name)
        return result

    survival.Liveness.agree = agree_then_leave
    if point == "make":
        def made_then_leave(self, comm, silence=None):
            leave(directory, name)
        survival.Liveness.__init__ = made_then_leave


def main() -> None:
    stages, directory = json.loads(sys.argv[1]), sys.argv[2]
    faulthandler.dump_traceback_later(float(os.environ.get("LOST_RANK_DUMP_SECONDS", "40")))  # where a hang is
    comm = mpiring.Communicator(survive=True)
    me = comm.rank  # world rank
    pids = comm.mpi.allgather(os.getpid())
    members = list(range(comm.size))
    persistent: dict = {}
    seen = []
    for number, stage in enumerate(stages):
        op, how, victim = stage["op"], stage["how"], stage["victim"]
        size, delay = stage.get("size", 8), stage.get("delay", 0.05)
        x = inputs(me, op, size, len(members))
        want = expected(op, members, me, size)
        if me == victim and how == "exit":
            threading.Timer(delay, leave, (directory, number)).start()
        if how == "sigkill" and me == min(w for w in members if w != victim):
            def kill(victim: int = victim, number: int = number) -> None:
                with open(os.path.join(directory, f"lost-{number}"), "w") as file:
                    file.write(repr(time.time()))
                os.kill(pids[victim], signal.SIGKILL)
            threading.Timer(delay, kill).start()
        if how == "revoke" and me == victim:
            threading.Timer(delay, comm.revoke).start()
        record: dict = {"stage": number, "wrong": 0, "calls": 0}
        began = time.monotonic()
        try:
            while time.monotonic() - began < GUARD_SECONDS:
                if how == "wait" and me == victim and record["calls"] >= stage.get("calls", 3):
                    start(comm, op, x)
                    leave(directory, number)
                got = call(comm, op, x, persistent)
                record["calls"] += 1
                if want is not None and not np.array_equal(np.ravel(got), np.ravel(want)):  # (values, in order)
                    record["wrong"] += 1  # data came back, and it is not the result
                if how in ("between", "shrink") and me == victim and record["calls"] >= stage.get("calls", 3):
                    leave(directory, number)
            record["error"] = None
        except (RankLostError, CommunicatorRevokedError) as error:
            record["t_error"] = time.time()
            record["error"] = type(error).__name__
            record["lost"] = getattr(error, "lost", [])
        if how == "shrink" and me == stage["victim2"]:
            leave_in_shrink(stage["point"], directory, f"{number}b")
        agreed_before = comm.agree(1 if me % 2 else 3)
        new = comm.shrink()
        record["t_shrunk"] = time.time()
        record["agreed_before"] = agreed_before
        record["members"] = new.mpi.allgather(me)
        total = new.allreduce(np.full(4, float(me)))
        record["t_first"] = time.time()
        record["sum_ok"] = bool(np.array_equal(total, np.full(4, float(sum(record["members"])))))
        record["agreed_after"] = new.agree(1 if me % 2 else 3)
        record["failed_group"] = comm.Get_failed().Get_size()
        comm.free()
        comm, members = new, record["members"]
        seen.append(record)
    print("RESULT " + json.dumps({"world": me, "stages": seen}), flush=True)


if __name__ == "__main__":
    main()
