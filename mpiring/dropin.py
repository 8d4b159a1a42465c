"""A whole mpi4py communicator whose buffer collectives run on mpiring: code written for mpi4py
runs with one changed line, or none.

    from mpiring.dropin import COMM_WORLD as comm   # the one changed line (was: MPI.COMM_WORLD)
    comm.Allreduce(sendbuf, recvbuf)                 # mpiring's rings
    comm.Send(buf, dest=1); comm.bcast(obj)          # mpi4py's own: point-to-point, pickled objects
    sub = comm.Split(color, key)                     # a drop-in communicator too

    mpirun -n 4 python -m mpiring.dropin program.py  # no line changed: MPI.COMM_WORLD is the drop-in

`Intracomm` is a subclass of mpi4py's `MPI.Intracomm` over the same MPI communicator, so every
isinstance check, comparison and method of mpi4py holds: point-to-point, the pickle-based
lowercase API, `Split`/`Dup`/`Create`, groups, attributes, `Get_*`. Only the uppercase
collectives (`Bcast`, `Allreduce`, ... and their `I`/`_init` forms; mpiring.buffer_api.DROPIN)
are mpiring's, run by an `mpiring.Communicator` made over it at its first such call (every rank
makes that call, so the making is collective as MPI requires). Communicators made from it
(`Dup`, `Split`, `Create`, ...) are drop-ins too. docs/dropin.md has the details.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from typing import Any

from mpi4py import MPI

from mpiring import entry_points
from mpiring.buffer_api import DROPIN, BufferAPI, uppercase
from mpiring.communicator import Communicator


class Intracomm(MPI.Intracomm):
    """mpi4py's intracommunicator, with its buffer collectives served by mpiring.

    `Intracomm(MPI.COMM_WORLD)` is the same MPI communicator (not a copy): messages of mpi4py's
    methods on it match the original's. mpiring's own messages travel on a private duplicate.
    """

    def served(self) -> Communicator:
        """The mpiring Communicator that runs this communicator's buffer collectives (made at the
        first one: collective)."""
        return self._mpiring

    def __getattr__(self, name: str) -> Any:
        """`_mpiring`, made at its first use (`served`); the forwarded methods read the attribute
        itself, which costs less than a call."""
        if name != "_mpiring":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        comm = self.__dict__["_mpiring"] = Communicator(MPI.Intracomm(self))
        return comm

    def Ibarrier(self) -> Any:  # noqa: N802 - mpi4py's names
        """Nonblocking Barrier."""
        return self.served().Ibarrier()

    def Barrier_init(self, info: Any = MPI.INFO_NULL) -> Any:  # noqa: N802
        """Persistent Barrier."""
        return self.served().Barrier_init(info)

    def __reduce__(self) -> Any:
        """Pickled, mpiring.dropin's COMM_WORLD and COMM_SELF come back as themselves, as
        mpi4py's predefined communicators do; any other communicator cannot be pickled."""
        for name in ("COMM_WORLD", "COMM_SELF"):
            if self is globals().get(name):
                return _predefined, (name,)
        return super().__reduce__()

    # ---- communicators made from this one are drop-ins too ----

    def Dup(self, info: Any = None) -> Intracomm:  # noqa: N802
        return _dropin(super().Dup(info))

    def Dup_with_info(self, info: Any) -> Intracomm:  # noqa: N802
        return _dropin(super().Dup_with_info(info))

    def Clone(self) -> Intracomm:  # noqa: N802
        return _dropin(super().Clone())

    def Split(self, color: int = 0, key: int = 0) -> Intracomm:  # noqa: N802
        return _dropin(super().Split(color, key))

    def Split_type(self, split_type: int, key: int = 0, info: Any = MPI.INFO_NULL) -> Intracomm:  # noqa: N802
        return _dropin(super().Split_type(split_type, key, info))

    def Create(self, group: MPI.Group) -> Intracomm:  # noqa: N802
        return _dropin(super().Create(group))

    def Create_group(self, group: MPI.Group, tag: int = 0) -> Intracomm:  # noqa: N802
        return _dropin(super().Create_group(group, tag))

    def Free(self) -> None:  # noqa: N802
        """Free mpiring's communicator (if one was made), then this one (collective)."""
        comm = self.__dict__.pop("_mpiring", None)
        if comm is not None:
            comm.free()
        super().Free()


def _predefined(name: str) -> Intracomm:
    """mpiring.dropin.COMM_WORLD or COMM_SELF, by name (unpickling)."""
    return globals()[name]


def _dropin(comm: MPI.Intracomm) -> Any:
    """`comm` as a drop-in (MPI.COMM_NULL, for ranks outside a Split's color or a Create's
    group, stays what it is)."""
    if comm == MPI.COMM_NULL or isinstance(comm, Intracomm):
        return comm
    return Intracomm(comm)


# `Intracomm.<name>`: the same method of the mpiring Communicator that serves it (a blocking one
# with that method's reading of the common forms in C inline: one Python call fewer per call)
for _row in DROPIN:
    _name = _row[0]
    setattr(Intracomm, _name, uppercase(Intracomm, getattr(BufferAPI, _name), served="_mpiring"))
    for _form in ("I" + _name[0].lower() + _name[1:], f"{_name}_init"):
        setattr(Intracomm, _form, entry_points.forward(Intracomm, getattr(Communicator, _form), "_mpiring", __name__))
del _row, _name, _form
Intracomm.Barrier = uppercase(Intracomm, BufferAPI.Barrier, served="_mpiring")  # type: ignore[method-assign]

COMM_WORLD = Intracomm(MPI.COMM_WORLD)
COMM_SELF = Intracomm(MPI.COMM_SELF)


def main(argv: list[str] | None = None) -> None:
    """`python -m mpiring.dropin program.py [arguments]`: run a program written for mpi4py with
    `MPI.COMM_WORLD` and `MPI.COMM_SELF` as drop-ins."""
    parser = argparse.ArgumentParser(prog="python -m mpiring.dropin", description=main.__doc__)
    parser.add_argument("program", help="the Python program to run, as `python program.py` would")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    MPI.COMM_WORLD, MPI.COMM_SELF = COMM_WORLD, COMM_SELF
    sys.argv = [args.program, *args.arguments]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.program)))  # as `python program.py` does
    runpy.run_path(args.program, run_name="__main__")


if __name__ == "__main__":  # run as `python -m mpiring.dropin`: use the importable module's classes, not copies
    from mpiring.dropin import main as run

    run()
