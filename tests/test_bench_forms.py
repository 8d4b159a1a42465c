"""The benchmark's drop-in forms of mpi4py programs (mpiring.bench, table.FORMS): `dropin-mmap`,
[buf, count, type] messages over an mmap as mpi4py's OSU demos write them, and `dropin-inplace`,
MPI.IN_PLACE wherever MPI allows it. Every collective, run in-process through the harness at
small sizes, must match native MPI; the calls must be the forms they claim to be; and a check
that cannot see a wrong result would fail here.

MPI tests (world sizes 2 and 3 at least: tests/run_world_sizes.py --sizes 2 3), and a few
serial ones on the table.
"""

from __future__ import annotations

import dataclasses
import mmap

import numpy
import pytest
from mpi4py import MPI

from mpiring.bench import harness
from mpiring.bench.device import open_device
from mpiring.bench.options import COLLECTIVE_NAMES, FORM_NAMES, parse_options
from mpiring.bench.table import COLLECTIVES, DROP_IN_FORMS, FORMS, Setup, native_datatype, native_op

NEW_FORMS = ("dropin-mmap", "dropin-inplace")
WORLD = MPI.COMM_WORLD
# (dtype, op, root: -1 for the last rank, --rotate): data movers and reductions, every root kind
CASES = [("float32", "sum", -1, 1), ("int32", "max", 0, 2), ("float64", "avg", 0, 1)]


# ---- the table, serially ------------------------------------------------------------------


def test_every_form_is_described_and_offered():
    assert tuple(FORMS) == FORM_NAMES
    assert set(NEW_FORMS) <= set(DROP_IN_FORMS) <= set(FORMS)
    assert parse_options(["--form", "all"]).forms == FORM_NAMES


def test_in_place_rows_are_those_mpi_allows():
    """Every collective has MPI.IN_PLACE but Bcast (its buffer is already both) and Barrier."""
    without = {name for name, row in COLLECTIVES.items() if row.native_in_place is None}
    assert without == {"broadcast", "barrier"}


# ---- runs through the harness, under MPI ---------------------------------------------------


@pytest.fixture(scope="module")
def world(comm):
    """(mpiring's Communicator, the ceiling's communicator, the host device)."""
    p2p = WORLD.Dup()
    yield comm, p2p, open_device("cpu", WORLD)
    p2p.Free()


def setup_of(comm, row, options) -> Setup:
    """The Setup mpiring.bench.cli gives a row."""
    return Setup(comm=comm, mpi=WORLD, rank=WORLD.Get_rank(), size=WORLD.Get_size(), root=options.root,
                 op=options.op, algorithm=None, mpi_type=native_datatype(options.dtype, row.reduces),
                 mpi_op=native_op(options.op, options.dtype))


def options_for(form: str, dtype: str = "float32", op: str = "sum", root: int = 0, rotate: int = 1):
    root = root % WORLD.Get_size()
    return parse_options(["--form", form, "-b", "8", "-e", "1K", "-f", "16", "-d", dtype, "-o", op,
                          "--root", str(root), "-n", "2", "--reps", "1", "-w", "1", "--rotate", str(rotate)])


@pytest.mark.mpi
@pytest.mark.parametrize("form", NEW_FORMS)
@pytest.mark.parametrize("dtype, op, root, rotate", CASES)
def test_every_collective_matches_native(world, form, dtype, op, root, rotate):
    """8 B to 1 KiB, every collective: 0 wrong elements on every rank (the harness sums them)."""
    comm, p2p, device = world
    options = options_for(form, dtype, op, root, rotate)
    wrong = {}
    for name in COLLECTIVE_NAMES:
        row = COLLECTIVES[name]
        setup = setup_of(comm, row, options)
        for count, nbytes in harness.sweep(row, options, setup.size):
            for result in harness.measure(row, setup, device, p2p, count, nbytes, options, "auto"):
                assert result.form == form and result.time_us > 0 and result.native_time_us > 0
                wrong[(name, nbytes)] = result.wrong
    assert len({name for name, _ in wrong}) == len(COLLECTIVE_NAMES)
    assert set(wrong.values()) == {0}, {key: n for key, n in wrong.items() if n}


class Recorder:
    """A communicator whose uppercase calls are recorded (method, arguments) and then run."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        method = getattr(self.inner, name)
        if not name[:1].isupper():
            return method

        def call(*args):
            self.calls.append((name, args))
            return method(*args)

        return call


def counted(made: list, make):
    """`make`, noting each call in `made`."""
    return lambda *args: made.append(make) or make(*args)


def specs(args):
    """The message specs among a call's arguments (lists)."""
    return [a for a in args if isinstance(a, list)]


