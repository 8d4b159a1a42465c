"""Launching MPI jobs across the emulated cluster, and `EmulatedCluster`, the Python API.

The launchers think they start their daemons over ssh: MPICH's Hydra is given `-launcher ssh
-launcher-exec HELPER`, Open MPI's mpirun `--prtemca plm_ssh_agent HELPER`. The helper (a small
sh script written next to the job) takes ssh's place: `HELPER [ssh options] HOST COMMAND...` runs
`ip netns exec <namespace of HOST> unshare --uts sh -c 'hostname HOST; COMMAND'`, so the daemon
and the ranks it starts live in that node's network and under its host name.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
import zlib
from collections.abc import Mapping, Sequence
from types import TracebackType

from mpiring.cluster import network
from mpiring.cluster.network import ClusterError, LinkCounters, NodeStatus, Topology

MPIS = ("mpich", "openmpi")
# Forwarded to every rank by name, and by prefix (Open MPI's mpirun -x; Hydra passes the whole
# environment, and the helper runs the daemons with mpiexec's own environment anyway).
FORWARD = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "HOME", "PYTHONUNBUFFERED", "PY_COLORS",
           "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MPIEXEC_TIMEOUT")
FORWARD_PREFIXES = ("MPIRING_", "OMPI_", "PRTE_", "PMIX_MCA_", "UCX_", "MPIR_CVAR_", "FI_")
# Ranks of every node share the machine's cores: mpiring's busy polling (chosen when a node
# seems to have a core per rank) would spin against the ranks of the other nodes.
SHARED_CORES_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                    "PYTHONUNBUFFERED": "1"}
OPEN_MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                     "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "PY_COLORS": "0"}

_HELPER = """#!/bin/sh
# ssh's stand-in for an emulated cluster: HELPER [ssh options] HOST COMMAND...
# runs COMMAND in HOST's network namespace under HOST's own host name (mpiring.cluster).
while [ $# -gt 0 ]; do
    case "$1" in
        -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host="$1"; shift
case "$host" in
{cases}
    *) echo "mpiring.cluster: unknown host $host (nodes: {names})" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $host && $*"
"""


def write_helper(topology: Topology, folder: str) -> str:
    """Write the launch helper for `topology` into `folder`; its path."""
    cases = "\n".join(f"    {host}) ns={namespace} ;;" for host, namespace in topology.hosts().items())
    path = os.path.join(folder, "node-exec")
    with open(path, "w") as file:
        file.write(_HELPER.format(cases=cases, names=" ".join(topology.hosts())))
    os.chmod(path, 0o755)
    return path


def detect_mpi(python: str | None = None) -> str:
    """'mpich' or 'openmpi': the MPI library mpi4py loads (asked without initializing MPI)."""
    probe = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
             "print(MPI.Get_library_version())")
    proc = subprocess.run([python or sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ClusterError(f"mpi4py cannot load an MPI library here (pip install mpich):\n{proc.stderr[-2000:]}")
    if "Open MPI" in proc.stdout:
        return "openmpi"
    if "MPICH" in proc.stdout:
        return "mpich"
    raise ClusterError(f"mpi4py's MPI is neither MPICH nor Open MPI: {proc.stdout.strip()[:200]}")


def find_launcher(mpi: str) -> str:
    """mpiexec (MPICH) or mpirun (Open MPI): the one next to this Python first, as the PyPI wheels install it."""
    names = ("mpiexec", "mpirun") if mpi == "mpich" else ("mpirun", "mpiexec")
    for name in names:
        found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
        if found:
            return found
    raise ClusterError(f"no {' or '.join(names)} on PATH: install an MPI (pip install {mpi})")


def job_environment(mpi: str, base: Mapping[str, str] | None = None,
                    extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a job on the cluster: `base` (this process's) updated with `extra`, the
    shared-core settings and Open MPI's run-as-root settings unless set, and (always) MPICH's
    TCP-between-nodes forcing (Open MPI's is on its command line)."""
    env = dict(os.environ if base is None else base)
    env.update(extra or {})
    for name, value in SHARED_CORES_ENV.items():
        env.setdefault(name, value)
    if mpi == "mpich":
        # The UCX netmod finds its peers on the same machine and would use shared memory between
        # namespaces; TCP only, and only on the node's link. Within a node MPICH keeps its own shm.
        env["UCX_TLS"] = "tcp,self"
        env["UCX_NET_DEVICES"] = network.NODE_INTERFACE
    else:
        for name, value in OPEN_MPI_ROOT_ENV.items():
            env.setdefault(name, value)
    return env


