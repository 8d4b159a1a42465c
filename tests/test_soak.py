"""Soak: a seeded random stream of collectives (kind, op, dtype, length, shape, root, algorithm,
out=, blocking or several nonblocking in flight at once) checked one by one against mpi4py's
native collectives, or NumPy on regenerated inputs where MPI has no type (float16; bool with
ops) or no oracle (Open MPI's saturating 8- and 16-bit sums: oracles.native_sum_wraps). Zero
mismatches, and the resident memory (RSS) flat after warm-up.

    python tests/run_world_sizes.py --no-serial -- tests/test_soak.py                 # quick tier (CI)
    MPIRING_SOAK=full python tests/run_world_sizes.py --no-serial --sizes 4 -- tests/test_soak.py

MPIRING_SOAK=full runs 10,000 collectives (MPIRING_SOAK_OPS overrides the count,
MPIRING_SOAK_SEED the seed); the quick tier runs 240 small ones (120 above 4 ranks). Rank 0 prints a
summary line, and writes it as JSON to MPIRING_SOAK_REPORT when that is set.

Every rank draws the same stream from the seed (collectives must be called in the same order);
the data of each rank is its own. Nonblocking batches complete in a random order that is the
same on every rank: mpiring's request.wait() advances only its own collective, so ranks that
wait in different orders deadlock (docs/reliability.md).
"""

from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from oracles import NATIVE_OPS, native_supported, numpy_reduce, rank_input

import mpiring
from mpiring.algorithms import ALGORITHMS
from mpiring.backend import SUPPORTED_DTYPES
from mpiring.ops import op_problem

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()

FULL = os.environ.get("MPIRING_SOAK", "quick").lower() == "full"
# The quick tier keeps to ~5 s on 2 shared cores: fewer ops where 8 ranks share them.
OPS = int(os.environ.get("MPIRING_SOAK_OPS", 10_000 if FULL else 240 if N <= 4 else 120))
SEED = int(os.environ.get("MPIRING_SOAK_SEED", 20261121))
LONGEST = 70_001 if FULL else 1_024  # elements: the full tier crosses the MPI eager limits
RSS_SLACK = 64 << 20  # bytes RSS may grow after warm-up: generous, it catches leaks per call
COLLECTIVES = list(ALGORITHMS)
DTYPES = sorted(SUPPORTED_DTYPES, key=lambda d: d.name)  # a set: sort it so every rank draws alike
REDUCTIONS = ("reduce", "allreduce", "reduce_scatter", "scan", "exscan")


def _ops_for(dtype: np.dtype) -> list[str]:
    return [op for op in mpiring.OPS if op_problem(op, dtype.kind) is None]


@dataclass
class Spec:
    """One collective of the stream, the same on every rank."""

    index: int
    kind: str
    algorithm: str
    dtype: np.dtype
    op: str | None
    root: int
    shape: tuple[int, ...]  # this rank's input shape (gather/all-gather rows differ per rank)
    rows: list[int]  # every rank's row count (gather, all-gather)
    out: str  # "none", "fresh" or "inplace"
    seed: int = 0

    def describe(self) -> str:
        return (f"#{self.index} {self.kind} {self.algorithm} {self.dtype} op={self.op} root={self.root} "
                f"shape={self.shape} rows={self.rows} out={self.out}")


@dataclass
class Flight:
    """A collective issued but maybe not completed: its inputs stay untouched until checked."""

    spec: Spec
    x: Any  # the input passed (None for a non-root scatter and for barrier)
    original: Any  # a copy of the input, for the oracles (the in-place forms overwrite x)
    request: Any = None
    result: Any = None


@dataclass
class Tally:
    ops: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    nonblocking: int = 0
    mismatches: list[str] = field(default_factory=list)


def _length(rng: np.random.Generator) -> int:
    bucket = rng.random()
    if bucket < 0.1:
        return 0
    if bucket < 0.4:
        return int(rng.integers(1, 17))
    if bucket < 0.75:
        return int(rng.integers(17, 513))
    if bucket < 0.95 or LONGEST <= 8_192:
        return int(rng.integers(513, min(8_193, LONGEST + 1)))
    return int(rng.integers(8_193, LONGEST + 1))