@pytest.mark.mpi
@pytest.mark.parametrize("name", COLLECTIVE_NAMES)
def test_the_forms_make_the_calls_they_claim(world, name, monkeypatch):
    """dropin-mmap: every message is [mmap, count, type] with MPI's count (one rank's block), on
    both sides; dropin-inplace: MPI.IN_PLACE where MPI allows it, on both sides. The timed calls
    make no new buffers after the first call of each buffer set."""
    comm, _, device = world
    row = COLLECTIVES[name]
    rank, n, count = WORLD.Get_rank(), WORLD.Get_size(), 3
    for form in NEW_FORMS:
        options = options_for(form, root=-1, rotate=2)
        setup = setup_of(comm, row, options)
        unit = options.dtype.itemsize if setup.mpi_type == MPI.BYTE else 1
        sets = [harness.make_buffers(row, setup, device, count, options.dtype) for _ in range(2)]
        mine, theirs, _ = harness.form_calls(row, device, form)
        methods = []
        for side, bind in (("mpiring", mine), ("native", theirs)):
            recorder = Recorder(comm if side == "mpiring" else WORLD)
            spied = dataclasses.replace(setup, comm=recorder, mpi=recorder)
            made = []
            with monkeypatch.context() as patch:
                patch.setattr(harness.mmap, "mmap", counted(made, mmap.mmap))
                patch.setattr(type(device), "empty", counted(made, type(device).empty))
                calls = [bind(spied, b) for b in sets]
                for call in calls:
                    call()
                first = len(made)
                for _ in range(3):
                    for call in calls:
                        call()
            assert len(made) == first, (side, form, made)  # made once per buffer set, not per call
            assert len(recorder.calls) == 8, recorder.calls
            methods.append({method for method, _ in recorder.calls})
            method, args = recorder.calls[0]
            if name == "barrier":
                assert method == "Barrier"
            elif form == "dropin-mmap":
                assert specs(args)
                for spec in specs(args):
                    assert isinstance(spec[0], mmap.mmap) and len(spec) == 3, spec
                    if name == "alltoallv":
                        assert spec[1] == ([count * unit] * n, [k * count * unit for k in range(n)])
                    else:
                        assert spec[1] == count * unit  # one rank's block, in elements of the type
            elif row.native_in_place is None:  # broadcast: the dropin call
                assert method == "Bcast" and MPI.IN_PLACE not in args
            else:
                rooted = name in ("reduce", "gather", "scatter")
                assert (MPI.IN_PLACE in args) == (rank == setup.root or not rooted), (name, rank, args)
        assert methods[0] == methods[1]  # both sides make the same call


# ---- the check sees what is wrong ------------------------------------------------------------


def wrong_after_drift(world, row, form: str, rounds: int = 3) -> int:
    """The form's timed calls run `rounds` times (in place, the inputs drift), then the harness's
    check; wrong elements summed over ranks."""
    comm, _, device = world
    options = options_for(form, root=-1)
    setup = setup_of(comm, row, options)
    buffers = harness.make_buffers(row, setup, device, 5, options.dtype)
    mine, _, result_of = harness.form_calls(row, device, form)
    call = mine(setup, buffers)
    for _ in range(rounds):
        call()
    return WORLD.allreduce(harness.count_wrong(row, setup, buffers, device, result_of))


# one rank: broadcast's and exscan's results are the input, or undefined
CHECKED_ALONE = {"broadcast", "exscan"}


@pytest.mark.mpi
@pytest.mark.parametrize("name", [n for n in COLLECTIVE_NAMES if COLLECTIVES[n].native_in_place is not None])
def test_in_place_check_stages_the_input_again(world, name):
    """After timed in-place calls have overwritten their inputs (an all-reduce's sums grow), the
    check puts them back first: 0 wrong. Staged zeros instead of the input are caught."""
    row = COLLECTIVES[name]
    assert wrong_after_drift(world, row, "dropin-inplace") == 0
    stage = row.native_in_place.stage
    zeros = dataclasses.replace(row.native_in_place, stage=lambda s, x, buf: stage(
        s, None if x is None else numpy.zeros_like(x), buf))
    if WORLD.Get_size() > 1 or name not in CHECKED_ALONE:
        assert wrong_after_drift(world, dataclasses.replace(row, native_in_place=zeros), "dropin-inplace") > 0


@pytest.mark.mpi
@pytest.mark.parametrize("name", [n for n in COLLECTIVE_NAMES if n != "barrier"])
def test_mmap_check_sees_a_short_message(world, name):
    """A message one element short leaves part of the result unwritten: the check counts it."""
    row = COLLECTIVES[name]
    assert wrong_after_drift(world, row, "dropin-mmap") == 0

    def short(s, buf, itemsize, counts):
        return row.message(s, buf, itemsize, tuple(c - 1 for c in counts))

    if WORLD.Get_size() > 1 or name not in CHECKED_ALONE:
        assert wrong_after_drift(world, dataclasses.replace(row, message=short), "dropin-mmap") > 0
