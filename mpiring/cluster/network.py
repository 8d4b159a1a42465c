"""The emulated cluster's network: namespaces, veth pairs, the bridge, token-bucket shaping, counters.

Everything here is found again from the system by its names (the prefix), so `up`, `run`,
`status` and `down` can be separate commands: nodes are the namespaces `<prefix>-node<i>`, the
subnet is the bridge's address, the rate is the tbf qdisc's.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_PREFIX = "mpr"
DEFAULT_SUBNET = "10.77.0.0/24"
NODE_INTERFACE = "eth0"  # each node's end of its veth pair, inside its namespace
MAX_NODES = 64
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # short: "<prefix>-v63" must fit IFNAMSIZ (15)
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$", re.I)
_RATE_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
TBF_LATENCY = "100ms"


class ClusterError(RuntimeError):
    """The emulated cluster cannot be made, found or used here; the message says why."""


@dataclass(frozen=True)
class LinkCounters:
    """Bytes a node's interface has sent (tx) and received (rx) since its cluster came up."""

    tx: int
    rx: int

    def __sub__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(self.tx - other.tx, self.rx - other.rx)


@dataclass(frozen=True)
class NodeStatus:
    """One node as `status` shows it."""

    name: str  # its host name, also the host name the launchers are given
    namespace: str
    address: str
    rate: str | None  # the tbf rate on its interface, None when unshaped
    counters: LinkCounters


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate such as '1gbit', '100mbit' or '125mbps' (bytes)."""
    match = _RATE.match(rate.strip())
    if not match:
        raise ClusterError(f"rate {rate!r}: give a number and a tc unit, e.g. 1gbit, 100mbit, 10gbit, 125mbps")
    bits = float(match[1]) * _RATE_BITS[match[2].lower()]
    if bits < 8e3:
        raise ClusterError(f"rate {rate!r} is below 1 kB/s")
    return bits


def tbf_burst(bits_per_s: float) -> int:
    """A tbf bucket of 2 ms of traffic (at least 32 KiB): large enough that the kernel's timer
    granularity does not cap the rate, small enough that the shaping shows within a message."""
    return max(32 * 1024, int(bits_per_s / 8 * 0.002))


def _ip(*args: str, check: bool = True, namespace: str | None = None) -> subprocess.CompletedProcess[str]:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(command)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc


def _tc(*args: str, namespace: str | None = None) -> None:
    command = ["tc", *(["-n", namespace] if namespace else []), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(command)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")


def missing_requirements() -> str | None:
    """Why the cluster cannot be made here without trying (not root, a tool missing), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces, veth pairs, a bridge, tc)"
    tools = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if tools:
        return (f"{', '.join(tools)} not found: install iproute2 (ip, tc) and util-linux (unshare), "
                f"e.g. apt-get install -y iproute2")
    return None


def available() -> tuple[bool, str]:
    """Whether an emulated cluster can be made here: root, iproute2, and a network namespace and a
    veth pair that can really be made (a container may forbid them). (True, "") or (False, why)."""
    reason = missing_requirements()
    if reason:
        return False, reason
    probe = f"mprprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"cannot make a network namespace (ip netns add): {made.stderr.strip()}"
    try:
        veth = _ip("link", "add", probe[:15], "type", "veth", "peer", "name", NODE_INTERFACE, "netns", probe,
                   check=False)
        if veth.returncode != 0:
            return False, f"cannot make a veth pair: {veth.stderr.strip()}"
        _ip("link", "del", probe[:15], check=False)
    finally:
        _ip("netns", "del", probe, check=False)
    return True, ""


@dataclass(frozen=True)
class Topology:
    """The names and addresses of one emulated cluster: `nodes` nodes under `prefix` on `subnet`."""

    nodes: int
    prefix: str = DEFAULT_PREFIX
    subnet: str = DEFAULT_SUBNET

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ClusterError(f"prefix {self.prefix!r}: 1-8 lower-case letters and digits, starting with a letter")
        if not 1 <= self.nodes <= MAX_NODES:
            raise ClusterError(f"nodes must be 1..{MAX_NODES}, not {self.nodes}")
        try:
            network = ipaddress.IPv4Network(self.subnet)
        except ValueError as error:
            raise ClusterError(f"subnet {self.subnet!r}: {error}") from None
        if network.prefixlen != 24 or not network.is_private:
            raise ClusterError(f"subnet {self.subnet}: give a private /24 such as {DEFAULT_SUBNET}")
        object.__setattr__(self, "subnet", str(network))

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def bridge_address(self) -> str:
        return str(self.network.network_address + 254)

    def node_name(self, index: int) -> str:
        """The node's host name (letters, digits and '-' only: `hostname` refuses '_')."""
        return f"node{index}"

    def namespace(self, index: int) -> str:
        return f"{self.prefix}-node{index}"

    def veth(self, index: int) -> str:
        """The bridge-side end of the node's veth pair, in the root namespace."""
        return f"{self.prefix}-v{index}"

    def address(self, index: int) -> str:
        return str(self.network.network_address + index + 1)

    def hosts(self) -> dict[str, str]:
        """Host name -> namespace, for the launch helper."""
        return {self.node_name(i): self.namespace(i) for i in range(self.nodes)}


