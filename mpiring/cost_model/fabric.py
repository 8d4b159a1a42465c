"""Fabrics, what a prediction runs on: `alpha` seconds per message and `beta` per byte for the links
inside a node and between nodes, and `gamma` per byte reduced; the published ones (FABRICS) and
where a calibrated one is kept (default_path)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpiring import environment

FABRIC_VARIABLE = "MPIRING_FABRIC"


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
