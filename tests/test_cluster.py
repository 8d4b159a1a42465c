"""The emulated cluster (mpiring.cluster): serial tests.

Without root: the names, the launch command lines, the environment, the helper's host table and
the CLI. Where a cluster can be made (root, iproute2, network namespaces; `available()`), a real
one: two nodes at 1 Gbit/s, a job of 2 nodes x 2 ranks (mpiring/cluster/check.py) that checks
MPI's nodes, the host names and mpiring's collectives against mpi4py's, and the links' byte
counters after a large allreduce; elsewhere those tests skip with the reason. Every cluster is
removed at the end, whatever happened. The MPI job takes 1-3 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from mpiring.cluster import ClusterError, EmulatedCluster, Topology, available, detect_mpi, network
from mpiring.cluster.check import PREFIX as CHECK_PREFIX
from mpiring.cluster.runner import job_environment, launch_command, write_helper

ALLREDUCE_BYTES = 8 * 1024 * 1024

# ---- without a cluster -----------------------------------------------------------------------


def test_the_names_fit_linux_and_the_subnet_is_checked():
    topology = Topology(4, "mprabcde", "10.77.9.0/24")
    assert [topology.namespace(i) for i in range(2)] == ["mprabcde-node0", "mprabcde-node1"]
    assert max(len(topology.veth(63)), len(topology.bridge)) <= 15  # IFNAMSIZ - 1
    assert (topology.address(0), topology.address(3), topology.bridge_address) == \
        ("10.77.9.1", "10.77.9.4", "10.77.9.254")
    assert topology.hosts() == {f"node{i}": f"mprabcde-node{i}" for i in range(4)}
    for bad in ({"prefix": "Bad_name"}, {"prefix": "muchtoolong"}, {"subnet": "8.8.8.0/24"},
                {"subnet": "10.77.0.0/16"}, {"nodes": 0}):
        with pytest.raises(ClusterError):
            Topology(**{"nodes": 2, **bad})


def test_rates_parse_as_tc_writes_them():
    assert network.rate_bits("1gbit") == 1e9
    assert network.rate_bits("100mbit") == 1e8
    assert network.rate_bits("125mbps") == 1e9
    assert network.tbf_burst(1e9) == 250_000
    assert network.tbf_burst(1e6) == 32 * 1024
    for bad in ("fast", "1 gbit", "10", "0bit"):
        with pytest.raises(ClusterError):
            network.rate_bits(bad)


def test_the_launch_lines_put_ranks_in_node_order():
    topology = Topology(3, "mprt", "10.77.5.0/24")
    mpich = launch_command(topology, 2, ["python", "x.py"], "mpich", "/bin/mpiexec", "/h", {})
    assert mpich == ["/bin/mpiexec", "-launcher", "ssh", "-launcher-exec", "/h", "-iface", "mprt-br",
                     "-hosts", "node0:2,node1:2,node2:2", "-n", "6", "python", "x.py"]
    env = {"PATH": "/bin", "MPIRING_BUSY_POLL": "0", "PRTE_MCA_x": "1", "SECRET": "no"}
    ompi = launch_command(topology, 1, ["python"], "openmpi", "/bin/mpirun", "/h", env)
    line = " ".join(ompi)
    assert "--host node0:1,node1:1,node2:1 -n 3" in line and "--prtemca plm_ssh_agent /h" in line
    assert "--mca btl tcp,self,sm --mca btl_tcp_if_include 10.77.5.0/24" in line
    assert "-x MPIRING_BUSY_POLL -x PATH -x PRTE_MCA_x" in line and "SECRET" not in line
    with pytest.raises(ClusterError):
        launch_command(topology, 0, ["python"], "mpich", "/bin/mpiexec", "/h", {})


def test_the_environment_forces_tcp_between_nodes_and_leaves_cores_alone():
    env = job_environment("mpich", base={"UCX_TLS": "sm", "PATH": "/bin"})
    assert env["UCX_TLS"] == "tcp,self" and env["OPENBLAS_NUM_THREADS"] == "1" and env["PATH"] == "/bin"
    assert "MPIRING_BUSY_POLL" not in env  # mpiring finds the shared machine itself (mpiring.topology)
    assert job_environment("mpich", base={}, extra={"MPIRING_BUSY_POLL": "1"})["MPIRING_BUSY_POLL"] == "1"
    ompi = job_environment("openmpi", base={})
    assert ompi["OMPI_ALLOW_RUN_AS_ROOT"] == ompi["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"


def test_the_helper_maps_hosts_to_namespaces_and_skips_ssh_options(tmp_path):
    helper = write_helper(Topology(2, "mprt", "10.77.5.0/24"), str(tmp_path))
    with open(helper) as file:
        text = file.read()
    assert "node1) ns=mprt-node1 ;;" in text and os.access(helper, os.X_OK)
    # An unknown host is refused before anything runs (ssh's options first, as Hydra passes them).
    proc = subprocess.run([helper, "-x", "-o", "StrictHostKeyChecking=no", "elsewhere", "true"],
                          capture_output=True, text=True)
    assert proc.returncode == 255 and "unknown host elsewhere" in proc.stderr


def test_without_root_it_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ok, reason = available()
    assert not ok and "needs root" in reason
    with pytest.raises(ClusterError, match="needs root"):
        network.up(Topology(2))


def test_the_core_of_mpiring_does_not_import_the_cluster():
    probe = "import sys, mpiring; print(sorted(m for m in sys.modules if m.startswith('mpiring.cluster')))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_the_cli_has_the_cluster_subcommands():
    for command in ([sys.executable, "-m", "mpiring", "cluster", "--help"],
                    [sys.executable, "-m", "mpiring.cluster", "run", "--help"]):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert "up,down,status,run" in subprocess.run(command[:3] + ["--help"], capture_output=True, text=True).stdout
    # `mpiring cluster run` reaches the cluster (here: none with this prefix), its command intact
    proc = subprocess.run([sys.executable, "-m", "mpiring", "cluster", "run", "--prefix", "mprnone", "-k", "1", "--",
                           "true"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "mpiring cluster run:" in proc.stderr, proc.stdout + proc.stderr


# ---- a real cluster --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmulatedCluster]:
    ok, reason = available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {reason}")
    with EmulatedCluster(nodes=2, rate="1gbit") as made:
        yield made
    assert not network.existing_nodes(made.topology.prefix), "down left namespaces behind"


def test_up_is_idempotent_and_status_reads_it_back(cluster):
    cluster.up()  # again: the same cluster
    found = network.find(cluster.topology.prefix)
    assert found == cluster.topology
    nodes = cluster.status()
    assert [node.name for node in nodes] == ["node0", "node1"]
    assert all(node.rate == "1Gbit" for node in nodes), nodes
    proc = subprocess.run([sys.executable, "-m", "mpiring.cluster", "status", "--json", "--prefix",
                           cluster.topology.prefix], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [node["address"] for node in json.loads(proc.stdout)["nodes"]] == [cluster.topology.address(i)
                                                                              for i in range(2)]


def test_a_job_spans_the_nodes_and_its_data_crosses_the_links(cluster):
    before = cluster.link_bytes()
    code, output = cluster.run(2, [sys.executable, "-m", "mpiring.cluster.check", "--bytes", str(ALLREDUCE_BYTES)],
                               timeout=120)
    crossed = {node: after - before[node] for node, after in cluster.link_bytes().items()}
    lines = [line for line in output.splitlines() if line.startswith(CHECK_PREFIX)]
    assert code == 0 and lines, f"exit {code} ({detect_mpi()}):\n{output[-4000:]}"
    report = json.loads(lines[-1][len(CHECK_PREFIX):])
    # (a) MPI sees two nodes of two ranks, in node order, each under its own host name
    assert report["world_size"] == 4 and report["local_sizes"] == [2, 2, 2, 2]
    assert report["hosts"] == ["node0", "node0", "node1", "node1"]
    # (b) mpiring's collectives give what mpi4py's give
    assert all(report["checks"].values()), report["checks"]
    # (c) the data went over the shaped links: a 4-rank ring allreduce sends every node's share
    # of the array out of each node and in again (shared memory would have sent a few KB)
    for node, counters in crossed.items():
        assert counters.tx > ALLREDUCE_BYTES and counters.rx > ALLREDUCE_BYTES, (node, crossed)


def test_a_failing_job_returns_its_code_and_leaves_nothing_running(cluster):
    code, output = cluster.run(1, [sys.executable, "-c", "import sys; sys.exit(3)"], timeout=60)
    assert code != 0, output
    assert network.kill_processes(cluster.topology) == 0


def test_up_with_fewer_nodes_removes_the_rest():
    ok, reason = available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {reason}")
    with EmulatedCluster(nodes=3, rate=None) as made:
        prefix = made.topology.prefix
        assert network.existing_nodes(prefix) == [0, 1, 2]
        network.up(Topology(2, prefix, made.topology.subnet), rate="100mbit")
        assert network.existing_nodes(prefix) == [0, 1]
        assert [node.rate for node in network.status(network.find(prefix))] == ["100Mbit", "100Mbit"]
    assert network.existing_nodes(prefix) == []
    assert not [line for line in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout.splitlines()
                if f"{prefix}-" in line]
