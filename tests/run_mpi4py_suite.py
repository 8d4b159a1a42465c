#!/usr/bin/env python3
"""mpi4py's own tests, unchanged, on mpiring's drop-ins at world sizes 1, 2, 3, 4 and 5: the
buffer collectives' modules on mpiring.Communicator's uppercase API, and the modules of the rest
of the Comm API (communicators, point-to-point, pickled objects) on mpiring.dropin.Intracomm.

    python tests/run_mpi4py_suite.py                       # or: python tests/run_world_sizes.py --mpi4py-suite
    python tests/run_mpi4py_suite.py --sizes 2 3 --modules test_cco_vec

The tests come from mpi4py's source distribution of the installed mpi4py version (`pip download
--no-binary :all: --no-deps mpi4py==<version>`), kept in a cache directory (--cache, else
$MPIRING_MPI4PY_CACHE, else ~/.cache/mpiring) so later runs need no network. Nothing of them is
copied into this repository.

How they run on mpiring: each module is imported as it is, then its communicators are swapped:
every test class's `COMM` (MPI.COMM_SELF or MPI.COMM_WORLD) becomes an mpiring.Communicator over
it, and the module's `MPI` name becomes mpi4py's MPI module with those two in place of COMM_SELF
and COMM_WORLD, so the classes that make their communicator in setUp (`MPI.COMM_WORLD.Dup()`)
get mpiring's Dup(). Test classes without a communicator (TestReduceLocal: MPI.Op.Reduce_local)
test mpi4py alone and are not run.

mpi4py's tests loop over array kinds (array.array, NumPy, DLPack, fake-GPU) and type codes
inside each test; here each test runs once per (array kind, type code), so a refused type skips
that case only, and the counts are test x case. To keep CI short, a test runs every type code
of NumPy arrays and one of each other kind, turning with the test and the world size so that
over the world sizes each kind meets most of its codes (--all-cases: all of them everywhere).

A case passes only if it passes on every rank. It is skipped if mpi4py's test skips it, or if it
raises a refusal by name on every rank: NotImplementedError, or an mpiring ArgumentError for a
feature docs/dropin.md lists as not supported (REFUSALS below). Any other exception, a refusal
on some ranks only, and any assertion that fails is a failure. The exit status is 1 when
anything failed.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
import unittest
from collections import Counter
from typing import Any

MODULES = ["test_cco_buf", "test_cco_nb_buf", "test_cco_vec", "test_cco_nb_vec", "test_cco_pr_buf", "test_cco_pr_vec",
           "test_comm", "test_p2p_buf", "test_p2p_obj", "test_cco_obj", "osu_demos"]
# The modules of the rest of the Comm API (communicators, point-to-point, pickled objects): they
# run on mpiring.dropin.Intracomm, the whole mpi4py communicator whose buffer collectives are
# mpiring's; the others on mpiring.Communicator's uppercase methods.
WHOLE_COMM = {"test_comm", "test_p2p_buf", "test_p2p_obj", "test_cco_obj"}
# mpi4py's OSU collective benchmarks (demo/), run unchanged on mpiring.dropin at small sizes: each
# must run through (no refusal, no error on any rank) with its collectives served by mpiring.
OSU_DEMOS = ["osu_bcast", "osu_gather", "osu_scatter", "osu_allgather", "osu_alltoall", "osu_alltoallv",
             "osu_barrier"]
OSU_SMALL = {"skip": 1, "loop": 3, "skip_large": 1, "loop_large": 2, "MAX_MSG_SIZE": 4096}
SIZES = [1, 2, 3, 4, 5]
RESULT_MARK = "[mpi4py-suite result]"
# A collective of these tests that waits this long has lost a rank (one that left a test early):
# it fails, and the next case starts on fresh communicators.
CALL_TIMEOUT = 30.0
# Failed cases after which a world size stops (the rest reported as not run): each can cost a
# CALL_TIMEOUT, and a broken feature fails hundreds.
MAX_FAILURES = 10
GC_EVERY = 500  # cases between garbage collections (see work())
FAILURES_SHOWN = 10  # tracebacks printed per world size; every failure is counted by its message

# The features docs/dropin.md lists as not supported, as mpiring's ArgumentError words them: only
# these count as refusals. Any other ArgumentError means the drop-in rejected a valid call.
REFUSALS = {
    "device buffers": r"device (arrays|buffers) are not supported by the uppercase API",
    "DLPack buffers without a datatype": r"DLPack buffers without a datatype are not supported",
    "MPI.BOTTOM": r"MPI\.BOTTOM is not supported",
    "long double reductions": r"^reductions of .* are not supported \(mpiring's reductions have no long double",
    "derived datatypes that are not one strided view": r"is not supported( here)? \(a derived datatype",
    "pair types": r"is not supported \(pair types are for MAXLOC and MINLOC",
    "MAXLOC, MINLOC, REPLACE and user-defined ops": r"(MAXLOC|MINLOC|REPLACE|NO_OP|user-defined MPI\.Op) is not "
                                                     r"supported",
}


# ---- the driver: fetch mpi4py's tests, run them under mpiexec at each world size ----

def cache_dir(given: str | None) -> str:
    return given or os.environ.get("MPIRING_MPI4PY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mpiring")


def mpi4py_tests(cache: str) -> str:
    """The test/ folder of the installed mpi4py version's source distribution: from the cache,
    else downloaded there (the sdist is kept, so the next run works offline)."""
    release = _mpi4py_release()
    folder = os.path.join(cache, f"mpi4py-{release}", "test")
    demos = os.path.join(cache, f"mpi4py-{release}", "demo")
    if os.path.isfile(os.path.join(folder, "mpiunittest.py")) and os.path.isdir(demos):
        return folder
    os.makedirs(cache, exist_ok=True)
    archive = os.path.join(cache, f"mpi4py-{release}.tar.gz")
    if not os.path.isfile(archive):
        print(f"[mpi4py-suite] downloading mpi4py {release}'s source distribution into {cache}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                        "-d", cache, f"mpi4py=={release}"], check=True)
    prefix = f"mpi4py-{release}/test/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith((prefix, f"mpi4py-{release}/demo/osu_"))
                   and (m.isfile() or m.isdir())]
        if not members:
            sys.exit(f"{archive} has no {prefix} folder")
        staging = os.path.join(cache, f".mpi4py-{release}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        if hasattr(tarfile, "data_filter"):  # refuses links and paths outside the folder
            tar.extractall(staging, members=members, filter="data")
        else:
            tar.extractall(staging, members=[m for m in members if ".." not in m.name.split("/")])
    shutil.rmtree(os.path.join(cache, f"mpi4py-{release}"), ignore_errors=True)
    os.replace(os.path.join(staging, f"mpi4py-{release}"), os.path.join(cache, f"mpi4py-{release}"))
    shutil.rmtree(staging, ignore_errors=True)
    return folder


def _mpi4py_release() -> str:
    from importlib.metadata import version

    return version("mpi4py")


def drive(sizes: list[int], modules: list[str], cache: str | None, run_timeout: int, every: bool) -> int:
    """Run the suite at every world size; print the table and the skip reasons. 0: no failures."""
    from run_world_sizes import mpi_environment, run

    started = time.monotonic()
    folder = mpi4py_tests(cache_dir(cache))
    mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
    if mpiexec is None:
        print("no mpiexec on PATH: install an MPI (pip install mpich) first", file=sys.stderr)
        return 2
    env = dict(mpi_environment(), MPIEXEC_TIMEOUT=str(run_timeout))
    results: dict[int, dict[str, Any] | None] = {}
    for size in sizes:
        command = [mpiexec, "-n", str(size), sys.executable, "-m", "mpi4py", os.path.abspath(__file__),
                   "--worker", folder, "--modules", *modules, *(["--all-cases"] if every else [])]
        code, output = run(command, env, run_timeout + 30)
        found = [line[len(RESULT_MARK):] for line in output.splitlines() if line.startswith(RESULT_MARK)]
        results[size] = json.loads(found[-1]) if code == 0 and found else None
    return summarize(results, modules, time.monotonic() - started)


def summarize(results: dict[int, dict[str, Any] | None], modules: list[str], seconds: float) -> int:
    print(f"\nmpi4py {_mpi4py_release()}'s test suite on mpiring's drop-ins "
          "(cases: test x array kind x type code)")
    print("| module | " + " | ".join(f"{n} rank{'s' * (n > 1)}" for n in results) + " |")
    print("| --- |" + " --- |" * len(results))
    failed = 0
    reasons: Counter[str] = Counter()
    for module in modules:
        cells = []
        for report in results.values():
            if report is None or module not in report["modules"]:
                cells.append("did not finish" if report is None else report.get("stopped", "did not run"))
                failed += 1
                continue
            counts = report["modules"][module]
            failed += counts["failed"]
            cells.append(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
        print(f"| {module} | " + " | ".join(cells) + " |")
    for report in results.values():
        if report is not None:
            reasons.update(report["reasons"])
    print("\nskip reasons (cases, over every world size):")
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        print(f"  {count:6d}  {reason}")
    failures: Counter[str] = Counter()
    for report in results.values():
        if report is not None:
            failures.update(report["failures"])
    if failures:
        print("\nfailures (cases, over every world size, by their last line):")
        for line, count in sorted(failures.items(), key=lambda item: -item[1]):
            print(f"  {count:6d}  {line}")
    print(f"\n[mpi4py-suite] {'FAILED' if failed else 'ok'}: {failed} failed, {seconds:.0f} s")
    return 1 if failed else 0


# ---- the worker: one world size, under mpiexec ----

class _MPIWithMpiring:
    """mpi4py's MPI module, with COMM_SELF and COMM_WORLD as mpiring communicators over them."""

    def __init__(self, mpi: Any) -> None:
        self._mpi = mpi
        self.renew()

    def renew(self) -> None:
        """Fresh communicators (collective). The old ones are dropped, not freed: after a failure
        some ranks may hold a broken one, and freeing would be a collective call they disagree on."""
        import mpiring

        self.COMM_WORLD = mpiring.Communicator(self._mpi.COMM_WORLD, timeout=CALL_TIMEOUT)
        self.COMM_SELF = mpiring.Communicator(self._mpi.COMM_SELF, timeout=CALL_TIMEOUT)

    def free(self) -> None:
        self.COMM_WORLD.free()
        self.COMM_SELF.free()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mpi, name)


