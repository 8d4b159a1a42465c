"""Every message of every round, with the exact element split mpiring makes: `pattern` lists
them, `bytes_sent` and `bytes_crossing` add them up (tests compare those with mpiring's own
traffic counters), and `simulate` applies the round rule to them message by message (tests
compare that with the closed forms)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mpiring.algorithms.allreduce_node_pipelined import segment_bounds, slot_steps
from mpiring.algorithms.broadcast_ring import segment_count
from mpiring.algorithms.reduce_scatter_ring_pipelined import SEGMENT_BYTES as PIPELINE_SEGMENT_BYTES
from mpiring.algorithms.scan_ring import chain_segments
from mpiring.cost_model.fabric import Fabric
from mpiring.cost_model.formulas import auto_choice, check_case, fold, real_rank
from mpiring.engine.partition import split_bounds
from mpiring.engine.transport import WINDOW
from mpiring.selection import across_choice, flat_choice


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
    _, extra = fold(len(ranks))
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
    p2, extra = fold(len(ranks))
    n = count * item
    rounds = _p_fold(ranks, n, back=False)
    mask = 1
    while mask < p2:
        one = Round()
        for v in range(p2):
            one.messages.append((ranks[real_rank(v, extra)], ranks[real_rank(v ^ mask, extra)], n))
            one.reduce(ranks[real_rank(v, extra)], n)
        rounds.append(one)
        mask <<= 1
    return rounds + _p_fold(ranks, n, back=True)


def _p_rabenseifner(ranks: Sequence[int], count: int, item: int) -> Pattern:
    p2, extra = fold(len(ranks))
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
            one.messages.append((ranks[real_rank(v, extra)], ranks[real_rank(v ^ mask, extra)], sent))
            one.reduce(ranks[real_rank(v, extra)], (vb[keep[1]] - vb[keep[0]]) * item)
            window[v] = keep
        rounds.append(one)
        mask >>= 1
    mask = 1
    while mask < p2:  # doubling: send the window held, receive the partner's
        one = Round()
        for v in range(p2):
            lo, hi = window[v]
            one.messages.append((ranks[real_rank(v, extra)], ranks[real_rank(v ^ mask, extra)],
                                 (vb[hi] - vb[lo]) * item))
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
    p2, extra = fold(p)
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
            one.messages.append((ranks[real_rank(v, extra)], ranks[real_rank(v ^ mask, extra)],
                                 (first[give[1]] - first[give[0]]) * item))
            one.reduce(ranks[real_rank(v, extra)], (first[keep[1]] - first[keep[0]]) * item)
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
    check_case(collective, algorithm, nodes, per_node)
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
    """Seconds of a pattern by the round rule (the package's docstring), message by message."""
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