def draw(index: int) -> Spec:
    """The index-th collective of the stream (a pure function of the seed and the index)."""
    rng = np.random.default_rng([SEED, index])
    kind = COLLECTIVES[int(rng.integers(len(COLLECTIVES)))]
    choices = ["auto", *ALGORITHMS[kind]]
    algorithm = choices[int(rng.integers(len(choices)))]
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    ops = _ops_for(dtype)
    op = ops[int(rng.integers(len(ops)))] if kind in REDUCTIONS else None
    root = int(rng.integers(N))
    length = _length(rng)
    cols = int(rng.choice([1, 1, 2, 3]))
    rows = [length // cols] * N
    if kind in ("gather", "allgather"):  # ranks pass different row counts
        rows = [int(r) for r in rng.integers(0, max(length // cols // max(N, 1), 1) + 1, N)]
    if kind == "alltoall":  # equal blocks
        rows = [length // cols // N * N] * N
    if kind == "alltoallv":  # rank a sends rank b _sends(a, b, index) rows
        rows = [sum(_sends(a, b, index) for b in range(N)) for a in range(N)]
    shape = (rows[RANK],) if cols == 1 else (rows[RANK], cols)
    out = "none"
    if kind not in ("barrier",):
        pick = rng.random()
        out = "fresh" if pick < 0.15 else "inplace" if pick < 0.3 and kind in ("allreduce", "broadcast") else "none"
    return Spec(index, kind, algorithm, dtype, op, root, shape, rows, out, seed=SEED * 100_003 + index)


def _sends(a: int, b: int, index: int) -> int:
    """alltoallv's rows from rank a to rank b in the index-th call: uneven, often none."""
    return (a + 2 * b + index) % 4


def _input(spec: Spec, rank: int) -> np.ndarray:
    shape = spec.shape if rank == RANK else ((spec.rows[rank],) + spec.shape[1:])
    return rank_input(spec.seed, rank, shape, spec.dtype, spec.op or "sum")


def _out_for(spec: Spec, x: np.ndarray | None) -> np.ndarray | None:
    """The out= array to pass, shaped as this rank's result."""
    if spec.out == "inplace":
        return x
    if spec.out != "fresh":
        return None
    trailing = spec.shape[1:]
    if spec.kind in ("broadcast", "allreduce", "alltoall", "scan", "exscan"):
        return np.empty(spec.shape, spec.dtype)
    if spec.kind == "alltoallv":
        return np.empty((sum(_sends(a, RANK, spec.index) for a in range(N)), *trailing), spec.dtype)
    if spec.kind == "reduce":
        return np.empty(spec.shape, spec.dtype) if RANK == spec.root else None
    if spec.kind == "allgather":
        return np.empty((sum(spec.rows), *trailing), spec.dtype)
    if spec.kind == "gather":
        return np.empty((sum(spec.rows), *trailing), spec.dtype) if RANK == spec.root else None
    part = np.array_split(np.empty(spec.shape[0]), N)[RANK].shape[0]  # scatter, reduce_scatter
    return np.empty((part, *trailing), spec.dtype)


def issue(comm: mpiring.Communicator, spec: Spec, blocking: bool) -> Flight:
    kind = spec.kind
    x = None if kind == "barrier" or (kind == "scatter" and RANK != spec.root) else _input(spec, RANK)
    original = None if x is None else x.copy()
    kwargs: dict[str, Any] = {"algorithm": spec.algorithm}
    if kind != "barrier":
        kwargs["out"] = _out_for(spec, x)
    if kind in REDUCTIONS:
        kwargs["op"] = spec.op
    if kind in ("broadcast", "reduce", "gather", "scatter"):
        kwargs["root"] = spec.root
    args = () if kind == "barrier" else (x,)
    if kind == "alltoallv":
        args = (x, [_sends(RANK, b, spec.index) for b in range(N)])
    flight = Flight(spec, x, original)
    if blocking:
        flight.result = getattr(comm, kind)(*args, **kwargs)
    else:
        flight.request = getattr(comm, "i" + kind)(*args, **kwargs)
    return flight


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def oracle(spec: Spec, original: np.ndarray | None) -> np.ndarray | None:
    """What this rank should get, from MPI's own collective (called on every rank, in order)
    or, where MPI has no type for the data, from NumPy on every rank's regenerated input."""
    kind, dtype, op = spec.kind, spec.dtype, spec.op
    row = int(np.prod(spec.shape[1:], dtype=np.int64)) * dtype.itemsize  # bytes per row
    trailing = spec.shape[1:]
    if kind == "barrier":
        WORLD.Barrier()
        return None
    if kind == "broadcast":
        buf = original.copy()
        WORLD.Bcast(_bytes(buf), root=spec.root)
        return buf
    if kind in ("gather", "allgather"):
        result = np.empty((sum(spec.rows), *trailing), dtype)
        counts = [r * row for r in spec.rows]
        if kind == "allgather":
            WORLD.Allgatherv(_bytes(original), [_bytes(result), counts, MPI.BYTE])
            return result
        WORLD.Gatherv(_bytes(original), [_bytes(result), counts, MPI.BYTE] if RANK == spec.root else None,
                      root=spec.root)
        return result if RANK == spec.root else None
    if kind == "scatter":
        total = spec.rows[0]  # the root's shape is the same stream draw on every rank
        parts = [len(p) for p in np.array_split(np.arange(total), N)]
        result = np.empty((parts[RANK], *trailing), dtype)
        send = [_bytes(original), [p * row for p in parts], MPI.BYTE] if RANK == spec.root else None
        WORLD.Scatterv(send, [_bytes(result), MPI.BYTE], root=spec.root)
        return result
    if kind in ("alltoall", "alltoallv"):
        send = [spec.shape[0] // N] * N if kind == "alltoall" else [_sends(RANK, b, spec.index) for b in range(N)]
        receive = send if kind == "alltoall" else [_sends(a, RANK, spec.index) for a in range(N)]
        result = np.empty((sum(receive), *trailing), dtype)
        WORLD.Alltoallv([_bytes(original), [n * row for n in send], MPI.BYTE],
                        [_bytes(result), [n * row for n in receive], MPI.BYTE])
        return result
    # reductions
    parts = [len(p) for p in np.array_split(np.arange(spec.shape[0]), N)]
    mpi_has_it = dtype != np.bool_ and native_supported(dtype, op)  # bool: NumPy for every op here
    if kind in ("scan", "exscan"):
        exclusive = kind == "exscan"
        if mpi_has_it:
            result = np.empty_like(original)
            (WORLD.Exscan if exclusive else WORLD.Scan)(original, result, NATIVE_OPS[op])
            if op == "avg" and RANK > 0:
                result = np.true_divide(result, RANK if exclusive else RANK + 1).astype(dtype)
        elif RANK > 0 or not exclusive:
            result = numpy_reduce(op, [_input(spec, k) for k in range(RANK if exclusive else RANK + 1)])
        return None if exclusive and RANK == 0 else result
    if mpi_has_it:
        if kind == "reduce_scatter":
            result = np.empty((parts[RANK], *trailing), dtype)
            per_row = row // dtype.itemsize
            WORLD.Reduce_scatter(np.ascontiguousarray(original), result, [p * per_row for p in parts], NATIVE_OPS[op])
        else:
            result = np.empty_like(original)
            if kind == "allreduce":
                WORLD.Allreduce(original, result, NATIVE_OPS[op])
            else:
                WORLD.Reduce(original, result, NATIVE_OPS[op], root=spec.root)
        if op == "avg":
            result = np.true_divide(result, N).astype(dtype)
    else:
        result = numpy_reduce(op, [_input(spec, k) for k in range(N)])
        if kind == "reduce_scatter":
            result = np.array_split(result, N)[RANK]
    if kind == "reduce" and RANK != spec.root:
        return None
    return result


def check(flight: Flight, tally: Tally) -> None:
    spec = flight.spec
    want = oracle(spec, flight.original)
    got = flight.result
    problem = None
    if want is None:
        if got is not None:
            problem = f"expected None, got {type(got).__name__}"
    elif got is None:
        problem = "got None"
    elif got.dtype != want.dtype or got.shape != want.shape:
        problem = f"got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
    elif not np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"):
        wrong = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
        problem = f"{wrong.size} elements differ, first at {wrong[:5].tolist()}"
    if problem:
        tally.mismatches.append(f"rank {RANK}: {spec.describe()}: {problem}")
    tally.ops += 1
    tally.by_kind[spec.kind] = tally.by_kind.get(spec.kind, 0) + 1


def rss_bytes() -> int | None:
    """This process's resident set size now (Linux), or None where /proc is missing."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def _sample() -> int | None:
    gc.collect()
    return rss_bytes()


def test_soak_against_native_mpi():
    comm = mpiring.Communicator(timeout=120)  # a hang becomes a named error, not a stuck job
    tally = Tally()
    every = max(OPS // 10, 20)  # ops between RSS samples; the first one ends the warm-up
    next_sample, rss_warm, samples = every, None, []
    started = time.monotonic()
    index = 0
    while index < OPS:
        if tally.ops >= next_sample:
            samples.append(_sample())
            rss_warm = samples[0]
            next_sample += every
        batch_rng = np.random.default_rng([SEED, index, 7])
        batch = 1 if batch_rng.random() < 0.6 else int(batch_rng.integers(2, 5))
        batch = min(batch, OPS - index)
        specs = [draw(index + k) for k in range(batch)]
        index += batch
        if batch == 1:
            flights = [issue(comm, specs[0], blocking=True)]
        else:
            flights = [issue(comm, spec, blocking=False) for spec in specs]
            tally.nonblocking += batch
            # Complete in a random order, the same on every rank; half by polling test().
            for k in batch_rng.permutation(batch):
                request = flights[k].request
                if batch_rng.random() < 0.5:
                    while not request.test():
                        pass
                    flights[k].result = request.result
                else:
                    flights[k].result = request.wait()
        for flight in flights:  # the oracles are collectives too: the same order everywhere
            check(flight, tally)
    seconds = time.monotonic() - started
    rss_end = _sample()
    mismatches = WORLD.allgather(tally.mismatches)
    everyone = [m for per_rank in mismatches for m in per_rank]
    rss = WORLD.gather((rss_warm, rss_end, samples))
    growth = [end - warm for warm, end, _ in rss if warm is not None and end is not None] if RANK == 0 else []
    summary = {
        "tier": "full" if FULL else "quick", "seed": SEED, "world_size": N, "ops": tally.ops,
        "nonblocking": tally.nonblocking, "by_kind": tally.by_kind, "mismatches": len(everyone),
        "seconds": round(seconds, 1), "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "rss_mib_after_warm_up": [round(w / 2**20, 1) for w, _, _ in rss if w] if RANK == 0 else None,
        "rss_mib_at_end": [round(e / 2**20, 1) for _, e, _ in rss if e] if RANK == 0 else None,
        "largest_rss_growth_mib": round(max(growth, default=0) / 2**20, 2) if RANK == 0 else None,
        "rss_mib_rank0_samples": [round(s / 2**20, 1) for s in samples if s],
    }
    if RANK == 0:
        print(f"\nsoak: {json.dumps(summary)}")
        if os.environ.get("MPIRING_SOAK_REPORT"):
            with open(os.environ["MPIRING_SOAK_REPORT"], "w") as report:
                json.dump(summary, report, indent=2)
    assert tally.ops == OPS
    assert not everyone, f"{len(everyone)} mismatches:\n" + "\n".join(everyone[:20])
    if RANK == 0:
        assert all(g <= RSS_SLACK for g in growth), f"RSS grew after warm-up: {summary}"
    comm.free()
