"""`python -m mpiring.cost_model` (also `mpiring model`): calibrate, predict, project and
switch-points (docs/cost-model.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from mpiring.cost_model.calibration import calibrate
from mpiring.cost_model.fabric import FABRIC_VARIABLE, FABRICS, Fabric, default_path, load_fabric
from mpiring.cost_model.formulas import COLLECTIVES, algorithms, auto_choice, best, node_map, predict
from mpiring.selection import flat_choice

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
