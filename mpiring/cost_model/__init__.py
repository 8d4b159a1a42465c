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

    fabric.py        Link, Fabric, the published FABRICS, load_fabric
    formulas.py      the round rule and the closed forms; predict, best, auto_choice
    patterns.py      pattern, bytes_sent, bytes_crossing, simulate
    calibration.py   calibrate
    command_line.py  python -m mpiring.cost_model
"""

from mpiring.cost_model.calibration import CALIBRATION_SIZES, calibrate
from mpiring.cost_model.command_line import main, switch_points
from mpiring.cost_model.fabric import FABRIC_VARIABLE, FABRICS, Fabric, Link, default_path, load_fabric
from mpiring.cost_model.formulas import COLLECTIVES, FORMULAS, algorithms, auto_choice, best, predict
from mpiring.cost_model.patterns import Round, bytes_crossing, bytes_sent, pattern, simulate

__all__ = [
    "CALIBRATION_SIZES", "COLLECTIVES", "FABRICS", "FABRIC_VARIABLE", "FORMULAS", "Fabric", "Link", "Round",
    "algorithms", "auto_choice", "best", "bytes_crossing", "bytes_sent", "calibrate", "default_path",
    "load_fabric", "main", "pattern", "predict", "simulate", "switch_points",
]
