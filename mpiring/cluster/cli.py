"""`mpiring cluster` (also `python -m mpiring.cluster`): bring an emulated cluster up, run MPI jobs
on it, show its link counters, take it down. See mpiring/cluster/__init__.py and docs/cluster.md.

    mpiring cluster up --nodes 2 --rate 1gbit
    mpiring cluster run --ranks-per-node 2 -- python -m mpiring.cluster.check
    mpiring cluster status
    mpiring cluster down
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from mpiring.cluster import network
from mpiring.cluster.network import ClusterError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands, on `parser` (the `cluster` subcommand of `mpiring`, or python -m mpiring.cluster)."""
    sub = parser.add_subparsers(dest="action", required=True)

    def with_prefix(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--prefix", default=network.DEFAULT_PREFIX,
                       help=f"names of the namespaces (<prefix>-node<i>) and links (default {network.DEFAULT_PREFIX})")
        return p

    up = with_prefix(sub.add_parser("up", help="make the nodes, links and shaping (idempotent; needs root)"))
    up.add_argument("--nodes", type=int, default=2, help="how many nodes (default 2)")
    up.add_argument("--rate", default="1gbit",
                    help="each link's rate both ways, as tc writes it (1gbit, 100mbit, ...) or 'none' (default 1gbit)")
    up.add_argument("--subnet", default=network.DEFAULT_SUBNET,
                    help=f"the private /24 between the nodes (default {network.DEFAULT_SUBNET})")
    with_prefix(sub.add_parser("down", help="remove the nodes and links (processes left on them are killed)"))
    status = with_prefix(sub.add_parser("status", help="the nodes and their links' TX/RX byte counters"))
    status.add_argument("--json", action="store_true", help="as JSON")
    run = with_prefix(sub.add_parser("run", help="run an MPI job across the nodes: run --ranks-per-node K -- CMD..."))
    run.add_argument("--ranks-per-node", "-k", type=int, required=True, help="ranks on each node (node0 gets 0..K-1)")
    run.add_argument("--mpi", choices=["mpich", "openmpi"], help="default: the MPI that mpi4py loads")
    run.add_argument("--timeout", type=float, default=600, help="seconds before the whole job is killed (default 600)")
    # dest "job", not "command": `mpiring`'s own parser keeps its subcommand in args.command
    run.add_argument("job", metavar="command", nargs=argparse.REMAINDER, help="the command of every rank (after --)")


def run_action(args: argparse.Namespace) -> int:
    """Carry out a parsed `cluster` command; its exit code."""
    from mpiring.cluster.runner import run_job

    try:
        if args.action == "up":
            rate = None if args.rate.lower() in ("none", "0", "off") else args.rate
            topology = network.up(network.Topology(args.nodes, args.prefix, args.subnet), rate)
            print(network.format_status(topology, network.status(topology)))
        elif args.action == "down":
            removed = network.down(args.prefix)
            print(f"removed {', '.join(removed)}" if removed else f"no emulated cluster {args.prefix!r} was up")
        elif args.action == "status":
            topology = network.find(args.prefix)
            nodes = network.status(topology)
            if args.json:
                print(json.dumps({"prefix": topology.prefix, "subnet": topology.subnet, "bridge": topology.bridge,
                                  "nodes": [asdict(node) for node in nodes]}, indent=2))
            else:
                print(network.format_status(topology, nodes))
        else:
            command = args.job[1:] if args.job[:1] == ["--"] else args.job
            if not command:
                print("mpiring cluster run: give the command after --", file=sys.stderr)
                return 2
            topology = network.find(args.prefix)
            code, _ = run_job(topology, args.ranks_per_node, command, mpi=args.mpi, timeout=args.timeout, echo=True)
            return code
    except ClusterError as error:
        print(f"mpiring cluster {args.action}: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpiring.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_action(parser.parse_args(argv))
