"""A real, throw-away Slurm cluster on this machine, for tests/test_slurm.py.

Debian's slurmctld, slurmd and munge run as root from a scratch directory, with their own
configuration, key and free ports, so they touch nothing else on the machine. Where network
namespaces work (they do on the project's machines and in CI), each slurmd gets its own network
namespace, hostname and /etc/hosts, so the cluster has two real nodes and `--nodes=2` jobs cross a
(virtual) network; otherwise one node on 127.0.0.1. Every daemon runs in the foreground as our
child, so it is stopped by its own pid whatever happens (see ../shared/notes/slurm-on-localhost.md
for the configuration this grew from).

    cluster = SlurmCluster(tmp_path, nodes=2, cpus_per_node=4)
    try:
        cluster.start()
        job = cluster.sbatch(["slurm/test.sbatch"], timeout=120)
    finally:
        cluster.stop()
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
CLIENTS = ("sbatch", "sinfo", "scontrol", "scancel", "squeue")

# Variables of an enclosing job or MPI launch that would leak into our jobs and confuse them.
_FOREIGN_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDRA_")


def _installed() -> bool:
    return all(os.access(path, os.X_OK) for path in DAEMONS) and all(shutil.which(c) for c in CLIENTS)


def ensure_slurm() -> str | None:
    """Install Slurm and munge from apt when they are missing.

    Returns None when the cluster can be started, else the reason it cannot (for a skip).
    """
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root"
    if _installed():
        return None
    if shutil.which("apt-get") is None:
        return "Slurm is not installed and there is no apt-get to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command, limit in (
        (["apt-get", "update", "-q"], 180),
        (["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], 300),
    ):
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return f"{' '.join(command)} took over {limit} s"
        if proc.returncode != 0:
            return f"{' '.join(command)} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-800:]}"
    return None if _installed() else "apt-get installed the packages but the Slurm binaries are missing"


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when we die, even by SIGKILL, so that no
    daemon outlives a test run that never reached its finalizer (exec keeps this setting)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def clean_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the variables of any enclosing job or MPI launch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
    env.update(extra or {})
    return env


@dataclass
class Job:
    """What one `sbatch --wait` gave back."""

    command: list[str]
    returncode: int
    submit_output: str  # sbatch's own stdout and stderr
    job_id: int | None
    log: str  # the job's output file ("" when the job never ran)
    seconds: float

    def describe(self) -> str:
        """Everything a failing assertion should show."""
        return (
            f"$ {' '.join(self.command)}\nexit {self.returncode} after {self.seconds:.1f} s, job {self.job_id}\n"
            f"--- sbatch said ---\n{self.submit_output}\n--- job log ---\n{self.log}"
        )


class SlurmError(RuntimeError):
    """The test cluster could not be started."""


class SlurmCluster:
    """One slurmctld and `nodes` slurmd (in network namespaces when nodes > 1) under `root`."""

    def __init__(self, root: Path, nodes: int = 2, cpus_per_node: int = 4,
                 job_env: Mapping[str, str] | None = None) -> None:
        self.root = Path(root)
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.job_env = dict(job_env or {})  # added to the environment of every submission
        self.note = ""  # why this layout, for reports
        self.conf = self.root / "slurm.conf"
        self.controller = socket.gethostname().split(".")[0]
        self.node_names: list[str] = []
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        # Names are short (interfaces allow 15 characters) and carry our pid so that two runs
        # on one machine do not collide.
        tag = os.getpid() % 10000
        self._bridge = f"mrbr{tag}"
        self._veths = [f"mr{tag}v{i}" for i in range(1, nodes + 1)]
        self._netns = [f"mpiring{tag}n{i}" for i in range(1, nodes + 1)]
        self._subnet = f"10.213.{tag % 250}"
        self._made_netns: list[str] = []
        self._made_links: list[str] = []

    # ---- environment for client commands and jobs ------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment that talks to this cluster (and to no enclosing one)."""
        return clean_environment({"SLURM_CONF": str(self.conf), **(extra or {})})

    def run(self, *command: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(command), env=self.env(), capture_output=True, text=True, timeout=timeout)

    # ---- start and stop ----------------------------------------------------------------------

    @staticmethod
    def network_namespaces_work() -> bool:
        """Whether `ip netns` can make namespaces here (needs root and a kernel that allows it)."""
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
            return False
        name = f"mpiringprobe{os.getpid()}"
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
        if made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        return made

    def start(self, timeout: float = 30) -> None:
        """Start munged, slurmctld and the slurmd; return when every node is idle."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged refuses a socket under a directory others cannot enter
        self._start_munge()
        if self.nodes > 1:
            self._make_network()
            self.node_names = [f"n{i}" for i in range(1, self.nodes + 1)]
            addresses = [f"{self._subnet}.{i + 1}" for i in range(1, self.nodes + 1)]
            controller_address = f"{self._subnet}.1"
        else:
            self.node_names, addresses, controller_address = [self.controller], ["127.0.0.1"], "127.0.0.1"
        self._write_conf(addresses, controller_address)
        for directory in ("state", *(f"spool-{name}" for name in self.node_names)):
            (self.root / directory).mkdir(exist_ok=True)
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-f", str(self.conf)])
        for i, name in enumerate(self.node_names):
            slurmd = ["/usr/sbin/slurmd", "-D", "-N", name, "-f", str(self.conf)]
            if self.nodes > 1:
                # Own network, hostname, /etc/hosts and boot id: the node looks like a separate
                # machine to Slurm, to MPI and to `hostname`. UCX takes two processes with one boot
                # id for one machine and tries shared memory between them, which fails across
                # these nodes now and then.
                boot_id = self.root / f"boot_id-{name}"
                boot_id.write_text(f"{uuid.uuid4()}\n")
                script = (f"mount --bind {self.root / 'hosts'} /etc/hosts && "
                          f"mount --bind {boot_id} /proc/sys/kernel/random/boot_id && "
                          f"hostname {name} && exec \"$@\"")
                # nsenter, not `ip netns exec`: the latter remounts /sys, hiding the cgroup
                # mounts slurmd needs.
                slurmd = ["nsenter", f"--net=/run/netns/{self._netns[i]}", "unshare", "--uts", "--mount",
                          "sh", "-c", script, "sh", *slurmd]
            self._spawn(f"slurmd-{name}", slurmd)
        self._wait_idle(timeout)

    def stop(self) -> None:
        """Cancel every job, stop every daemon by its pid, remove the namespaces. Never raises."""
        if self._procs and self.conf.exists():
            try:
                self.run("scancel", "--full", "--user", str(os.geteuid()), timeout=10)
                deadline = time.monotonic() + 10  # let slurmstepd clean up before slurmd goes
                while time.monotonic() < deadline and self.run("squeue", "-h", timeout=10).stdout.strip():
                    time.sleep(0.5)
            except (OSError, subprocess.SubprocessError):
                pass
        for _name, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for _name, proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._procs.clear()
        for link in self._made_links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for ns in self._made_netns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made_links.clear()
        self._made_netns.clear()

    def _spawn(self, name: str, command: list[str]) -> None:
        log = open(self.root / f"{name}.stdout", "wb")  # noqa: SIM115 - the child owns it from now on
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env(), preexec_fn=_die_with_parent)
        log.close()
        self._procs.append((name, proc))

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(exist_ok=True)
        munge.chmod(0o755)  # munged refuses a socket directory others cannot enter
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = munge / "munge.socket"
        self._spawn("munged", [
            "/usr/sbin/munged", "--foreground", f"--key-file={key}", f"--socket={self.socket}",
            f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}",
            f"--log-file={munge / 'munged.log'}",
        ])
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmError("munged did not create its socket within 10 s\n" + self._logs())
            time.sleep(0.05)

    def _make_network(self) -> None:
        """A bridge with the controller's address, and one namespace per node plugged into it."""
        def ip(*args: str) -> None:
            proc = subprocess.run(["ip", *args], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SlurmError(f"ip {' '.join(args)}: {proc.stderr.strip()}")

        ip("link", "add", self._bridge, "type", "bridge")
        self._made_links.append(self._bridge)
        ip("addr", "add", f"{self._subnet}.1/24", "dev", self._bridge)
        ip("link", "set", self._bridge, "up")
        hosts = ["127.0.0.1 localhost", f"{self._subnet}.1 {self.controller}"]
        for i, (ns, veth) in enumerate(zip(self._netns, self._veths, strict=True), start=1):
            ip("netns", "add", ns)
            self._made_netns.append(ns)
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made_links.append(veth)
            ip("link", "set", veth, "master", self._bridge)
            ip("link", "set", veth, "up")
            address = f"{self._subnet}.{i + 1}"
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            hosts.append(f"{address} n{i}")
        (self.root / "hosts").write_text("\n".join(hosts) + "\n")

    def _write_conf(self, addresses: Sequence[str], controller_address: str) -> None:
        d = self.root
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={addr} CPUs={self.cpus_per_node} RealMemory=4000 State=UNKNOWN"
            for name, addr in zip(self.node_names, addresses, strict=True)
        )
        # Why some keys: MpiDefault=none is the hostile default of many sites (plain srun starts
        # singletons), so the scripts must ask for pmi2 themselves. config_overrides lets a node
        # claim more CPUs than the machine has. EnforcePartLimits=ALL rejects an impossible job at
        # submission instead of leaving it pending. MinJobAge=4 keeps `sbatch --wait` polling every
        # 2 s. Ports are free ones, so a cluster left over from elsewhere cannot answer. Job ids
        # start at random: MPICH names its shared memory after the PMI job id ("<job>.<step>")
        # under srun, and a rank that died left its segment behind, so job 1 of a fresh cluster
        # could open job 1's leftovers of an earlier run and fail in MPI_Init.
        self.conf.write_text(f"""\
ClusterName=mpiringci
FirstJobId={random.randrange(1000, 60_000_000)}
SlurmctldHost={self.controller}({controller_address})
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=5
MinJobAge=4
EnforcePartLimits=ALL
MailProg=/bin/true
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _check_alive(self) -> None:
        for name, proc in self._procs:
            if proc.poll() is not None:
                raise SlurmError(f"{name} exited with {proc.returncode}\n" + self._logs())

    def _logs(self, tail: int = 1500) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.stdout")):
            text = path.read_text(errors="replace")
            if text.strip():
                parts.append(f"--- {path.name} ---\n{text[-tail:]}")
        return "\n".join(parts)

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            self._check_alive()
            proc = self.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=10)
            states = proc.stdout.strip()
            found = dict(line.split() for line in states.splitlines() if len(line.split()) == 2)
            if proc.returncode == 0 and all(found.get(n) == "idle" for n in self.node_names):
                return
            time.sleep(0.2)
        raise SlurmError(f"nodes not idle after {timeout:.0f} s (sinfo: {states!r})\n" + self._logs())

    # ---- jobs --------------------------------------------------------------------------------

    def sbatch(self, args: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
               cwd: Path | None = None) -> Job:
        """`sbatch --wait ARGS` under a timeout; a job still running then is cancelled."""
        command = ["sbatch", "--wait", *args]
        started = time.monotonic()
        try:
            proc = subprocess.run(command, env=self.env({**self.job_env, **(env or {})}), cwd=cwd,
                                  capture_output=True, text=True, timeout=timeout)
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as expired:
            output = "".join(
                part.decode(errors="replace") if isinstance(part, bytes) else (part or "")
                for part in (expired.stdout, expired.stderr)
            ) + f"\n[slurm_cluster] sbatch --wait timed out after {timeout:.0f} s\n"
            code = 124
        found = re.search(r"Submitted batch job (\d+)", output)
        job_id = int(found.group(1)) if found else None
        if code == 124 and job_id is not None:
            self.run("scancel", str(job_id))
        log = ""
        if job_id is not None:
            logs = sorted((cwd or Path.cwd()).glob(f"*{job_id}*.out"))
            log = "\n".join(p.read_text(errors="replace") for p in logs)
        return Job(command, code, output, job_id, log, time.monotonic() - started)