def existing_nodes(prefix: str) -> list[int]:
    """The indices of the namespaces `<prefix>-node<i>` that exist, in order."""
    proc = _ip("netns", "list", check=False)
    found = []
    for line in proc.stdout.splitlines():
        match = re.match(rf"^{re.escape(prefix)}-node(\d+)\b", line.strip())
        if match:
            found.append(int(match[1]))
    return sorted(found)


def find(prefix: str = DEFAULT_PREFIX) -> Topology:
    """The cluster that `up` made under `prefix`, read back from the system."""
    reason = missing_requirements()
    if reason:
        raise ClusterError(reason)
    indices = existing_nodes(prefix)
    if not indices:
        raise ClusterError(f"no emulated cluster with prefix {prefix!r} is up: run `mpiring cluster up` first")
    if indices != list(range(len(indices))):
        raise ClusterError(f"the nodes of {prefix!r} are incomplete ({indices}): run `mpiring cluster up` again")
    topology = Topology(len(indices), prefix, DEFAULT_SUBNET)
    proc = _ip("-j", "-4", "addr", "show", "dev", topology.bridge, check=False)
    addresses = [a for link in json.loads(proc.stdout or "[]") for a in link.get("addr_info", [])]
    if not addresses:
        raise ClusterError(f"bridge {topology.bridge} is missing or has no address: run `mpiring cluster up` again")
    subnet = ipaddress.IPv4Interface(f"{addresses[0]['local']}/{addresses[0]['prefixlen']}").network
    return Topology(len(indices), prefix, str(subnet))


def _subnet_users(topology: Topology) -> list[str]:
    """Interfaces of the root namespace, other than this cluster's bridge, with an address in its subnet."""
    proc = _ip("-j", "-4", "addr", "show", check=False)
    users = []
    for link in json.loads(proc.stdout or "[]"):
        for info in link.get("addr_info", []):
            network = ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network
            if network.overlaps(topology.network) and link.get("ifname") != topology.bridge:
                users.append(f"{link.get('ifname')} ({info['local']}/{info['prefixlen']})")
    return users


def free_subnet(start: int = 1) -> str:
    """A /24 in 10.77.0.0/16 that no interface of the root namespace uses, trying from 10.77.`start`.0."""
    for step in range(254):
        third = (start - 1 + step) % 254 + 1
        candidate = Topology(1, DEFAULT_PREFIX, f"10.77.{third}.0/24")
        if not _subnet_users(candidate):
            return candidate.subnet
    raise ClusterError("no free /24 in 10.77.0.0/16 for an emulated cluster")


def _link_exists(name: str, namespace: str | None = None) -> bool:
    return _ip("link", "show", "dev", name, namespace=namespace, check=False).returncode == 0


def _shape(device: str, rate: str | None, namespace: str | None = None) -> None:
    """Put a tbf qdisc at `rate` on `device` (or take any root qdisc off when rate is None)."""
    if rate is None:
        subprocess.run(["tc", *(["-n", namespace] if namespace else []), "qdisc", "del", "dev", device, "root"],
                       capture_output=True, timeout=30)
        return
    burst = tbf_burst(rate_bits(rate))
    _tc("qdisc", "replace", "dev", device, "root", "tbf", "rate", rate, "burst", str(burst),
        "latency", TBF_LATENCY, namespace=namespace)