class _MPIWithDropin(_MPIWithMpiring):
    """mpi4py's MPI module, with COMM_SELF and COMM_WORLD as mpiring.dropin communicators: the
    same MPI communicators, their buffer collectives on mpiring."""

    def renew(self) -> None:
        """mpiring.dropin's own (pickled, they come back as themselves); mpiring's communicators
        serving them are dropped, as in the base class, and made anew at their next call."""
        from mpiring import dropin

        self.COMM_WORLD, self.COMM_SELF = dropin.COMM_WORLD, dropin.COMM_SELF
        for comm in (self.COMM_WORLD, self.COMM_SELF):
            comm.__dict__.pop("_mpiring", None)

    def free(self) -> None:  # mpiring's communicators only: MPI's world and self stay
        for comm in (self.COMM_WORLD, self.COMM_SELF):
            served = comm.__dict__.pop("_mpiring", None)
            if served is not None:
                served.free()


class _Outcome(unittest.TestResult):
    """One case's outcome on this rank: passed, failed or skipped, and why."""

    def __init__(self) -> None:
        super().__init__()
        self.outcome, self.why = "passed", ""

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802 - unittest's name
        self.outcome, self.why = "skipped", f"mpi4py's test skips it: {reason}"

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self.outcome, self.why = "failed", "".join(traceback.format_exception(*err))

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        refusal = _refusal(err[1])
        if refusal is None:
            self.outcome, self.why = "failed", "".join(traceback.format_exception(*err))
        else:
            self.outcome, self.why = "skipped", refusal

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        if err is None:
            return
        if issubclass(err[0], test.failureException):
            self.addFailure(test, err)
        else:
            self.addError(test, err)