def launch_command(topology: Topology, ranks_per_node: int, command: Sequence[str], mpi: str, launcher: str,
                   helper: str, env: Mapping[str, str]) -> list[str]:
    """The mpiexec/mpirun command line of `command` on every node, ranks in node order."""
    if ranks_per_node < 1:
        raise ClusterError(f"ranks per node must be at least 1, not {ranks_per_node}")
    if not command:
        raise ClusterError("no command to run")
    hosts = ",".join(f"{host}:{ranks_per_node}" for host in topology.hosts())
    ranks = str(topology.nodes * ranks_per_node)
    if mpi == "mpich":
        return [launcher, "-launcher", "ssh", "-launcher-exec", helper, "-iface", topology.bridge,
                "-hosts", hosts, "-n", ranks, *command]
    subnet = topology.subnet
    forwarded = sorted(name for name in env if name in FORWARD or name.startswith(FORWARD_PREFIXES))
    return [launcher, "--host", hosts, "-n", ranks, "--map-by", "slot:oversubscribe",
            "--prtemca", "plm_ssh_agent", helper, "--prtemca", "oob_tcp_if_include", subnet,
            "--mca", "pml", "ob1", "--mca", "btl", "tcp,self,sm", "--mca", "btl_tcp_if_include", subnet,
            "--mca", "mpi_yield_when_idle", "1",
            *[flag for name in forwarded for flag in ("-x", name)], *command]


def run_job(topology: Topology, ranks_per_node: int, command: Sequence[str], *, mpi: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = 300, echo: bool = False,
            cwd: str | None = None) -> tuple[int, str]:
    """Run `command` as an MPI job of nodes x ranks_per_node ranks; (exit code, output).

    The job is killed after `timeout` seconds (MPIEXEC_TIMEOUT, then its process group and whatever
    is left in the nodes' namespaces); a job killed so returns 124. With `echo`, output is also
    written to stdout as it comes.
    """
    mpi = mpi or detect_mpi()
    if mpi not in MPIS:
        raise ClusterError(f"mpi must be one of {MPIS}, not {mpi!r}")
    launcher = find_launcher(mpi)
    full_env = job_environment(mpi, extra=dict(env or {}, MPIEXEC_TIMEOUT=str(max(1, int(timeout)))))
    with tempfile.TemporaryDirectory(prefix="mpiring-cluster-") as folder:
        helper = write_helper(topology, folder)
        argv = launch_command(topology, ranks_per_node, command, mpi, launcher, helper, full_env)
        if echo:
            print("$", shlex.join(argv), flush=True)
        proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, cwd=cwd)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            network.kill_processes(topology)

        timer = threading.Timer(timeout + 15, kill)  # MPIEXEC_TIMEOUT first; this if the launcher hangs
        timer.start()
        lines = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            code = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                kill()
                proc.wait()
    if killed.is_set():
        lines.append(f"[mpiring.cluster] job killed after {timeout + 15:.0f} s\n")
        code = 124
    if network.kill_processes(topology):  # daemons a failed launch left behind
        lines.append("[mpiring.cluster] killed processes left in the nodes after the job\n")
    return code, "".join(lines)


class EmulatedCluster:
    """An emulated cluster for tests and benchmarks; as a context manager it comes up on entry and
    is removed on exit, whatever happens in between.

        with EmulatedCluster(nodes=2, rate="1gbit") as cluster:
            before = cluster.link_bytes()
            code, output = cluster.run(2, [sys.executable, "prog.py"], timeout=120)
            crossed = cluster.link_bytes()["node0"] - before["node0"]

    Without `prefix`, a prefix of its own (so that test runs do not collide with each other or with
    a cluster made by `mpiring cluster up`) and a free subnet are chosen.
    """

    def __init__(self, nodes: int = 2, rate: str | None = "1gbit", *, prefix: str | None = None,
                 subnet: str | None = None) -> None:
        unique = prefix is None
        prefix = prefix or f"mpt{uuid.uuid4().hex[:5]}"
        if subnet is None:
            subnet = (network.free_subnet(zlib.crc32(prefix.encode()) % 254 + 1) if unique
                      else network.DEFAULT_SUBNET)
        self.topology = Topology(nodes, prefix, subnet)
        self.rate = rate
        self._up = False

    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") when a cluster can be made here, else (False, the reason)."""
        return network.available()

    def up(self) -> EmulatedCluster:
        """Make the namespaces, links and shaping (idempotent)."""
        self._up = True  # before: a half-made cluster is removed too
        network.up(self.topology, self.rate)
        return self

    def down(self) -> None:
        """Remove everything (processes left in the nodes are killed)."""
        network.down(self.topology.prefix)
        self._up = False

    def __enter__(self) -> EmulatedCluster:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.down()

    @property
    def nodes(self) -> int:
        return self.topology.nodes

    def run(self, ranks_per_node: int, command: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = 300, mpi: str | None = None, echo: bool = False,
            cwd: str | None = None) -> tuple[int, str]:
        """Run `command` on nodes x ranks_per_node ranks (see run_job); (exit code, output)."""
        return run_job(self.topology, ranks_per_node, command, mpi=mpi, env=env, timeout=timeout, echo=echo,
                       cwd=cwd)

    def link_bytes(self) -> dict[str, LinkCounters]:
        """Node name -> TX/RX bytes of its interface; subtract two readings to see what a job sent."""
        return network.link_bytes(self.topology)

    def status(self) -> list[NodeStatus]:
        return network.status(self.topology)


