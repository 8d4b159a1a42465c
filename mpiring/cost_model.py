"""An alpha-beta-gamma cost model of mpiring's allreduce, broadcast, reduce, gather, scatter,
reduce-scatter, scan and exscan algorithms across nodes: what each one costs on a fabric of two
link classes, which one is cheapest, and what `auto` picks.

    node 0: r0 r1 ─┐ intra: alpha_i per message, beta_i per byte (shared memory)
                   ├─ inter: alpha_e per message, beta_e per byte (one network link per node)
    node 1: r2 r3 ─┘ gamma: per byte reduced

Ranks are in node order: N nodes of k ranks, node i holds ranks i*k .. i*k+k-1 (p = N k). An
algorithm runs in rounds (the messages it has in flight at once), one after another:

- a round lasts as long as its slowest message;
- a message between two nodes pays alpha_e and shares its node's link with every other
  crossing message that node sends (or receives) in the same round: a node that sends c
  crossing messages of m bytes spends alpha_e + c m beta_e;
- a message inside a node pays alpha_i and is copied by its receiver (MPI's single-copy shared
  memory), so a rank's incoming intra-node messages of a round add up: alpha_i + (bytes it
  receives inside its node) beta_i, while one sender's copies to several ranks run side by side;
- the reductions a round brings cost gamma per byte reduced, on the rank that reduces most.

Trees (binomial) run hop by hop: a rank sends to one child per hop, farthest subtree first.
The halving and doubling algorithms fold non-power-of-two worlds as mpiring does (one round to
hand a vector to a partner before, one to hand it back after). Node-aware algorithms run their
phases one after another, and their sub-rings side by side: k lanes crossing at once share
their node's link, which the model counts as beta_e x k for the lanes' flat algorithm.

Two views of the same message pattern:

- `predict`: closed forms, one small function per algorithm (formula in its docstring), fast
  enough for 1,024 nodes x 8 ranks;
- `pattern`: every message of every round, with the exact element split mpiring makes;
  `bytes_sent` sums it per rank (tests compare it with mpiring's own traffic counters) and
  `simulate` applies the round rule to it (tests compare that with `predict`).

`calibrate(comm)` fits a fabric by ping-pong; `python -m mpiring.cost_model` (or
`mpiring model`) calibrates, predicts and projects (docs/cost-model.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from mpiring import environment, selection
from mpiring.algorithms.allreduce_node_pipelined import segment_bounds, slot_steps
from mpiring.algorithms.broadcast_ring import segment_count
from mpiring.algorithms.reduce_scatter_ring_pipelined import SEGMENT_BYTES as PIPELINE_SEGMENT_BYTES
from mpiring.algorithms.scan_ring import SEGMENT_BYTES as SCAN_SEGMENT_BYTES
from mpiring.algorithms.scan_ring import chain_segments
from mpiring.engine.partition import split_bounds
from mpiring.engine.transport import WINDOW
from mpiring.selection import across_choice, flat_choice
from mpiring.topology import NodeMap

FABRIC_VARIABLE = "MPIRING_FABRIC"
COLLECTIVES = ("allreduce", "broadcast", "reduce", "gather", "scatter", "reduce_scatter", "scan", "exscan")


# ---- fabrics ----


@dataclass(frozen=True)
class Link:
    """One class of link: `alpha` seconds per message, `beta` seconds per byte."""

    alpha: float
    beta: float

    def time(self, nbytes: float) -> float:
        return self.alpha + nbytes * self.beta


@dataclass(frozen=True)
class Fabric:
    """Links inside a node (`intra`) and between nodes (`inter`), and `gamma` seconds per byte reduced."""

    intra: Link
    inter: Link
    gamma: float
    name: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"intra": {"alpha": self.intra.alpha, "beta": self.intra.beta},
                "inter": {"alpha": self.inter.alpha, "beta": self.inter.beta},
                "gamma": self.gamma, "name": self.name}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fabric:
        return cls(Link(float(data["intra"]["alpha"]), float(data["intra"]["beta"])),
                   Link(float(data["inter"]["alpha"]), float(data["inter"]["beta"])),
                   float(data["gamma"]), str(data.get("name", "")))

    def save(self, path: str | os.PathLike) -> Path:
        target = Path(path).expanduser()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return target

    @classmethod
    def load(cls, path: str | os.PathLike) -> Fabric:
        return cls.from_json(json.loads(Path(path).expanduser().read_text()))

    def with_inter_beta(self, factor: float) -> Fabric:
        """The same fabric with the inter-node bandwidth shared `factor` ways."""
        return Fabric(self.intra, Link(self.inter.alpha, self.inter.beta * factor), self.gamma, self.name)


def _gbits(rate: float) -> float:
    """Seconds per byte of a link of `rate` Gbit/s."""
    return 8 / (rate * 1e9)


# Published fabrics, for projection. Assumptions:
# - ib200: 200 Gb/s HDR InfiniBand (ConnectX-6). OSU's MPI ping-pong latency on HDR is about
#   1.0-1.1 us for small messages; 1.8 us adds a switch hop and the cost of an MPI call made from
#   Python. About 24 GB/s of the 25 GB/s line rate reaches a large message. Inside a node: a
#   shared-memory message ~0.4 us; one core copies ~10 GB/s (a single-copy, cross-memory attach
#   transfer). gamma: numpy.add of float64 at ~5 GB/s of operand per core.
# - emulated-1g / emulated-10g: the emulated cluster (network namespaces, veth pairs and a
#   bridge, tc tbf shaping each node's egress to 1 or 10 Gbit/s, MPI over TCP): ~30 us per
#   message over TCP on veth, the shaped rate; inside a node MPICH's shared memory on cores the
#   nodes share (~1 us, ~5 GB/s).
FABRICS: dict[str, Fabric] = {
    "ib200": Fabric(Link(0.4e-6, 1 / 10e9), Link(1.8e-6, 1 / 24e9), 1 / 5e9, "ib200"),
    "emulated-1g": Fabric(Link(1e-6, 1 / 5e9), Link(30e-6, _gbits(1)), 1 / 3e9, "emulated-1g"),
    "emulated-10g": Fabric(Link(1e-6, 1 / 5e9), Link(30e-6, _gbits(10)), 1 / 3e9, "emulated-10g"),
}


def default_path() -> Path:
    """Where a calibrated fabric is kept: $MPIRING_FABRIC, else ~/.cache/mpiring/fabric.json."""
    return Path(environment.text(FABRIC_VARIABLE) or "~/.cache/mpiring/fabric.json").expanduser()


def load_fabric(spec: str | None = None) -> Fabric:
    """A named fabric (FABRICS) or a JSON file; None: the calibrated one at default_path()."""
    if spec in FABRICS:
        return FABRICS[spec]
    path = default_path() if spec is None else Path(spec).expanduser()
    fabric = Fabric.load(path)
    return fabric if fabric.name else Fabric(fabric.intra, fabric.inter, fabric.gamma, str(path))


# ---- the round rule, in units of one message size ----


def _round(f: Fabric, m: float, crossing: int, intra: int) -> float:
    """A round whose busiest node link carries `crossing` messages of m bytes and whose busiest
    rank moves `intra` messages of m bytes inside its node (0: none of that class)."""
    across = f.inter.time(crossing * m) if crossing else 0.0
    inside = f.intra.time(intra * m) if intra else 0.0
    return max(across, inside)


def _units(pairs: Iterable[tuple[int, int]], k: int) -> tuple[int, int]:
    """(crossing, intra) of one round of equal messages src -> dst: the most crossing messages one
    node sends or receives, the most intra-node messages one rank receives."""
    node_out: dict[int, int] = {}
    node_in: dict[int, int] = {}
    rank_in: dict[int, int] = {}
    for src, dst in pairs:
        if src // k != dst // k:
            node_out[src // k] = node_out.get(src // k, 0) + 1
            node_in[dst // k] = node_in.get(dst // k, 0) + 1
        else:
            rank_in[dst] = rank_in.get(dst, 0) + 1
    return max([*node_out.values(), *node_in.values(), 0]), max(rank_in.values(), default=0)


def _fold(p: int) -> tuple[int, int]:
    """(p2, extra): the largest power of two <= p and the ranks beyond it (power_of_two.Fold)."""
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def _real(v: int, extra: int) -> int:
    return 2 * v + 1 if v < extra else v + extra


@cache
def _fold_units(p: int, k: int) -> tuple[int, int]:
    """Units of the fold round (each even rank below 2 extra hands its vector to the odd rank after it)."""
    _, extra = _fold(p)
    return _units(((2 * i, 2 * i + 1) for i in range(extra)), k)


@cache
def _exchange_units(p: int, k: int, mask: int) -> tuple[int, int]:
    """Units of a halving or doubling round: virtual rank v and v ^ mask swap."""
    p2, extra = _fold(p)
    return _units(((_real(v, extra), _real(v ^ mask, extra)) for v in range(p2)), k)


@cache
def _tree_units(p: int, k: int, d: int) -> tuple[int, int]:
    """Units of the binomial hop of distance d from root 0: v -> v + d for v a multiple of 2d."""
    return _units(((v, v + d) for v in range(0, p - d, 2 * d)), k)


def _shift_crossing(s: int, p: int, k: int) -> int:
    """Ranks of a node whose partner s places to the right (mod p) is on another node."""
    return k - max(0, k - s) - max(0, k - p + s)


@cache
def _window_units(p: int, k: int) -> tuple[tuple[int, int], ...]:
    """Units of each step of the scattered algorithms (shifts 1..p-1, WINDOW per step): a node
    sends sum_s crossing(s) chunks; a rank receives the chunks of its shifts that stay in its node."""
    steps = []
    for first in range(1, p, WINDOW):
        shifts = range(first, min(first + WINDOW, p))
        crossing = sum(_shift_crossing(s, p, k) for s in shifts)
        intra = max(sum(1 for s in shifts if (j - s) % p < k) for j in range(k))
        steps.append((crossing, intra))
    return tuple(steps)


@cache
def _linear_units(p: int, k: int) -> tuple[tuple[int, int], ...]:
    """Units of each step of the linear broadcast from rank 0 (WINDOW receivers per step)."""
    return tuple(_units(((0, r) for r in range(first, min(first + WINDOW, p))), k) for first in range(1, p, WINDOW))


# ---- closed forms: allreduce (n bytes per rank) ----


def allreduce_ring(n: float, N: int, k: int, f: Fabric) -> float:
    """2(p-1) max(alpha_e + n/p beta_e, alpha_i + n/p beta_i) + (p-1)/p n gamma.

    Every step each rank sends one chunk of n/p to its right; one rank per node (the last)
    crosses to the next node. One node: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma."""
    p = N * k
    if p == 1:
        return 0.0
    return 2 * (p - 1) * _round(f, n / p, N > 1, k > 1) + (p - 1) / p * n * f.gamma


def allreduce_ring_pipelined(n: float, N: int, k: int, f: Fabric) -> float:
    """(p-1) S max(alpha + n/(pS) beta) + (p-1) max(alpha + n/p beta) + (p-1)/p n gamma,
    S = ceil(n/p / SEGMENT_BYTES) segments per chunk in the reduce-scatter (1 MiB)."""
    p = N * k
    if p == 1:
        return 0.0
    m = n / p
    s = max(1, math.ceil(m / PIPELINE_SEGMENT_BYTES))
    return ((p - 1) * s * _round(f, m / s, N > 1, k > 1) + (p - 1) * _round(f, m, N > 1, k > 1)
            + (p - 1) / p * n * f.gamma)


def allreduce_scattered(n: float, N: int, k: int, f: Fabric) -> float:
    """2 sum_w max(alpha_e + C_w n/p beta_e, alpha_i + I_w n/p beta_i) + (p-1)/p n gamma.

    Steps w of WINDOW shifts; C_w = sum over its shifts s of the node's ranks whose shift-s
    partner is on another node (k - max(0, k-s) - max(0, k-p+s)), I_w the most shifts of one
    rank that stay in its node. One step to p = 33: at 2 x 2, C = 4 (two chunks per rank)."""
    p = N * k
    if p == 1:
        return 0.0
    m = n / p
    return 2 * sum(_round(f, m, c, i) for c, i in _window_units(p, k)) + (p - 1) / p * n * f.gamma


def allreduce_recursive_doubling(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over lg p2 rounds of max(alpha_e + c_j n beta_e, alpha_i + n beta_i) + lg p2 n gamma
    + (p != p2) [2 fold rounds of n bytes + n gamma].

    Round j swaps whole vectors with the rank 2^j away (virtual ranks after the fold); c_j counts
    a node's ranks whose partner is elsewhere: k once 2^j >= k (k a power of two), else 0."""
    p = N * k
    p2, extra = _fold(p)
    total = sum(_round(f, n, *_exchange_units(p, k, 1 << j)) + n * f.gamma for j in range(p2.bit_length() - 1))
    if extra:
        total += 2 * _round(f, n, *_fold_units(p, k)) + n * f.gamma
    return total