def up(topology: Topology, rate: str | None = "1gbit") -> Topology:
    """Make (or make again: idempotent) the cluster: namespaces, veth pairs, bridge, addresses,
    shaping at `rate` both ways on every link (None: unshaped). Nodes beyond topology.nodes under
    the same prefix are removed."""
    reason = missing_requirements()
    if reason:
        raise ClusterError(reason)
    if rate is not None:
        rate_bits(rate)  # refuse a bad rate before changing anything
    users = _subnet_users(topology)
    if users:
        raise ClusterError(f"subnet {topology.subnet} is already used by {', '.join(users)}: choose another "
                           f"with --subnet")
    for index in existing_nodes(topology.prefix):
        if index >= topology.nodes:
            _remove_node(topology, index)
    bridge = topology.bridge
    if not _link_exists(bridge):
        _ip("link", "add", bridge, "type", "bridge")
    _ip("addr", "replace", f"{topology.bridge_address}/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    for index in range(topology.nodes):
        namespace, veth = topology.namespace(index), topology.veth(index)
        if index not in existing_nodes(topology.prefix):
            _ip("netns", "add", namespace)
        if not (_link_exists(veth) and _link_exists(NODE_INTERFACE, namespace)):
            _ip("link", "del", veth, check=False)
            _ip("link", "del", NODE_INTERFACE, namespace=namespace, check=False)
            _ip("link", "add", veth, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", namespace)
        _ip("link", "set", veth, "master", bridge)
        _ip("link", "set", veth, "up")
        _ip("link", "set", "lo", "up", namespace=namespace)
        _ip("addr", "replace", f"{topology.address(index)}/24", "dev", NODE_INTERFACE, namespace=namespace)
        _ip("link", "set", NODE_INTERFACE, "up", namespace=namespace)
        _shape(NODE_INTERFACE, rate, namespace=namespace)  # what the node sends
        _shape(veth, rate)  # what the node receives
    return topology


def _kill_namespace(namespace: str) -> int:
    """SIGKILL every process in `namespace`; how many there were."""
    killed = 0
    for pid in _ip("netns", "pids", namespace, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
    return killed


def kill_processes(topology: Topology) -> int:
    """SIGKILL every process left in the cluster's namespaces (a stuck job); how many there were."""
    return sum(_kill_namespace(topology.namespace(index)) for index in existing_nodes(topology.prefix))


def _remove_node(topology: Topology, index: int) -> None:
    namespace = topology.namespace(index)
    _kill_namespace(namespace)
    _ip("link", "del", topology.veth(index), check=False)  # takes the node's end with it
    for _ in range(50):  # a namespace whose processes are still dying is busy for a moment
        if _ip("netns", "del", namespace, check=False).returncode == 0 or not _ns_exists(namespace):
            break
        time.sleep(0.1)


def _ns_exists(namespace: str) -> bool:
    return os.path.exists(f"/run/netns/{namespace}")


def down(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove everything `up` made under `prefix` (processes left in it are killed); what was removed."""
    reason = missing_requirements()
    if reason:
        raise ClusterError(reason)
    topology = Topology(1, prefix)
    removed = []
    for index in existing_nodes(prefix):
        _remove_node(topology, index)
        removed.append(topology.namespace(index))
    links = _ip("-j", "link", "show", check=False)
    for link in json.loads(links.stdout or "[]"):
        name = link.get("ifname", "")
        if re.fullmatch(rf"{re.escape(prefix)}-(br|v\d+)", name):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def link_bytes(topology: Topology) -> dict[str, LinkCounters]:
    """Node name -> the TX/RX byte counters of its interface (eth0 in its namespace)."""
    counters = {}
    for index in range(topology.nodes):
        proc = _ip("-j", "-s", "link", "show", "dev", NODE_INTERFACE, namespace=topology.namespace(index))
        stats = json.loads(proc.stdout)[0]["stats64"]
        counters[topology.node_name(index)] = LinkCounters(int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"]))
    return counters


def _rate_of(namespace: str) -> str | None:
    proc = subprocess.run(["tc", "-n", namespace, "qdisc", "show", "dev", NODE_INTERFACE],
                          capture_output=True, text=True, timeout=30)
    match = re.search(r"\btbf\b.*?\brate (\S+)", proc.stdout)
    return match[1] if match else None


def status(topology: Topology) -> list[NodeStatus]:
    """Every node: host name, namespace, address, rate and byte counters."""
    counters = link_bytes(topology)
    return [NodeStatus(topology.node_name(i), topology.namespace(i), topology.address(i),
                       _rate_of(topology.namespace(i)), counters[topology.node_name(i)])
            for i in range(topology.nodes)]


def format_status(topology: Topology, nodes: Sequence[NodeStatus]) -> str:
    """A table of `status` for people."""
    lines = [f"emulated cluster {topology.prefix!r}: {topology.nodes} node(s) on {topology.subnet}, "
             f"bridge {topology.bridge} ({topology.bridge_address})",
             f"{'node':<8} {'namespace':<16} {'address':<15} {'rate':<9} {'TX bytes':>14} {'RX bytes':>14}"]
    for node in nodes:
        lines.append(f"{node.name:<8} {node.namespace:<16} {node.address:<15} {node.rate or 'unshaped':<9} "
                     f"{node.counters.tx:>14,} {node.counters.rx:>14,}")
    return "\n".join(lines)