def _refusal(error: BaseException) -> str | None:
    """The skip reason when `error` is a refusal by name, else None."""
    from mpiring.errors import ArgumentError

    if isinstance(error, NotImplementedError):
        return f"NotImplementedError: {error}"
    if isinstance(error, ArgumentError):
        for feature, pattern in REFUSALS.items():
            if re.search(pattern, error.problem):
                return f"not supported ({feature}): {error.problem}"
    return None


def _cases(kinds: list[Any], test_index: int, world_size: int, every: bool) -> list[tuple[Any, str]]:
    """The (array kind, type code) cases one test runs: every type code of NumPy arrays, and of
    each other kind (array.array, DLPack, fake GPU) one, which turns with the test and the world
    size; with `every`, all of them."""
    cases = []
    for kind in kinds:
        codes = list(kind.TypeMap)
        if every or kind.__name__ == "ArrayNumPy":
            cases += [(kind, code) for code in codes]
        elif codes:
            cases.append((kind, codes[(test_index + world_size) % len(codes)]))
    return cases


def work(folder: str, modules: list[str], every: bool) -> int:
    """Run the modules on this rank; rank 0 prints the counts as one JSON line."""
    import numpy
    from mpi4py import MPI

    import mpiring

    native = MPI.COMM_WORLD
    sys.path.insert(0, folder)
    import arrayimpl  # mpi4py's test helpers, from its test folder

    wrappers = {False: _MPIWithMpiring(MPI), True: _MPIWithDropin(MPI)}  # by: a module of WHOLE_COMM
    # Ranks agree on each case on a communicator of their own: mpiring's waits give up the core
    # where ranks outnumber cores (CI runs 5 ranks on 2), MPI's own spin.
    judge = mpiring.Communicator(MPI.COMM_WORLD)
    failed_here = numpy.zeros(1, numpy.int8)
    current: list[Any] = [None]
    looped = [False]

    def loop(*args: Any) -> Any:
        """arrayimpl.loop narrowed to the current (array kind, type code)."""
        looped[0] = True
        loop.array, loop.typecode = current[0]
        for extra in itertools.product(*args):
            yield (*current[0], *extra)

    arrayimpl.loop = loop  # arrayimpl.scalar and arrayimpl.test read loop.array and loop.typecode too
    # mpi4py's DLPack test helper asserts an exact reference count while it exports, which a garbage
    # collection in the middle (freeing an earlier case's views) breaks: collect between cases only.
    gc.disable()
    report: dict[str, Any] = {"modules": {}, "reasons": Counter(), "failures": Counter()}
    shown = ran = failed = 0
    for name in [m for m in modules if m != "osu_demos"]:
        module = importlib.import_module(name)
        wrapped = wrappers[name in WHOLE_COMM]
        module.MPI = wrapped  # setUp's MPI.COMM_WORLD.Dup() is mpiring's Dup()
        counts = Counter(passed=0, failed=0, skipped=0)
        for cls, over_world in _test_classes(module, MPI, name in WHOLE_COMM):
            for test_index, method in enumerate(unittest.TestLoader().getTestCaseNames(cls)):
                cases = _cases(arrayimpl.ArrayBackends, test_index, native.Get_size(), every)
                looped[0] = False
                mine = []  # (label, outcome, why) of each case on this rank
                for index, case in enumerate(cases):
                    if index and not looped[0]:
                        break  # a test without arrayimpl.loop is one case
                    if failed >= MAX_FAILURES:
                        break
                    current[0] = case
                    if over_world is not None:
                        cls.COMM = wrapped.COMM_WORLD if over_world else wrapped.COMM_SELF
                    outcome = _Outcome()
                    _instance(cls, method, name in WHOLE_COMM).run(outcome)
                    mine.append((f"{name}.{cls.__name__}.{method}" + (
                        f" [{case[0].__name__} {case[1]!r}]" if looped[0] else ""), outcome.outcome, outcome.why))
                    failed_here[0] = outcome.outcome == "failed"
                    if judge.allreduce(failed_here, op="max")[0]:
                        # A rank may have left the test early while others waited, or timed out and
                        # broken its communicator: the next case starts on fresh ones everywhere.
                        failed += 1
                        wrapped.renew()
                    ran += 1
                    if ran % GC_EVERY == 0:
                        gc.collect()
                for label, verdict, why in _agree(native, mine):  # the reasons: one exchange per test
                    counts[verdict] += 1
                    if verdict == "skipped":
                        report["reasons"][why] += 1
                    elif verdict == "failed":
                        report["failures"][_last_line(why)] += 1
                    if verdict == "failed" and native.Get_rank() == 0 and shown < FAILURES_SHOWN:
                        shown += 1
                        print(f"FAILED {label} at world size {native.Get_size()}:\n{why}", flush=True)
        report["modules"][name] = dict(counts)
        if failed >= MAX_FAILURES:
            report["stopped"] = f"stopped in {name} after {failed} failed cases"
            break
    if failed < MAX_FAILURES and "osu_demos" in modules:
        report["modules"]["osu_demos"] = _osu_demos(folder, wrappers[True], judge, report)
    for wrapped in wrappers.values():
        wrapped.free()
    judge.free()
    if native.Get_rank() == 0:
        print(RESULT_MARK + json.dumps(report), flush=True)
    return 0