def allreduce_rabenseifner(n: float, N: int, k: int, f: Fabric) -> float:
    """sum_j max(alpha + c_j n/2^(j+1) beta) (halving) + sum_j max(alpha + c_j n/2^(j+1) beta)
    (doubling) + (p2-1)/p2 n gamma + (p != p2) [2 fold rounds of n bytes + n gamma].

    Halving round j sends half of the window held, n/2, n/4, ..., n/p2; doubling sends them back
    in reverse; c_j as in recursive doubling (the partner of a mask of 2^j)."""
    p = N * k
    p2, extra = _fold(p)
    total = (p2 - 1) / p2 * n * f.gamma
    mask, size = p2 >> 1, n / 2
    while mask:
        total += 2 * _round(f, size, *_exchange_units(p, k, mask))  # halving, and doubling back
        mask, size = mask >> 1, size / 2
    if extra:
        total += 2 * _round(f, n, *_fold_units(p, k)) + n * f.gamma
    return total


def allreduce_node_lanes(n: float, N: int, k: int, f: Fabric) -> float:
    """2(k-1)(alpha_i + n/k beta_i) + (k-1)/k n gamma + lanes(n/k, N, beta_e x k).

    A ring reduce-scatter and all-gather inside each node; between them the k lanes all-reduce
    their n/k shares across the N nodes at once (the flat algorithm `auto` picks for n/k bytes on
    N ranks), so a node's link carries k lane messages per round. With the ring across:
    2(N-1)(alpha_e + k n/(kN) beta_e) = 2(N-1) alpha_e + 2(N-1)/N n beta_e."""
    inside = 2 * (k - 1) * _round(f, n / k, 0, 1) + (k - 1) / k * n * f.gamma if k > 1 else 0.0
    share = n / k
    across = _ALLREDUCE[across_choice("allreduce", int(share), N)](share, N, 1, f.with_inter_beta(k)) if N > 1 else 0.0
    return inside + across


