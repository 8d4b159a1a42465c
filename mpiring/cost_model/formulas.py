"""The closed forms: one small function per algorithm, its formula in its docstring, built on the
round rule (the package's docstring) in units of one message size; `predict` and `best` over them,
and `auto_choice`, what mpiring.selection runs on a node map in node order."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import cache, lru_cache

from mpiring import selection
from mpiring.algorithms.allreduce_node_pipelined import segment_bounds
from mpiring.algorithms.broadcast_ring import segment_count
from mpiring.algorithms.reduce_scatter_ring_pipelined import SEGMENT_BYTES as PIPELINE_SEGMENT_BYTES
from mpiring.algorithms.scan_ring import SEGMENT_BYTES as SCAN_SEGMENT_BYTES
from mpiring.cost_model.fabric import Fabric
from mpiring.engine.transport import WINDOW
from mpiring.selection import across_choice, flat_choice
from mpiring.topology import NodeMap

COLLECTIVES = ("allreduce", "broadcast", "reduce", "gather", "scatter", "reduce_scatter", "scan", "exscan")

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


def fold(p: int) -> tuple[int, int]:
    """(p2, extra): the largest power of two <= p and the ranks beyond it (power_of_two.Fold)."""
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def real_rank(v: int, extra: int) -> int:
    """The rank that virtual rank v of the folded power-of-two world stands for."""
    return 2 * v + 1 if v < extra else v + extra


@cache
def _fold_units(p: int, k: int) -> tuple[int, int]:
    """Units of the fold round (each even rank below 2 extra hands its vector to the odd rank after it)."""
    _, extra = fold(p)
    return _units(((2 * i, 2 * i + 1) for i in range(extra)), k)


@cache
def _exchange_units(p: int, k: int, mask: int) -> tuple[int, int]:
    """Units of a halving or doubling round: virtual rank v and v ^ mask swap."""
    p2, extra = fold(p)
    return _units(((real_rank(v, extra), real_rank(v ^ mask, extra)) for v in range(p2)), k)


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
    p2, extra = fold(p)
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
    p2, extra = fold(p)
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
    p2, extra = fold(p)
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
            pairs.append((real_rank(v, extra), real_rank(v ^ mask, extra), first[give[1]] - first[give[0]]))
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


def check_case(collective: str, algorithm: str, nodes: int, per_node: int) -> None:
    """Raise ValueError unless the model knows `algorithm` of `collective` and the shape is real."""
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
    check_case(collective, algorithm, nodes, per_node)
    return FORMULAS[(collective, algorithm)](float(nbytes), nodes, per_node, fabric)


def best(collective: str, nbytes: int, nodes: int, per_node: int, fabric: Fabric) -> tuple[str, float]:
    """The algorithm the model predicts fastest, and its seconds."""
    times = {a: predict(collective, a, nbytes, nodes, per_node, fabric) for a in algorithms(collective)}
    winner = min(times, key=times.__getitem__)
    return winner, times[winner]