def _osu_demos(folder: str, wrapped: Any, judge: Any, report: dict[str, Any]) -> dict[str, int]:
    """mpi4py's OSU collective benchmarks, unchanged, at small sizes (OSU_SMALL) on
    mpiring.dropin's COMM_WORLD: each passes if it runs through on every rank with mpiring
    serving its collectives (at one rank they refuse to run, by design, and are skipped)."""
    import contextlib
    import io

    import numpy

    sys.path.insert(0, os.path.join(os.path.dirname(folder), "demo"))
    counts = Counter(passed=0, failed=0, skipped=0)
    for name in OSU_DEMOS:
        if wrapped.COMM_WORLD.Get_size() < 2:
            counts["skipped"] += 1
            report["reasons"]["an OSU demo needs at least two ranks"] += 1
            continue
        module = importlib.import_module(name)
        module.MPI = wrapped
        why, before = "", wrapped.COMM_WORLD.served().traffic.messages
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                getattr(module, name)(**OSU_SMALL)
            if wrapped.COMM_WORLD.served().traffic.messages == before:
                why = "mpiring moved no message: the demo ran on MPI's own collectives"
        except BaseException as error:  # noqa: BLE001 - every outcome is a verdict
            why = f"{type(error).__name__}: {error}"
        if judge.allreduce(numpy.array([bool(why)], numpy.int8), op="max")[0]:
            counts["failed"] += 1
            report["failures"][f"{name}: {why or 'failed on another rank'}"] += 1
            wrapped.renew()
        else:
            counts["passed"] += 1
    return dict(counts)