def allreduce_node_pipelined(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over (m+2) slots of L = max(k-1, 2(N-1)) steps, step i of a slot:
    max(alpha_e + s/N beta_e [lane ring step i < 2(N-1)], alpha_i + c s/k beta_i [c node phases
    with a step i < k-1]) + (s/k [reduce-scatter] + s/(kN) [lane step i < N-1]) gamma.

    m = ceil(n / (k N PIECE_BYTES)) segments of s = n/m bytes. Slot 0 holds segment 0's reduce-scatter
    alone, slot m+1 segment m-1's all-gather alone; between them a segment's lane all-reduce runs
    beside the next one's reduce-scatter and the one before's all-gather (module
    mpiring.algorithms.allreduce_node_pipelined). One node, or one rank per node: node_lanes."""
    if N == 1 or k == 1:
        return allreduce_node_lanes(n, N, k, f)
    m = len(segment_bounds(int(n), 1, k * N)) - 1  # n bytes as items of one byte
    share = n / m / k
    slot = max(k - 1, 2 * (N - 1))

    def one_slot(reduce_scatter: bool, lanes: bool, all_gather: bool) -> float:
        total = 0.0
        for i in range(slot):
            node_phases = (reduce_scatter + all_gather) * (i < k - 1)
            crossing = lanes and i < 2 * (N - 1)
            across = f.inter.time(k * share / N) if crossing else 0.0
            inside = f.intra.time(node_phases * share) if node_phases else 0.0
            reduced = share * (reduce_scatter and i < k - 1) + share / N * (lanes and i < N - 1)
            total += max(across, inside) + reduced * f.gamma
        return total

    if m == 1:
        return one_slot(True, False, False) + one_slot(False, True, False) + one_slot(False, False, True)
    return (one_slot(True, False, False) + one_slot(True, True, False) + (m - 2) * one_slot(True, True, True)
            + one_slot(False, True, True) + one_slot(False, False, True))


def allreduce_node_leader(n: float, N: int, k: int, f: Fabric) -> float:
    """2 ceil(lg k)(alpha_i + n beta_i) + ceil(lg k) n gamma + leaders(n, N).

    A binomial reduce to each node's leader, the leaders' flat all-reduce of n bytes (the one
    `auto` picks on N ranks), a binomial broadcast inside each node."""
    hops = (k - 1).bit_length()
    inside = hops * (2 * _round(f, n, 0, 1) + n * f.gamma)
    across = _ALLREDUCE[across_choice("allreduce", int(n), N)](n, N, 1, f) if N > 1 else 0.0
    return inside + across


# ---- closed forms: broadcast (n bytes) ----


def broadcast_linear(n: float, N: int, k: int, f: Fabric) -> float:
    """sum_w max(alpha_e + X_w n beta_e, alpha_i + n beta_i): the root sends n to WINDOW ranks per
    step; X_w of them on other nodes share the root node's link, those on its own node copy at
    once. One node, p <= 33: alpha + n beta."""
    return sum(_round(f, n, c, i) for c, i in _linear_units(N * k, k))


def broadcast_binomial(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over ceil(lg p) hops of max(alpha_e + c_h n beta_e, alpha_i + n beta_i).

    Hop of distance d: ranks at multiples of 2d send n to the rank d after; c_h counts a node's
    senders whose receiver is on another node (1 per node where d >= k, k a power of two)."""
    p = N * k
    hops = (p - 1).bit_length()
    return sum(_round(f, n, *_tree_units(p, k, 1 << h)) for h in range(hops))


def broadcast_ring(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over p+S-2 steps of max(alpha_e + n/S beta_e, alpha_i + n/S beta_i), S segments of
    512 KiB (1 where p <= 2): at step t positions max(0, t-S+1)..min(t, p-2) forward a segment;
    a step crosses where one of them is the last rank of its node. Once the pipeline is full:
    (p+S-2) max(alpha_e + n/S beta_e, alpha_i + n/S beta_i)."""
    p = N * k
    if p == 1:
        return 0.0
    s = segment_count(int(n), p)
    total = 0.0
    for t in range(p + s - 2):
        lo, hi = max(0, t - s + 1), min(t, p - 2)
        crossing = N > 1 and lo + (k - 1 - lo % k) % k <= hi
        intra = k > 1 and (hi > lo or lo % k != k - 1)
        total += _round(f, n / s, crossing, intra)
    return total


def broadcast_node_leader(n: float, N: int, k: int, f: Fabric) -> float:
    """across(n, N) + inside(n, k): the flat broadcast `auto` picks for N ranks among one rank per
    node, then the one it picks for k ranks inside every node at once."""
    across = _BROADCAST[across_choice("broadcast", int(n), N)](n, N, 1, f) if N > 1 else 0.0
    inside = _BROADCAST[flat_choice("broadcast", int(n), k)](n, 1, k, f) if k > 1 else 0.0
    return across + inside


# ---- closed forms: reduce (n bytes per rank, root 0) ----


def reduce_binomial(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over ceil(lg p) hops of [max(alpha_e + c_h n beta_e, alpha_i + n beta_i) + n gamma]:
    the broadcast tree upside down, nearest children first."""
    p = N * k
    hops = (p - 1).bit_length()
    return sum(_round(f, n, *_tree_units(p, k, 1 << h)) + n * f.gamma for h in range(hops))


def _gather_ring(m: float, N: int, k: int, f: Fabric) -> float:
    """p-1 steps of the ring gather to rank 0 (blocks of m): at step s positions s+1..p-1 send one
    block right. Rank p-1 crosses to node 0 at every step; the other senders stay in their node
    except at node ends, so the first p-2 steps also have intra-node messages (k > 1)."""
    p = N * k
    if N == 1:
        return (p - 1) * _round(f, m, 0, 1)
    return (p - 2) * _round(f, m, 1, k > 1) + _round(f, m, 1, 0)


def reduce_ring(n: float, N: int, k: int, f: Fabric) -> float:
    """(p-1) max(alpha + n/p beta) + (p-1)/p n gamma (ring reduce-scatter) + (p-1) max(alpha +
    n/p beta) (ring gather to the root): 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma on one node."""
    p = N * k
    if p == 1:
        return 0.0
    m = n / p
    return (p - 1) * _round(f, m, N > 1, k > 1) + (p - 1) / p * n * f.gamma + _gather_ring(m, N, k, f)


@cache
def _gather_units(p: int, k: int) -> tuple[tuple[int, int], ...]:
    """Units of each step of the linear gather to rank 0 (it receives WINDOW blocks per step)."""
    return tuple(_units(((r, 0) for r in range(first, min(first + WINDOW, p))), k) for first in range(1, p, WINDOW))


def reduce_scattered(n: float, N: int, k: int, f: Fabric) -> float:
    """sum_w max(alpha_e + C_w n/p beta_e, alpha_i + I_w n/p beta_i) + (p-1)/p n gamma (the
    scattered reduce-scatter) + sum_w max(alpha_e + X_w n/p beta_e, alpha_i + I_w n/p beta_i)
    (every rank's reduced chunk to the root, WINDOW per step: X_w of them cross into its node)."""
    p = N * k
    if p == 1:
        return 0.0
    m = n / p
    return (sum(_round(f, m, c, i) for c, i in _window_units(p, k)) + (p - 1) / p * n * f.gamma
            + sum(_round(f, m, c, i) for c, i in _gather_units(p, k)))


def reduce_node_leader(n: float, N: int, k: int, f: Fabric) -> float:
    """ceil(lg k)(alpha_i + n beta_i + n gamma) + across(n, N): a binomial reduce inside every node
    to its representative, then the flat reduce `auto` picks for N ranks among them."""
    inside = reduce_binomial(n, 1, k, f)
    across = _REDUCE[across_choice("reduce", int(n), N)](n, N, 1, f) if N > 1 else 0.0
    return inside + across


# ---- closed forms: gather and scatter (n bytes in all, blocks of m = n/p, root 0) ----


def _weighted_units(pairs: Iterable[tuple[int, int, int]], k: int) -> tuple[int, int]:
    """(crossing, intra) of one round of messages src -> dst of `weight` blocks each: the most
    blocks one node sends or receives across, the most blocks one rank receives inside its node."""
    node_out: dict[int, int] = {}
    node_in: dict[int, int] = {}
    rank_in: dict[int, int] = {}
    for src, dst, weight in pairs:
        if src // k != dst // k:
            node_out[src // k] = node_out.get(src // k, 0) + weight
            node_in[dst // k] = node_in.get(dst // k, 0) + weight
        else:
            rank_in[dst] = rank_in.get(dst, 0) + weight
    return max([*node_out.values(), *node_in.values(), 0]), max(rank_in.values(), default=0)


def _rounds(f: Fabric, m: float, units: Iterable[tuple[int, int, int]]) -> float:
    """Rounds of (crossing, intra, reduced) in units of m bytes: each max(alpha_e + crossing m
    beta_e, alpha_i + intra m beta_i) + reduced m gamma."""
    return sum(_round(f, m, c, i) + r * m * f.gamma for c, i, r in units)


@cache
def _tree_gather_units(p: int, k: int) -> tuple[tuple[int, int, int], ...]:
    """The binomial gather's hops, nearest first: v sends its subtree's min(d, p-v) blocks to v-d."""
    return tuple((*_weighted_units(((v, v - d, min(d, p - v)) for v in range(d, p, 2 * d)), k), 0)
                 for d in (1 << h for h in range((p - 1).bit_length())))


@cache
def _tree_scatter_units(p: int, k: int) -> tuple[tuple[int, int, int], ...]:
    """The binomial scatter's hops, farthest first: v hands v+d its subtree's min(d, p-v-d) blocks."""
    return tuple((*_weighted_units(((v, v + d, min(d, p - v - d)) for v in range(0, p - d, 2 * d)), k), 0)
                 for d in (1 << h for h in reversed(range((p - 1).bit_length()))))


def gather_linear(n: float, N: int, k: int, f: Fabric) -> float:
    """sum_w max(alpha_e + X_w m beta_e, alpha_i + I_w m beta_i), m = n/p: every rank's block to
    the root, WINDOW per step; X_w of them cross into the root's node, I_w are copied by the root."""
    return sum(_round(f, n / (N * k), c, i) for c, i in _gather_units(N * k, k))


def gather_binomial(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over ceil(lg p) hops of max(alpha_e + C_h m beta_e, alpha_i + I_h m beta_i), m = n/p:
    hop d sends subtrees of d blocks (the last one cut at p); C_h and I_h count the blocks a node
    sends across and a rank receives inside its node."""
    return _rounds(f, n / (N * k), _tree_gather_units(N * k, k))


def gather_ring(n: float, N: int, k: int, f: Fabric) -> float:
    """(p-1) max(alpha + n/p beta): the ring gather to rank 0 (see _gather_ring)."""
    return _gather_ring(n / (N * k), N, k, f) if N * k > 1 else 0.0


def _root_windows(n: float, N: int, k: int, f: Fabric, gathering: bool) -> float:
    """The node-aware gather's (scatter's) step at the root: the k-1 blocks of n/(N k) of its own
    node's ranks, then the other N-1 nodes' n/N each, WINDOW messages per step (the root copies
    every block of its node a gather brings; a scatter's are copied by their receivers at once)."""
    sizes = [(False, n / (N * k))] * (k - 1) + [(True, n / N)] * (N - 1)
    total = 0.0
    for first in range(0, len(sizes), WINDOW):
        window = sizes[first : first + WINDOW]
        across = sum(size for crossing, size in window if crossing)
        copies = [size for crossing, size in window if not crossing]
        inside = sum(copies) if gathering else max(copies, default=0.0)
        total += max(f.inter.time(across) if across else 0.0, f.intra.time(inside) if inside else 0.0)
    return total


def gather_node_leader(n: float, N: int, k: int, f: Fabric) -> float:
    """inside(n/N, k) + root step: the flat gather `auto` picks for a node's n/N bytes on k ranks to
    its leader, in every node but the root's at once, then the root receives its own node's blocks
    and each other node's n/N in one message, WINDOW messages per step (_root_windows)."""
    inside = _GATHER[flat_choice("gather", int(n / N), k)](n / N, 1, k, f) if k > 1 and N > 1 else 0.0
    return inside + _root_windows(n, N, k, f, gathering=True)


def scatter_linear(n: float, N: int, k: int, f: Fabric) -> float:
    """sum_w max(alpha_e + X_w m beta_e, alpha_i + m beta_i), m = n/p: the root sends each rank its
    block, WINDOW per step; X_w of them cross the root's link."""
    return sum(_round(f, n / (N * k), c, i) for c, i in _linear_units(N * k, k))


def scatter_binomial(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over ceil(lg p) hops of max(alpha_e + C_h m beta_e, alpha_i + I_h m beta_i), m = n/p:
    the binomial gather upside down, farthest subtree first."""
    return _rounds(f, n / (N * k), _tree_scatter_units(N * k, k))


def scatter_ring(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over p-1 steps t of max(alpha_e + m beta_e, alpha_i + m beta_i), m = n/p: at step t
    positions 0..t pass a block right; one crosses once t >= k-1 (the first node's last rank)."""
    p = N * k
    return sum(_round(f, n / p, N > 1 and t >= k - 1, k > 1) for t in range(p - 1))


def scatter_node_leader(n: float, N: int, k: int, f: Fabric) -> float:
    """root step + inside(n/N, k): the root sends its own node's ranks their blocks and each other
    node's leader its n/N in one message, WINDOW messages per step (_root_windows), then every
    other node runs the flat scatter `auto` picks for n/N bytes on k ranks."""
    inside = _SCATTER[flat_choice("scatter", int(n / N), k)](n / N, 1, k, f) if k > 1 and N > 1 else 0.0
    return _root_windows(n, N, k, f, gathering=False) + inside


# ---- closed forms: reduce-scatter (n bytes per rank, chunks of m = n/p) ----


def reduce_scatter_ring(n: float, N: int, k: int, f: Fabric) -> float:
    """(p-1) max(alpha_e + m beta_e, alpha_i + m beta_i) + (p-1)/p n gamma, m = n/p."""
    p = N * k
    return (p - 1) * _round(f, n / p, N > 1, k > 1) + (p - 1) / p * n * f.gamma if p > 1 else 0.0


def reduce_scatter_ring_pipelined(n: float, N: int, k: int, f: Fabric) -> float:
    """(p-1) S max(alpha + m/S beta) + (p-1)/p n gamma, S = ceil(m / SEGMENT_BYTES) (1 MiB)."""
    p = N * k
    if p == 1:
        return 0.0
    m = n / p
    s = max(1, math.ceil(m / PIPELINE_SEGMENT_BYTES))
    return (p - 1) * s * _round(f, m / s, N > 1, k > 1) + (p - 1) / p * n * f.gamma


@cache
def _halving_units(p: int, k: int) -> tuple[tuple[int, int, int], ...]:
    """Recursive halving in chunks: the fold (a whole vector, p chunks, reduced), the halving rounds
    (the chunks of the half given away; the half kept reduced), the folded chunks handed back."""
    p2, extra = _fold(p)
    first = [2 * v if v < extra else v + extra for v in range(p2)] + [p]  # chunk bounds of the virtual ranks
    units = []
    if extra:
        units.append((*_weighted_units(((2 * i, 2 * i + 1, p) for i in range(extra)), k), p))
    window = {v: (0, p2) for v in range(p2)}
    mask = p2 >> 1
    while mask:
        pairs, kept = [], 0
        for v in range(p2):
            lo, hi = window[v]
            middle = lo + mask
            keep, give = ((lo, middle), (middle, hi)) if v < v ^ mask else ((middle, hi), (lo, middle))
            pairs.append((_real(v, extra), _real(v ^ mask, extra), first[give[1]] - first[give[0]]))
            kept = max(kept, first[keep[1]] - first[keep[0]])
            window[v] = keep
        units.append((*_weighted_units(pairs, k), kept))
        mask >>= 1
    if extra:
        units.append((*_weighted_units(((2 * i + 1, 2 * i, 1) for i in range(extra)), k), 0))
    return tuple(units)


def reduce_scatter_recursive_halving(n: float, N: int, k: int, f: Fabric) -> float:
    """[fold: alpha + n beta + n gamma] + sum_j max(alpha + c_j W_j m beta) + W'_j m gamma + [fold
    back: alpha + m beta], m = n/p: round j gives away half the window held (n/2, n/4, ... on a
    power of two) and reduces the half kept; the fold rounds only where p is not a power of two."""
    return _rounds(f, n / (N * k), _halving_units(N * k, k))


def reduce_scatter_scattered(n: float, N: int, k: int, f: Fabric) -> float:
    """sum_w max(alpha_e + C_w m beta_e, alpha_i + I_w m beta_i) + (p-1)/p n gamma, m = n/p: every
    input chunk straight to its owner (C_w, I_w as in allreduce_scattered)."""
    p = N * k
    if p == 1:
        return 0.0
    return sum(_round(f, n / p, c, i) for c, i in _window_units(p, k)) + (p - 1) / p * n * f.gamma


def reduce_scatter_node_leader(n: float, N: int, k: int, f: Fabric) -> float:
    """reduce(n, k) + across(n, N) + scatter(n/N, k): the flat reduce `auto` picks for n bytes on k
    ranks to every node's leader, the leaders' reduce-scatter of n bytes (node j keeps its n/N), the
    flat scatter of those n/N bytes inside every node."""
    inside = _REDUCE[flat_choice("reduce", int(n), k)](n, 1, k, f) if k > 1 else 0.0
    across = _REDUCE_SCATTER[across_choice("reduce_scatter", int(n), N)](n, N, 1, f) if N > 1 else 0.0
    scatter = _SCATTER[flat_choice("scatter", int(n / N), k)](n / N, 1, k, f) if k > 1 else 0.0
    return inside + across + scatter


# ---- closed forms: scan and exscan (n bytes per rank) ----


def _chain(n: float, N: int, k: int, f: Fabric, exclusive: bool) -> float:
    """sum over p+S-2 steps of max(alpha_e + n/S beta_e, alpha_i + n/S beta_i) + n/S gamma, S
    segments of 512 KiB (1 where p <= 2): at step t ranks max(0, t-S+1)..min(t, p-2) pass a segment
    of their prefix on, and the receivers combine it with their own (the exscan's last rank does not)."""
    p = N * k
    if p == 1:
        return 0.0
    s = max(1, math.ceil(n / SCAN_SEGMENT_BYTES)) if p > 2 else 1
    total = 0.0
    for t in range(p + s - 2):
        lo, hi = max(0, t - s + 1), min(t, p - 2)
        crossing = N > 1 and lo + (k - 1 - lo % k) % k <= hi
        intra = k > 1 and (hi > lo or lo % k != k - 1)
        combines = not (exclusive and lo == hi == p - 2)
        total += _round(f, n / s, crossing, intra) + combines * n / s * f.gamma
    return total


@cache
def _doubling_scan_units(p: int, k: int, exclusive: bool) -> tuple[tuple[int, int, int], ...]:
    """Recursive doubling's rounds (whole vectors): rank r swaps with r ^ 2^j; it folds a lower
    partner's data into its result (an exscan's first one is copied) and into its group's reduction
    while a later round needs it."""
    units, has_result = [], [not exclusive] * p
    mask = 1
    while mask < p:
        pairs, reduced = [], 0
        for r in range(p):
            partner = r ^ mask
            if partner < p:
                pairs.append((r, partner, 1))
                combines = (partner < r and has_result[r]) + (mask << 1 < p)
                reduced = max(reduced, combines)
                if partner < r:
                    has_result[r] = True
        units.append((*_weighted_units(pairs, k), reduced))
        mask <<= 1
    return tuple(units)


def scan_ring(n: float, N: int, k: int, f: Fabric) -> float:
    """The pipelined chain (see _chain)."""
    return _chain(n, N, k, f, exclusive=False)


def exscan_ring(n: float, N: int, k: int, f: Fabric) -> float:
    """The pipelined chain, exclusive (see _chain)."""
    return _chain(n, N, k, f, exclusive=True)


def scan_recursive_doubling(n: float, N: int, k: int, f: Fabric) -> float:
    """sum over ceil(lg p) rounds of max(alpha_e + c_j n beta_e, alpha_i + n beta_i) + (1 or 2) n gamma."""
    return _rounds(f, n, _doubling_scan_units(N * k, k, False))


def exscan_recursive_doubling(n: float, N: int, k: int, f: Fabric) -> float:
    """As scan_recursive_doubling, a rank's first lower partner's data copied, not combined."""
    return _rounds(f, n, _doubling_scan_units(N * k, k, True))


def _scan_node_leader(n: float, N: int, k: int, f: Fabric, exclusive: bool) -> float:
    """scan(n, k) + exscan(n, N) + broadcast(n, k) + n gamma (+ n gamma for the exscan's node total
    and its combine, k > 1): the flat scan `auto` picks inside every node, the exclusive scan of the
    node totals across the N nodes' last ranks, the broadcast of that prefix from each node's last
    rank, and every rank's combine with its prefix in the node."""
    scans = _EXSCAN if exclusive else _SCAN
    inside = scans[flat_choice("scan", int(n), k)](n, 1, k, f) if k > 1 else 0.0
    if N == 1:
        return inside
    across = _EXSCAN[across_choice("scan", int(n), N)](n, N, 1, f)
    broadcast = _BROADCAST[flat_choice("broadcast", int(n), k)](n, 1, k, f) if k > 1 else 0.0
    combines = 2 * (k > 1) if exclusive else 1
    return inside + across + broadcast + combines * n * f.gamma


def scan_node_leader(n: float, N: int, k: int, f: Fabric) -> float:
    """See _scan_node_leader."""
    return _scan_node_leader(n, N, k, f, exclusive=False)


def exscan_node_leader(n: float, N: int, k: int, f: Fabric) -> float:
    """See _scan_node_leader."""
    return _scan_node_leader(n, N, k, f, exclusive=True)


Formula = Callable[[float, int, int, Fabric], float]
_ALLREDUCE: dict[str, Formula] = {
    "recursive_doubling": allreduce_recursive_doubling, "rabenseifner": allreduce_rabenseifner,
    "ring": allreduce_ring, "ring_pipelined": allreduce_ring_pipelined, "scattered": allreduce_scattered,
    "node_lanes": allreduce_node_lanes, "node_leader": allreduce_node_leader,
    "node_pipelined": allreduce_node_pipelined,
}
_BROADCAST: dict[str, Formula] = {"linear": broadcast_linear, "binomial": broadcast_binomial,
                                  "ring": broadcast_ring, "node_leader": broadcast_node_leader}
_REDUCE: dict[str, Formula] = {"binomial": reduce_binomial, "ring": reduce_ring, "scattered": reduce_scattered,
                               "node_leader": reduce_node_leader}
_GATHER: dict[str, Formula] = {"ring": gather_ring, "binomial": gather_binomial, "linear": gather_linear,
                               "node_leader": gather_node_leader}
_SCATTER: dict[str, Formula] = {"ring": scatter_ring, "binomial": scatter_binomial, "linear": scatter_linear,
                                "node_leader": scatter_node_leader}
_REDUCE_SCATTER: dict[str, Formula] = {
    "ring": reduce_scatter_ring, "ring_pipelined": reduce_scatter_ring_pipelined,
    "recursive_halving": reduce_scatter_recursive_halving, "scattered": reduce_scatter_scattered,
    "node_leader": reduce_scatter_node_leader,
}
_SCAN: dict[str, Formula] = {"ring": scan_ring, "recursive_doubling": scan_recursive_doubling,
                             "node_leader": scan_node_leader}
_EXSCAN: dict[str, Formula] = {"ring": exscan_ring, "recursive_doubling": exscan_recursive_doubling,
                               "node_leader": exscan_node_leader}

# (collective, algorithm) -> its closed form (n bytes, N nodes, k ranks per node, fabric) -> seconds
FORMULAS: dict[tuple[str, str], Formula] = {
    **{("allreduce", a): g for a, g in _ALLREDUCE.items()},
    **{("broadcast", a): g for a, g in _BROADCAST.items()},
    **{("reduce", a): g for a, g in _REDUCE.items()},
    **{("gather", a): g for a, g in _GATHER.items()},
    **{("scatter", a): g for a, g in _SCATTER.items()},
    **{("reduce_scatter", a): g for a, g in _REDUCE_SCATTER.items()},
    **{("scan", a): g for a, g in _SCAN.items()},
    **{("exscan", a): g for a, g in _EXSCAN.items()},
}


def algorithms(collective: str) -> list[str]:
    """The algorithms the model knows for `collective`, in mpiring's order."""
    return [a for c, a in FORMULAS if c == collective]


@lru_cache(maxsize=256)
def node_map(nodes: int, per_node: int) -> NodeMap:
    """N nodes of k ranks, in node order."""
    return NodeMap(tuple(tuple(range(i * per_node, (i + 1) * per_node)) for i in range(nodes)))


def auto_choice(collective: str, nbytes: int, nodes: int, per_node: int) -> str:
    """What `auto` runs (mpiring.selection) on `nodes` x `per_node` ranks in node order."""
    return selection.auto_choice(collective, nbytes, nodes * per_node, node_map(nodes, per_node))


def _check(collective: str, algorithm: str, nodes: int, per_node: int) -> None:
    if (collective, algorithm) not in FORMULAS:
        known = ", ".join(algorithms(collective)) or "none"
        raise ValueError(f"no model of {collective} {algorithm!r} (known: {known}, auto)")
    if nodes < 1 or per_node < 1:
        raise ValueError(f"nodes and per_node must be positive, got {nodes} and {per_node}")


def predict(collective: str, algorithm: str, nbytes: int, nodes: int, per_node: int, fabric: Fabric) -> float:
    """Seconds `algorithm` ("auto": what mpiring.selection picks) takes for `collective` of `nbytes`
    (per rank; the buffer for broadcast; the whole result for gather and scatter, split as
    numpy.array_split cuts it) on `nodes` x `per_node` ranks in node order, root 0."""
    if algorithm == "auto":
        algorithm = auto_choice(collective, nbytes, nodes, per_node)
    _check(collective, algorithm, nodes, per_node)
    return FORMULAS[(collective, algorithm)](float(nbytes), nodes, per_node, fabric)


def best(collective: str, nbytes: int, nodes: int, per_node: int, fabric: Fabric) -> tuple[str, float]:
    """The algorithm the model predicts fastest, and its seconds."""
    times = {a: predict(collective, a, nbytes, nodes, per_node, fabric) for a in algorithms(collective)}
    winner = min(times, key=times.__getitem__)
    return winner, times[winner]


# ---- the message pattern, message by message ----


@dataclass
class Round:
    """Messages in flight at once: (src, dst, bytes), and the bytes each rank reduces after them."""

    messages: list[tuple[int, int, int]] = field(default_factory=list)
    reduced: dict[int, int] = field(default_factory=dict)

    def reduce(self, rank: int, nbytes: int) -> None:
        self.reduced[rank] = self.reduced.get(rank, 0) + nbytes


Pattern = list[Round]


def _side_by_side(patterns: Iterable[Pattern]) -> Pattern:
    """Sub-rings running at once: their i-th rounds form one round."""
    merged: Pattern = []
    for pattern in patterns:
        for i, one in enumerate(pattern):
            if i == len(merged):
                merged.append(Round())
            merged[i].messages += one.messages
            for rank, nbytes in one.reduced.items():
                merged[i].reduce(rank, nbytes)
    return merged


def _chunk(bounds: Sequence[int], c: int, item: int) -> int:
    return (bounds[c + 1] - bounds[c]) * item


def _p_rs_ring(ranks: Sequence[int], bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    rounds = []
    for s in range(p - 1):
        one = Round()
        for r in range(p):
            size = _chunk(bounds, (r - 1 - s) % p, item)
            one.messages.append((ranks[r], ranks[(r + 1) % p], size))
            one.reduce(ranks[(r + 1) % p], size)
        rounds.append(one)
    return rounds


def _p_ag_ring(ranks: Sequence[int], bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    return [Round([(ranks[r], ranks[(r + 1) % p], _chunk(bounds, (r - s) % p, item)) for r in range(p)])
            for s in range(p - 1)]


def _p_rs_pipelined(ranks: Sequence[int], bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    if p == 1:
        return []
    per_segment = max(1, PIPELINE_SEGMENT_BYTES // item)
    queues = []  # each rank's messages in order: its chunks r-1, r-2, ..., r-(p-1) in segments
    for r in range(p):
        sizes = []
        for t in range(p - 1):
            length = bounds[(r - 1 - t) % p + 1] - bounds[(r - 1 - t) % p]
            sizes += [min(per_segment, length - lo) * item for lo in range(0, length, per_segment)]
        queues.append(sizes)
    rounds = []
    for i in range(max(len(q) for q in queues)):
        one = Round()
        for r, sizes in enumerate(queues):
            if i < len(sizes):
                one.messages.append((ranks[r], ranks[(r + 1) % p], sizes[i]))
                one.reduce(ranks[(r + 1) % p], sizes[i])
        rounds.append(one)
    return rounds


def _windows(p: int) -> list[range]:
    return [range(first, min(first + WINDOW, p)) for first in range(1, p, WINDOW)]


def _p_rs_scattered(ranks: Sequence[int], bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    rounds = [Round([(ranks[r], ranks[(r + s) % p], _chunk(bounds, (r + s) % p, item)) for r in range(p) for s in w])
              for w in _windows(p)]
    if rounds:
        for r in range(p):
            rounds[-1].reduce(ranks[r], (p - 1) * _chunk(bounds, r, item))
    return rounds


def _p_ag_scattered(ranks: Sequence[int], bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    return [Round([(ranks[r], ranks[(r + s) % p], _chunk(bounds, r, item)) for r in range(p) for s in w])
            for w in _windows(p)]


def _p_fold(ranks: Sequence[int], size: int, back: bool) -> Pattern:
    """The fold round before (even -> odd, reduced there) or after (odd -> even) the power-of-two stages."""
    _, extra = _fold(len(ranks))
    if not extra:
        return []
    one = Round()
    for i in range(extra):
        src, dst = (2 * i + 1, 2 * i) if back else (2 * i, 2 * i + 1)
        one.messages.append((ranks[src], ranks[dst], size))
        if not back:
            one.reduce(ranks[dst], size)
    return [one]


def _p_recursive_doubling(ranks: Sequence[int], count: int, item: int) -> Pattern:
    p2, extra = _fold(len(ranks))
    n = count * item
    rounds = _p_fold(ranks, n, back=False)
    mask = 1
    while mask < p2:
        one = Round()
        for v in range(p2):
            one.messages.append((ranks[_real(v, extra)], ranks[_real(v ^ mask, extra)], n))
            one.reduce(ranks[_real(v, extra)], n)
        rounds.append(one)
        mask <<= 1
    return rounds + _p_fold(ranks, n, back=True)


def _p_rabenseifner(ranks: Sequence[int], count: int, item: int) -> Pattern:
    p2, extra = _fold(len(ranks))
    vb = split_bounds(count, p2)
    rounds = _p_fold(ranks, count * item, back=False)
    window = {v: (0, p2) for v in range(p2)}
    mask = p2 >> 1
    while mask:  # halving: keep one half of the window, send the other
        one = Round()
        for v in range(p2):
            lo, hi = window[v]
            middle = lo + mask
            keep, give = ((lo, middle), (middle, hi)) if v < v ^ mask else ((middle, hi), (lo, middle))
            sent = (vb[give[1]] - vb[give[0]]) * item
            one.messages.append((ranks[_real(v, extra)], ranks[_real(v ^ mask, extra)], sent))
            one.reduce(ranks[_real(v, extra)], (vb[keep[1]] - vb[keep[0]]) * item)
            window[v] = keep
        rounds.append(one)
        mask >>= 1
    mask = 1
    while mask < p2:  # doubling: send the window held, receive the partner's
        one = Round()
        for v in range(p2):
            lo, hi = window[v]
            one.messages.append((ranks[_real(v, extra)], ranks[_real(v ^ mask, extra)], (vb[hi] - vb[lo]) * item))
        for v in range(p2):
            lo, hi = window[v]
            p_lo = lo + mask if v < v ^ mask else lo - mask
            window[v] = (min(lo, p_lo), max(hi, p_lo + (hi - lo)))
        rounds.append(one)
        mask <<= 1
    return rounds + _p_fold(ranks, count * item, back=True)


def _p_broadcast_binomial(ranks: Sequence[int], root: int, n: int) -> Pattern:
    p = len(ranks)
    hops = (p - 1).bit_length()
    return [Round([(ranks[(v + root) % p], ranks[(v + d + root) % p], n) for v in range(0, p - d, 2 * d)])
            for d in (1 << h for h in reversed(range(hops)))]


def _p_reduce_binomial(ranks: Sequence[int], root: int, n: int) -> Pattern:
    p = len(ranks)
    rounds = []
    for d in (1 << h for h in range((p - 1).bit_length())):
        one = Round()
        for v in range(d, p, 2 * d):
            one.messages.append((ranks[(v + root) % p], ranks[(v - d + root) % p], n))
            one.reduce(ranks[(v - d + root) % p], n)
        rounds.append(one)
    return rounds


def _p_broadcast_linear(ranks: Sequence[int], root: int, n: int) -> Pattern:
    p = len(ranks)
    return [Round([(ranks[root], ranks[(root + s) % p], n) for s in w]) for w in _windows(p)]


def _p_broadcast_ring(ranks: Sequence[int], root: int, count: int, item: int) -> Pattern:
    p = len(ranks)
    if p == 1:
        return []
    segments = segment_count(count * item, p)
    seg = split_bounds(count, segments)
    return [Round([(ranks[(q + root) % p], ranks[(q + 1 + root) % p], _chunk(seg, t - q, item))
                   for q in range(p - 1) if 0 <= t - q < segments])
            for t in range(segments + p - 2)]


def _p_gather_linear(ranks: Sequence[int], root: int, bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    return [Round([(ranks[(root + s) % p], ranks[root], _chunk(bounds, (root + s) % p, item)) for s in w])
            for w in _windows(p)]


def _p_gather_ring(ranks: Sequence[int], root: int, bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    return [Round([(ranks[(q + root) % p], ranks[(q + 1 + root) % p], _chunk(bounds, (q - s + root) % p, item))
                   for q in range(s + 1, p)])
            for s in range(p - 1)]


def _p_allreduce(algorithm: str, ranks: Sequence[int], count: int, item: int, k: int) -> Pattern:
    p = len(ranks)
    bounds = split_bounds(count, p)
    if algorithm == "ring":
        return _p_rs_ring(ranks, bounds, item) + _p_ag_ring(ranks, bounds, item)
    if algorithm == "ring_pipelined":
        return _p_rs_pipelined(ranks, bounds, item) + _p_ag_ring(ranks, bounds, item)
    if algorithm == "scattered":
        return _p_rs_scattered(ranks, bounds, item) + _p_ag_scattered(ranks, bounds, item)
    if algorithm == "recursive_doubling":
        return _p_recursive_doubling(ranks, count, item)
    if algorithm == "rabenseifner":
        return _p_rabenseifner(ranks, count, item)
    nodes = [ranks[i : i + k] for i in range(0, p, k)]
    if algorithm == "node_lanes":
        lane_bounds = split_bounds(count, k)
        lanes = [[node[j] for node in nodes] for j in range(k)]
        return (_side_by_side(_p_rs_ring(node, lane_bounds, item) for node in nodes)
                + _side_by_side(_p_allreduce(across_choice("allreduce", _chunk(lane_bounds, j, item), len(nodes)),
                                             lane, lane_bounds[j + 1] - lane_bounds[j], item, 1)
                                for j, lane in enumerate(lanes))
                + _side_by_side(_p_ag_ring(node, lane_bounds, item) for node in nodes))
    if algorithm == "node_pipelined":
        if len(nodes) == 1 or k == 1:
            return _p_allreduce("node_lanes", ranks, count, item, k)
        return _p_node_pipelined(nodes, count, item)
    if algorithm == "node_leader":
        n = count * item
        leaders = [node[0] for node in nodes]
        return (_side_by_side(_p_reduce_binomial(node, 0, n) for node in nodes)
                + _p_allreduce(across_choice("allreduce", n, len(nodes)), leaders, count, item, 1)
                + _side_by_side(_p_broadcast_binomial(node, 0, n) for node in nodes))
    raise ValueError(f"no pattern of allreduce {algorithm!r}")


def _p_node_pipelined(nodes: Sequence[Sequence[int]], count: int, item: int) -> Pattern:
    """Segment g's reduce-scatter from round g L, its lanes' ring all-reduce from (g+1) L, its
    all-gather from (g+2) L; phases that share a round run side by side."""
    k = len(nodes[0])
    lanes = [[node[j] for node in nodes] for j in range(k)]
    cuts = segment_bounds(count, item, k * len(nodes))
    slot = slot_steps(tuple(tuple(node) for node in nodes))
    rounds: Pattern = []

    def place(phase: Pattern, first: int) -> None:
        while len(rounds) < first + len(phase):
            rounds.append(Round())
        for i, one in enumerate(phase):
            rounds[first + i].messages += one.messages
            for rank, nbytes in one.reduced.items():
                rounds[first + i].reduce(rank, nbytes)

    for g in range(len(cuts) - 1):
        shares = split_bounds(cuts[g + 1] - cuts[g], k)
        place(_side_by_side(_p_rs_ring(node, shares, item) for node in nodes), g * slot)
        place(_side_by_side(_p_allreduce("ring", lane, shares[j + 1] - shares[j], item, 1)
                            for j, lane in enumerate(lanes)), (g + 1) * slot)
        place(_side_by_side(_p_ag_ring(node, shares, item) for node in nodes), (g + 2) * slot)
    return rounds


def _p_broadcast(algorithm: str, ranks: Sequence[int], root: int, count: int, item: int, k: int) -> Pattern:
    n = count * item
    if algorithm == "linear":
        return _p_broadcast_linear(ranks, root, n)
    if algorithm == "binomial":
        return _p_broadcast_binomial(ranks, root, n)
    if algorithm == "ring":
        return _p_broadcast_ring(ranks, root, count, item)
    if algorithm == "node_leader":
        nodes = [ranks[i : i + k] for i in range(0, len(ranks), k)]
        home = root // k
        reps = [node[root % k] if i == home else node[0] for i, node in enumerate(nodes)]
        across = _p_broadcast(across_choice("broadcast", n, len(nodes)), reps, home, count, item, 1)
        inside = _side_by_side(_p_broadcast(flat_choice("broadcast", n, k), node, node.index(rep), count, item, k)
                               for node, rep in zip(nodes, reps, strict=True))
        return across + inside
    raise ValueError(f"no pattern of broadcast {algorithm!r}")


def _p_reduce(algorithm: str, ranks: Sequence[int], root: int, count: int, item: int, k: int) -> Pattern:
    p, n = len(ranks), count * item
    bounds = split_bounds(count, p)
    if algorithm == "binomial":
        return _p_reduce_binomial(ranks, root, n)
    if algorithm == "ring":
        return _p_rs_ring(ranks, bounds, item) + _p_gather_ring(ranks, root, bounds, item)
    if algorithm == "scattered":
        return _p_rs_scattered(ranks, bounds, item) + _p_gather_linear(ranks, root, bounds, item)
    if algorithm == "node_leader":
        nodes = [ranks[i : i + k] for i in range(0, p, k)]
        home = root // k
        reps = [node[root % k] if i == home else node[0] for i, node in enumerate(nodes)]
        inside = _side_by_side(_p_reduce_binomial(node, node.index(rep), n) for node, rep in zip(nodes, reps,
                                                                                                  strict=True))
        return inside + _p_reduce(flat_choice("reduce", n, len(nodes)), reps, home, count, item, 1)
    raise ValueError(f"no pattern of reduce {algorithm!r}")


def _p_gather_binomial(ranks: Sequence[int], root: int, bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    offsets = [0]  # the blocks in root-relative order
    for j in range(p):
        offsets.append(offsets[-1] + _chunk(bounds, (root + j) % p, 1))
    return [Round([(ranks[(v + root) % p], ranks[(v - d + root) % p], (offsets[min(v + d, p)] - offsets[v]) * item)
                   for v in range(d, p, 2 * d)])
            for d in (1 << h for h in range((p - 1).bit_length()))]


def _p_scatter_binomial(ranks: Sequence[int], root: int, bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    offsets = [0]
    for j in range(p):
        offsets.append(offsets[-1] + _chunk(bounds, (root + j) % p, 1))
    return [Round([(ranks[(v + root) % p], ranks[(v + d + root) % p],
                    (offsets[min(v + 2 * d, p)] - offsets[v + d]) * item) for v in range(0, p - d, 2 * d)])
            for d in (1 << h for h in reversed(range((p - 1).bit_length())))]


def _p_scatter_linear(ranks: Sequence[int], root: int, bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    return [Round([(ranks[root], ranks[(root + s) % p], _chunk(bounds, (root + s) % p, item)) for s in w])
            for w in _windows(p)]


def _p_scatter_ring(ranks: Sequence[int], root: int, bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    return [Round([(ranks[(q + root) % p], ranks[(q + 1 + root) % p], _chunk(bounds, (q + p - 1 - t + root) % p, item))
                   for q in range(t + 1)])
            for t in range(p - 1)]


def _nodes_and_representatives(ranks: Sequence[int], root: int, k: int) -> tuple[list, list[int], int]:
    nodes = [list(ranks[i : i + k]) for i in range(0, len(ranks), k)]
    home = root // k
    return nodes, [node[root % k] if i == home else node[0] for i, node in enumerate(nodes)], home


def _node_bounds(node: Sequence[int], bounds: Sequence[int]) -> list[int]:
    """A node's blocks (its ranks consecutive) from 0."""
    return [bounds[r] - bounds[node[0]] for r in node] + [bounds[node[-1] + 1] - bounds[node[0]]]


def _p_gather(algorithm: str, ranks: Sequence[int], root: int, bounds: Sequence[int], item: int, k: int) -> Pattern:
    if algorithm == "linear":
        return _p_gather_linear(ranks, root, bounds, item)
    if algorithm == "binomial":
        return _p_gather_binomial(ranks, root, bounds, item)
    if algorithm == "ring":
        return _p_gather_ring(ranks, root, bounds, item)
    if algorithm == "node_leader":
        nodes, reps, home = _nodes_and_representatives(ranks, root, k)
        inside = _side_by_side(_p_gather(flat_choice("gather", local[-1] * item, k), node, 0, local, item, k)
                               for i, node, local in ((i, node, _node_bounds(node, bounds))
                                                      for i, node in enumerate(nodes)) if i != home)
        incoming = [(r, root, _chunk(bounds, r, item)) for r in nodes[home] if r != root]
        incoming += [(node[0], root, size) for i, node in enumerate(nodes)
                     if i != home and (size := (bounds[node[-1] + 1] - bounds[node[0]]) * item)]
        return inside + [Round(incoming[first : first + WINDOW]) for first in range(0, len(incoming), WINDOW)]
    raise ValueError(f"no pattern of gather {algorithm!r}")


def _p_scatter(algorithm: str, ranks: Sequence[int], root: int, bounds: Sequence[int], item: int, k: int) -> Pattern:
    if algorithm == "linear":
        return _p_scatter_linear(ranks, root, bounds, item)
    if algorithm == "binomial":
        return _p_scatter_binomial(ranks, root, bounds, item)
    if algorithm == "ring":
        return _p_scatter_ring(ranks, root, bounds, item)
    if algorithm == "node_leader":
        nodes, reps, home = _nodes_and_representatives(ranks, root, k)
        outgoing = [(root, r, _chunk(bounds, r, item)) for r in nodes[home] if r != root]
        outgoing += [(root, node[0], size) for i, node in enumerate(nodes)
                     if i != home and (size := (bounds[node[-1] + 1] - bounds[node[0]]) * item)]
        inside = _side_by_side(_p_scatter(flat_choice("scatter", local[-1] * item, k), node, 0, local, item, k)
                               for i, node, local in ((i, node, _node_bounds(node, bounds))
                                                      for i, node in enumerate(nodes)) if i != home)
        return [Round(outgoing[first : first + WINDOW]) for first in range(0, len(outgoing), WINDOW)] + inside
    raise ValueError(f"no pattern of scatter {algorithm!r}")


def _p_rs_halving(ranks: Sequence[int], count: int, bounds: Sequence[int], item: int) -> Pattern:
    p = len(ranks)
    p2, extra = _fold(p)
    first = [bounds[2 * v if v < extra else v + extra] for v in range(p2)] + [bounds[p]]
    rounds = _p_fold(ranks, count * item, back=False)
    window = {v: (0, p2) for v in range(p2)}
    mask = p2 >> 1
    while mask:
        one = Round()
        for v in range(p2):
            lo, hi = window[v]
            middle = lo + mask
            keep, give = ((lo, middle), (middle, hi)) if v < v ^ mask else ((middle, hi), (lo, middle))
            one.messages.append((ranks[_real(v, extra)], ranks[_real(v ^ mask, extra)],
                                 (first[give[1]] - first[give[0]]) * item))
            one.reduce(ranks[_real(v, extra)], (first[keep[1]] - first[keep[0]]) * item)
            window[v] = keep
        rounds.append(one)
        mask >>= 1
    if extra:
        rounds.append(Round([(ranks[2 * i + 1], ranks[2 * i], _chunk(bounds, 2 * i, item)) for i in range(extra)]))
    return rounds


def _p_reduce_scatter(algorithm: str, ranks: Sequence[int], count: int, bounds: Sequence[int], item: int,
                      k: int) -> Pattern:
    if algorithm == "ring":
        return _p_rs_ring(ranks, bounds, item)
    if algorithm == "ring_pipelined":
        return _p_rs_pipelined(ranks, bounds, item)
    if algorithm == "recursive_halving":
        return _p_rs_halving(ranks, count, bounds, item)
    if algorithm == "scattered":
        return _p_rs_scattered(ranks, bounds, item)
    if algorithm == "node_leader":
        n = count * item
        nodes, leaders, _ = _nodes_and_representatives(ranks, 0, k)
        node_bounds = [bounds[node[0]] - bounds[0] for node in nodes] + [bounds[-1] - bounds[0]]
        inside = _side_by_side(_p_reduce(flat_choice("reduce", n, k), node, 0, count, item, k) for node in nodes)
        across = _p_reduce_scatter(across_choice("reduce_scatter", n, len(nodes)), leaders, count, node_bounds, item,
                                   1)
        scatter = _side_by_side(_p_scatter(flat_choice("scatter", local[-1] * item, k), node, 0, local, item, k)
                                for node, local in ((node, _node_bounds(node, bounds)) for node in nodes))
        return inside + across + (scatter if k > 1 else [])
    raise ValueError(f"no pattern of reduce_scatter {algorithm!r}")


def _p_scan_chain(ranks: Sequence[int], count: int, item: int, exclusive: bool, takes_turns: bool) -> Pattern:
    p = len(ranks)
    if p == 1:
        return []
    parts = chain_segments(count, item, p, takes_turns)
    rounds = []
    for t in range(p + len(parts) - 2):
        one = Round()
        for r in range(max(0, t - len(parts) + 1), min(t, p - 2) + 1):
            lo, hi = parts[t - r]
            one.messages.append((ranks[r], ranks[r + 1], (hi - lo) * item))
            if not (exclusive and r + 1 == p - 1):
                one.reduce(ranks[r + 1], (hi - lo) * item)
        rounds.append(one)
    return rounds


def _p_scan_doubling(ranks: Sequence[int], n: int, exclusive: bool) -> Pattern:
    p = len(ranks)
    rounds, has_result = [], [not exclusive] * p
    mask = 1
    while mask < p:
        one = Round()
        for r in range(p):
            partner = r ^ mask
            if partner < p:
                one.messages.append((ranks[r], ranks[partner], n))
                one.reduce(ranks[r], n * ((partner < r and has_result[r]) + (mask << 1 < p)))
                has_result[r] = has_result[r] or partner < r
        rounds.append(one)
        mask <<= 1
    return rounds


def _p_scan(algorithm: str, ranks: Sequence[int], count: int, item: int, k: int, exclusive: bool,
            shared_cores: bool) -> Pattern:
    n = count * item
    if algorithm == "ring":  # its ranks take turns where they share one node's cores (Ring.takes_turns)
        one_node = all(r // k == ranks[0] // k for r in ranks)
        return _p_scan_chain(ranks, count, item, exclusive, shared_cores and one_node)
    if algorithm == "recursive_doubling":
        return _p_scan_doubling(ranks, n, exclusive)
    if algorithm == "node_leader":
        nodes = [list(ranks[i : i + k]) for i in range(0, len(ranks), k)]
        inside = _side_by_side(_p_scan(flat_choice("scan", n, k), node, count, item, k, exclusive, shared_cores)
                               for node in nodes)
        if len(nodes) == 1:
            return inside
        totals = [Round(reduced={node[-1]: n for node in nodes})] if exclusive and k > 1 else []
        across = _p_scan(across_choice("scan", n, len(nodes)), [node[-1] for node in nodes], count, item, 1, True,
                         shared_cores)
        broadcast = _side_by_side(_p_broadcast(flat_choice("broadcast", n, k), node, k - 1, count, item, k)
                                  for node in nodes[1:])
        combine = Round(reduced={r: n for node in nodes[1:] for r in node if not (exclusive and r == node[0])})
        return inside + totals + across + broadcast + [combine]
    raise ValueError(f"no pattern of {'exscan' if exclusive else 'scan'} {algorithm!r}")


def pattern(collective: str, algorithm: str, nbytes: int, nodes: int, per_node: int, itemsize: int = 8,
            root: int = 0, shared_cores: bool = False) -> Pattern:
    """Every message of every round, as mpiring sends them for `nbytes` of `itemsize`-byte items
    (per rank; the buffer for broadcast; in all for gather and scatter) on `nodes` x `per_node` ranks in
    node order; `shared_cores`: each node has fewer cores than ranks (the model's times assume a
    core per rank; the chain scan then sends one segment inside a node)."""
    if algorithm == "auto":
        algorithm = auto_choice(collective, nbytes, nodes, per_node)
    _check(collective, algorithm, nodes, per_node)
    if nbytes % itemsize:
        raise ValueError(f"{nbytes} bytes is not a whole number of {itemsize}-byte items")
    ranks, count = list(range(nodes * per_node)), nbytes // itemsize
    if collective == "allreduce":
        return _p_allreduce(algorithm, ranks, count, itemsize, per_node)
    if collective == "broadcast":
        return _p_broadcast(algorithm, ranks, root, count, itemsize, per_node)
    if collective == "reduce":
        return _p_reduce(algorithm, ranks, root, count, itemsize, per_node)
    bounds = split_bounds(count, len(ranks))
    if collective == "gather":
        return _p_gather(algorithm, ranks, root, bounds, itemsize, per_node)
    if collective == "scatter":
        return _p_scatter(algorithm, ranks, root, bounds, itemsize, per_node)
    if collective == "reduce_scatter":
        return _p_reduce_scatter(algorithm, ranks, count, bounds, itemsize, per_node)
    return _p_scan(algorithm, ranks, count, itemsize, per_node, collective == "exscan", shared_cores)


def bytes_sent(collective: str, algorithm: str, nbytes: int, nodes: int, per_node: int, rank: int,
               itemsize: int = 8, root: int = 0, shared_cores: bool = False) -> tuple[int, int]:
    """(bytes, messages) `rank` hands to MPI in one call: what mpiring's `comm.traffic` counts."""
    sent = [size for one in pattern(collective, algorithm, nbytes, nodes, per_node, itemsize, root, shared_cores)
            for src, _, size in one.messages if src == rank]
    return sum(sent), len(sent)


def bytes_crossing(collective: str, algorithm: str, nbytes: int, nodes: int, per_node: int,
                   itemsize: int = 8) -> int:
    """Bytes that leave node 0 in one call."""
    k = per_node
    return sum(size for one in pattern(collective, algorithm, nbytes, nodes, per_node, itemsize)
               for src, dst, size in one.messages if src // k == 0 != dst // k)


def simulate(rounds: Pattern, per_node: int, fabric: Fabric) -> float:
    """Seconds of a pattern by the round rule (module docstring), message by message."""
    k, total = per_node, 0.0
    for one in rounds:
        node_bytes: dict[tuple[str, int], int] = {}
        rank_bytes: dict[int, int] = {}
        for src, dst, size in one.messages:
            if src // k != dst // k:
                for key in (("out", src // k), ("in", dst // k)):
                    node_bytes[key] = node_bytes.get(key, 0) + size
            else:
                rank_bytes[dst] = rank_bytes.get(dst, 0) + size
        across = fabric.inter.time(max(node_bytes.values())) if node_bytes else 0.0
        inside = fabric.intra.time(max(rank_bytes.values())) if rank_bytes else 0.0
        total += max(across, inside) + fabric.gamma * max(one.reduced.values(), default=0)
    return total


# ---- calibration ----

CALIBRATION_SIZES = tuple(8 << (3 * i) for i in range(7)) + (4 << 20,)  # 8 B, 64 B, ..., 2 MiB, 4 MiB


def _fit(sizes: Sequence[int], seconds: Sequence[float]) -> Link:
    """alpha from the smallest message, beta from the slope between the two largest: the link's
    sustained rate. A least-squares line through every size would take its slope from the middle
    sizes too, which a shaped or switched link passes in a burst at a higher rate (a token bucket's
    burst, a switch's buffers), and underestimate what large collectives pay."""
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    small, second, large = order[0], order[-2], order[-1]
    slope = (seconds[large] - seconds[second]) / (sizes[large] - sizes[second])
    beta = float(slope) if slope > 0 else float(seconds[large]) / sizes[large]
    return Link(max(float(seconds[small]) - beta * sizes[small], 1e-9), beta)


def _ping_pong(comm: Any, pair: tuple[int, int], sizes: Sequence[int], repeats: int) -> list[float]:
    """Half the best round trip between the pair for each size (collective: the others wait)."""
    import numpy

    rank, (a, b) = comm.Get_rank(), pair
    times = []
    for size in sizes:
        buf = numpy.zeros(size, numpy.uint8)
        best_time = math.inf
        comm.Barrier()
        if rank in pair:
            other = b if rank == a else a
            for _ in range(max(2, repeats if size <= 1 << 16 else repeats // 4)):
                start = time.perf_counter()
                if rank == a:
                    comm.Send(buf, other, 7)
                    comm.Recv(buf, other, 7)
                else:
                    comm.Recv(buf, other, 7)
                    comm.Send(buf, other, 7)
                best_time = min(best_time, (time.perf_counter() - start) / 2)
        times.append(comm.bcast(best_time, root=a))
    return times


def _gamma(nbytes: int = 32 << 20, repeats: int = 5) -> float:
    """Seconds per byte reduced: numpy.add of two float64 arrays of `nbytes`, into the first."""
    import numpy

    a, b = numpy.ones(nbytes // 8), numpy.ones(nbytes // 8)
    best_time = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        numpy.add(a, b, out=a)
        best_time = min(best_time, time.perf_counter() - start)
    return best_time / nbytes


def calibrate(comm: Any = None, out: str | os.PathLike | None = None, sizes: Sequence[int] = CALIBRATION_SIZES,
              repeats: int = 20) -> Fabric:
    """Collective over an mpiring.Communicator or mpi4py intracommunicator (default COMM_WORLD):
    ping-pong between two ranks of one node and two of different nodes, fit alpha and beta per
    link class, time numpy.add for gamma. Every rank returns the fabric; rank 0 saves it to `out`
    (default: default_path()). One node: inter = intra; one rank per node: intra = inter."""
    from mpi4py import MPI

    from mpiring import topology

    if comm is None:
        comm = MPI.COMM_WORLD
    base = comm.mpi if hasattr(comm, "mpi") else comm
    if base.Get_size() < 2:
        raise ValueError("calibrate needs at least two ranks (a ping-pong)")
    mine = base.Dup()
    try:
        nodes = comm._ring.nodes if hasattr(comm, "_ring") else topology.discover(mine)[0]
        shared = next((node for node in nodes.nodes if len(node) > 1), None)
        intra_pair = (shared[0], shared[1]) if shared else None
        inter_pair = (nodes.leaders[0], nodes.leaders[1]) if len(nodes.nodes) > 1 else None
        intra = _fit(sizes, _ping_pong(mine, intra_pair, sizes, repeats)) if intra_pair else None
        inter = _fit(sizes, _ping_pong(mine, inter_pair, sizes, repeats)) if inter_pair else None
        gamma = mine.bcast(_gamma() if mine.Get_rank() == 0 else None, root=0)
    finally:
        mine.Free()
    fabric = Fabric(intra or inter, inter or intra, gamma, f"calibrated: {nodes.describe()}")
    if base.Get_rank() == 0:
        fabric.save(default_path() if out is None else out)
    return fabric


# ---- command line ----

_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'64K' -> 65536; plain numbers are bytes."""
    text = text.strip().upper().removesuffix("B")
    number, suffix = (text[:-1], text[-1]) if text and text[-1] in _SUFFIXES else (text, "")
    return int(float(number) * _SUFFIXES[suffix])


def format_size(nbytes: int) -> str:
    for suffix in ("G", "M", "K"):
        if nbytes >= _SUFFIXES[suffix] and nbytes % _SUFFIXES[suffix] == 0:
            return f"{nbytes // _SUFFIXES[suffix]}{suffix}"
    return str(nbytes)


def _sizes(first: int, last: int, factor: int) -> list[int]:
    """first, first x factor, ... up to last, and last itself."""
    sizes = [first]
    while sizes[-1] * factor <= last:
        sizes.append(sizes[-1] * factor)
    return sizes if sizes[-1] == last or last < first else [*sizes, last]


def predict_table(collective: str, nodes: int, per_node: int, fabric: Fabric, sizes: Sequence[int]) -> str:
    """A markdown table: each size's predicted microseconds per algorithm, the best, auto's pick."""
    names = algorithms(collective)
    lines = [f"| size | {' | '.join(names)} | best | auto |", "|" + " --- |" * (len(names) + 3)]
    for size in sizes:
        times = [predict(collective, a, size, nodes, per_node, fabric) * 1e6 for a in names]
        winner, _ = best(collective, size, nodes, per_node, fabric)
        auto = auto_choice(collective, size, nodes, per_node)
        lines.append(f"| {format_size(size)} | " + " | ".join(f"{t:,.1f}" for t in times) + f" | {winner} | {auto} |")
    return "\n".join(lines)


def project_tables(collective: str, fabric: Fabric, per_node: int, node_counts: Sequence[int],
                   sizes: Sequence[int]) -> str:
    """Markdown: which algorithm the model picks at each node count and size; for allreduce also
    node_lanes' speed-up over the flat ring and over auto's flat choice."""
    head = f"| nodes x {per_node} | " + " | ".join(format_size(s) for s in sizes) + " |"
    rule = "|" + " --- |" * (len(sizes) + 1)
    winners = [f"{collective}: the model's fastest algorithm", "", head, rule]
    for n in node_counts:
        winners.append(f"| {n} | " + " | ".join(best(collective, s, n, per_node, fabric)[0] for s in sizes) + " |")
    if collective != "allreduce":
        return "\n".join(winners)
    lanes = ["", "allreduce: node_lanes' predicted speed-up over the flat ring (and over the flat algorithm "
             "auto picks on one node of that many ranks)", "", head, rule]
    for n in node_counts:
        cells = []
        for s in sizes:
            mine = predict("allreduce", "node_lanes", s, n, per_node, fabric)
            ring = predict("allreduce", "ring", s, n, per_node, fabric)
            flat = predict("allreduce", flat_choice("allreduce", s, n * per_node), s, n, per_node, fabric)
            cells.append(f"{ring / mine:.2f} ({flat / mine:.2f})")
        lanes.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(winners + lanes)


def _fabric_or_explain(spec: str | None) -> Fabric:
    try:
        return load_fabric(spec)
    except FileNotFoundError as error:
        raise SystemExit(f"no fabric at {error.filename}: run `python -m mpiring.cost_model calibrate` under mpirun, "
                         f"or name one of {', '.join(FABRICS)}") from None


def switch_points(nodes: int, per_node: int, fabric: Fabric, sizes: Sequence[int]) -> dict:
    """`auto`'s rows from the model: per collective, the algorithm it predicts fastest at each of
    `sizes` on `nodes` x `per_node` ranks, as a MPIRING_SWITCH_POINTS file's node-aware table (or,
    on one rank per node, its table across nodes, of flat algorithms), consecutive sizes with the
    same winner joined into one row, the last row open."""
    hierarchical = node_map(nodes, per_node).hierarchical
    tables: dict[str, list[list]] = {}
    for collective in COLLECTIVES:
        candidates = [a for a in algorithms(collective) if hierarchical or not a.startswith("node_")]
        rows: list[list] = []
        for size in sorted(sizes):
            winner = min(candidates, key=lambda a, size=size: predict(collective, a, size, nodes, per_node, fabric))
            if rows and rows[-1][1] == winner:
                rows[-1][0] = size
            else:
                rows.append([size, winner])
        rows[-1][0] = None
        tables[collective] = rows
    return {"node_switch_points" if hierarchical else "across_nodes_switch_points": tables}


def main(argv: list[str] | None = None) -> int:
    from mpiring import __version__

    parser = argparse.ArgumentParser(prog="python -m mpiring.cost_model",
                                     description="mpiring's alpha-beta cost model (docs/cost-model.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    cal = sub.add_parser("calibrate", help="fit a fabric by ping-pong (run under mpirun, across nodes)")
    cal.add_argument("--out", help=f"where to save it (default ${FABRIC_VARIABLE}, else ~/.cache/mpiring/fabric.json)")
    pre = sub.add_parser("predict", help="each algorithm's predicted time by size")
    pro = sub.add_parser("project", help="which algorithm wins at 16..1024 nodes on a fabric")
    swi = sub.add_parser("switch-points", help="auto's rows from the model, as a MPIRING_SWITCH_POINTS file")
    swi.add_argument("--fabric", help=f"a JSON file or one of {', '.join(FABRICS)} (default: the calibrated one)")
    swi.add_argument("--nodes", type=int, default=2)
    swi.add_argument("--per-node", type=int, default=2)
    swi.add_argument("--out", help="the file to write (default: print it)")
    for one in (pre, pro):
        one.add_argument("-c", "--collective", choices=COLLECTIVES, default="allreduce")
        one.add_argument("--fabric", help=f"a JSON file or one of {', '.join(FABRICS)} (default: the calibrated one)")
        one.add_argument("--per-node", type=int, default=2 if one is pre else 8)
    pre.add_argument("--nodes", type=int, default=2)
    pre.add_argument("-b", "--begin", type=parse_size, default=8, help="smallest size (bytes, K, M)")
    pre.add_argument("-e", "--end", type=parse_size, default=64 << 20, help="largest size")
    pre.add_argument("-f", "--factor", type=int, default=4, help="step between sizes")
    pro.add_argument("--nodes", type=int, nargs=2, default=(16, 1024), metavar=("FIRST", "LAST"),
                     help="node counts, doubling (default 16 1024)")
    pro.add_argument("--sizes", type=parse_size, nargs="+", default=[8, 1 << 10, 64 << 10, 1 << 20, 16 << 20,
                                                                     256 << 20])
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        fabric = calibrate(out=args.out)
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"{fabric.name}: intra alpha {fabric.intra.alpha * 1e6:.2f} us, {1e-9 / fabric.intra.beta:.2f} GB/s; "
                  f"inter alpha {fabric.inter.alpha * 1e6:.2f} us, {1e-9 / fabric.inter.beta:.2f} GB/s; "
                  f"gamma {1e-9 / fabric.gamma:.2f} GB/s reduced; saved to {args.out or default_path()}")
        return 0
    fabric = _fabric_or_explain(args.fabric)
    if args.command == "switch-points":
        text = json.dumps(switch_points(args.nodes, args.per_node, fabric, _sizes(8, 256 << 20, 2)), indent=1)
        if args.out:
            Path(args.out).write_text(text + "\n")
        else:
            print(text)
        return 0
    if args.command == "predict":
        print(f"mpiring {__version__}: {args.collective}, {args.nodes} nodes x {args.per_node} ranks, fabric "
              f"{fabric.name or args.fabric}; predicted microseconds")
        print(predict_table(args.collective, args.nodes, args.per_node, fabric,
                            _sizes(args.begin, args.end, args.factor)))
        return 0
    counts = _sizes(args.nodes[0], args.nodes[1], 2)
    print(f"mpiring {__version__}: fabric {fabric.name or args.fabric}, {args.per_node} ranks per node\n")
    print(project_tables(args.collective, fabric, args.per_node, counts, args.sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