def _instance(test_class: type, method: str, whole_comm: bool) -> unittest.TestCase:
    """test_class(method), whose setUp must leave an mpiring communicator in COMM (a drop-in
    Intracomm for the modules of the whole Comm API): no case may silently run on mpi4py's own
    collectives."""
    import mpiring
    from mpiring.dropin import Intracomm

    test = test_class(method)
    set_up = test.setUp
    expected = Intracomm if whole_comm else mpiring.Communicator

    def checked_set_up() -> None:
        set_up()
        if not isinstance(test.COMM, expected):
            raise RuntimeError(f"{test_class.__name__}.setUp made a {type(test.COMM).__name__}, not an "
                               f"{expected.__module__}.{expected.__name__}: the suite would test mpi4py itself")

    test.setUp = checked_set_up
    return test


def _test_classes(module: Any, mpi: Any, whole_comm: bool) -> list[tuple[type, bool | None]]:
    """The module's test classes over COMM_WORLD (True) or COMM_SELF (False), or their Dup()s
    made in setUp; in the modules of the whole Comm API also those whose setUp alone sets COMM
    (None: from the module's MPI, the drop-in's)."""
    found: list[tuple[type, bool | None]] = []
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, unittest.TestCase) and value.__module__ == module.__name__:
            comm = getattr(value, "COMM", None)
            if isinstance(comm, mpi.Comm) and (comm == mpi.COMM_WORLD or comm == mpi.COMM_SELF):
                found.append((value, comm == mpi.COMM_WORLD))
            elif whole_comm and comm is None and any("setUp" in vars(base) for base in value.__mro__
                                                     if base.__module__ == module.__name__):
                found.append((value, None))
    return found


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


def _is_consequence(why: str) -> bool:
    """Whether a failure is a wait for another rank (which may have failed first)."""
    return any(name in _last_line(why) for name in ("CollectiveTimeout", "CommunicatorBrokenError",
                                                    "MessageMismatchError"))


def _agree(native: Any, mine: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Every rank's outcome of each case made one: failed if it failed anywhere, or if it was
    refused on some ranks only (or ran on some ranks only); skipped if skipped everywhere."""
    everyone = native.allgather(mine)
    agreed = []
    for index in range(max(len(outcomes) for outcomes in everyone)):
        label = next(outcomes[index][0] for outcomes in everyone if index < len(outcomes))
        per_rank = [outcomes[index][1:] if index < len(outcomes) else ("failed", "this case did not run here")
                    for outcomes in everyone]
        verdicts = {verdict for verdict, _ in per_rank}
        if "failed" in verdicts:  # the cause, rather than a rank that timed out waiting for it
            rank = min((r for r, (verdict, _) in enumerate(per_rank) if verdict == "failed"),
                       key=lambda r: (_is_consequence(per_rank[r][1]), r))
            agreed.append((label, "failed", f"rank {rank}: {per_rank[rank][1]}"))
        elif verdicts == {"skipped"}:
            agreed.append((label, "skipped", per_rank[0][1]))
        elif "skipped" in verdicts:
            ranks = [r for r, (verdict, _) in enumerate(per_rank) if verdict == "skipped"]
            agreed.append((label, "failed", f"skipped on ranks {ranks} only: {per_rank[ranks[0]][1]}"))
        else:
            agreed.append((label, "passed", ""))
    return agreed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--modules", nargs="+", default=MODULES, help="mpi4py test modules (default: %(default)s)")
    parser.add_argument("--cache", help="where mpi4py's source distribution is kept (default: $MPIRING_MPI4PY_CACHE "
                                        "or ~/.cache/mpiring)")
    parser.add_argument("--run-timeout", type=int, default=900, help="seconds for one world size")
    parser.add_argument("--all-cases", action="store_true",
                        help="every type code of every array kind (default: every one of NumPy arrays, one of each "
                             "other kind per test, turning with the world size)")
    parser.add_argument("--worker", metavar="TEST_FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return work(args.worker, args.modules, args.all_cases)
    return drive(args.sizes, args.modules, args.cache, args.run_timeout, args.all_cases)


if __name__ == "__main__":
    sys.exit(main())
