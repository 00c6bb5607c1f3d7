"""A real Slurm for the sandbox: munge, one slurmctld, one slurmd per host.

Debian's Slurm 22.05 is built with multiple-slurmd support: `slurmd -N nodeK`
runs one daemon per node on one machine. Each runs in its host's network
namespace (`nsenter --net`, keeping the machine's /sys), so `srun`,
`salloc` and `sbatch` reach the very addresses cvs does. The controller runs
in the root namespace on the sandbox bridge's address.

Everything lives under DIR/slurm (config, state, spool, logs, munge key) and
RUN/slurm (munge socket, pid files). Ports are the sandbox index's own, so
sandboxes do not clash. `DIR/slurm.env` is a file to source: it points the
client commands at this controller (`SLURM_CONF`).

Stand-in GPUs (`gpus > 0`): each host gets a device root with /dev/kfd and
`gpus` render nodes (char devices 1:3, like /dev/null) plus the sysfs entries
cvs's discovery reads; Slurm declares them as `gres gpu:K` with those files.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from . import network, procs
from .errors import SandboxError

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
COMMANDS: dict[str, str] = {
    SLURMCTLD: "slurmctld",
    SLURMD: "slurmd",
    MUNGED: "munge",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
}
# Each sandbox index K gets the ports BASE + 2K (slurmctld) and BASE + 2K + 1
# (every slurmd, each in its own network namespace).
PORT_BASE = 17000
FIRST_RENDER_MINOR = 128
# Stand-in nodes claim more CPUs than this machine has (config_overrides), so
# a few jobs can share a node.
NODE_CPUS = 8
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class SlurmPaths:
    directory: Path  # DIR/slurm
    run_dir: Path  # RUN/slurm (short, world-traversable)

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.directory / "gres.conf"

    @property
    def munge_key(self) -> Path:
        return self.directory / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.run_dir / "munge.sock"

    @property
    def task_prolog(self) -> Path:
        return self.directory / "task_prolog.sh"

    @property
    def state(self) -> Path:
        return self.directory / "state"

    @property
    def spool(self) -> Path:
        return self.directory / "spool"

    def log(self, name: str) -> Path:
        return self.directory / f"{name}.log"


def paths(directory: Path, run_dir: Path) -> SlurmPaths:
    return SlurmPaths(directory / "slurm", run_dir / "slurm")


def ports(index: int) -> tuple[int, int]:
    """(slurmctld port, slurmd port) of sandbox `index`."""
    return PORT_BASE + 2 * index, PORT_BASE + 2 * index + 1


def controller_host() -> str:
    """SlurmctldHost must name this machine (`hostname -s`), else slurmctld
    refuses with "This host not a valid controller"."""
    return socket.gethostname().split(".", 1)[0]


@dataclass(frozen=True)
class SlurmNodeSpec:
    name: str
    address: str
    netns: str | None
    gpu_root: Path | None  # the stand-in device root, None without GPUs


def render_nodes(root: Path, gpus: int) -> list[Path]:
    return [root / "dev" / "dri" / f"renderD{FIRST_RENDER_MINOR + i}" for i in range(gpus)]


def make_gpu_root(root: Path, gpus: int) -> None:
    """/dev/kfd, `gpus` render nodes and the sysfs entries giving each an AMD
    PCI vendor and address (what remote/gpus.sh reads), world-readable."""
    (root / "dev" / "dri").mkdir(parents=True, exist_ok=True)
    for path in (root, root / "dev", root / "dev" / "dri"):
        path.chmod(0o755)
    _mknod(root / "dev" / "kfd")
    for index, node in enumerate(render_nodes(root, gpus)):
        _mknod(node)
        bdf = f"0000:{0xC1 + index:02x}:00.0"
        device = root / "sys" / "devices" / "pci0000:00" / bdf
        device.mkdir(parents=True, exist_ok=True)
        (device / "vendor").write_text("0x1002\n")
        drm = root / "sys" / "class" / "drm" / node.name
        drm.mkdir(parents=True, exist_ok=True)
        link = drm / "device"
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(device, drm))
    for dirpath, _, _ in os.walk(root / "sys"):
        Path(dirpath).chmod(0o755)


def _mknod(path: Path) -> None:
    if not path.exists():
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
        path.chmod(0o666)


def slurm_conf(
    p: SlurmPaths, index: int, gateway: str, nodes: Iterable[SlurmNodeSpec], gpus: int
) -> str:
    ctld_port, slurmd_port = ports(index)
    lines = [
        "# Written by `cvs sandbox up --slurm`; removed by `cvs sandbox down`.",
        f"ClusterName=cvssb{index}",
        f"SlurmctldHost={controller_host()}({gateway})",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={p.munge_socket}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmUser=root",
        "SlurmdUser=root",
        "MailProg=/bin/true",
        "MpiDefault=none",
        # A job past its time limit is killed at once; its steps get 5 s
        # between SIGTERM and SIGKILL (cvs's holders remove their container).
        "KillWait=5",
        "OverTimeLimit=0",
        f"StateSaveLocation={p.state}",
        f"SlurmdSpoolDir={p.spool}/%n",
        f"SlurmctldPidFile={p.run_dir}/slurmctld.pid",
        f"SlurmdPidFile={p.run_dir}/slurmd-%n.pid",
        f"SlurmctldLogFile={p.log('slurmctld')}",
        f"SlurmdLogFile={p.directory}/slurmd-%n.log",
        # Each sandbox host's dockerd listens on a socket of its own; the task
        # prolog makes it a step's DOCKER_HOST, as /var/run/docker.sock is on
        # a real node (sshd's SetEnv does the same for ssh sessions).
        f"TaskProlog={p.task_prolog}",
    ]
    if gpus:
        lines.append("GresTypes=gpu")
    names = []
    for node in nodes:
        gres = f" Gres=gpu:{gpus}" if gpus else ""
        lines.append(
            f"NodeName={node.name} NodeAddr={node.address} CPUs={NODE_CPUS}{gres} State=UNKNOWN"
        )
        names.append(node.name)
    lines.append(f"PartitionName=sandbox Nodes={','.join(names)} Default=YES State=UP")
    return "\n".join(lines) + "\n"


def gres_conf(nodes: Iterable[SlurmNodeSpec], gpus: int) -> str:
    lines = ["# Stand-in GPUs: char devices 1:3 under each host's device root."]
    for node in nodes:
        assert node.gpu_root is not None
        last = FIRST_RENDER_MINOR + gpus - 1
        files = f"{node.gpu_root}/dev/dri/renderD[{FIRST_RENDER_MINOR}-{last}]"
        lines.append(f"NodeName={node.name} Name=gpu File={files}")
    return "\n".join(lines) + "\n"


def env_file_text(p: SlurmPaths) -> str:
    return (
        "# Source this to drive the sandbox's Slurm: sinfo, srun, salloc, sbatch, scontrol.\n"
        f"export SLURM_CONF={p.conf}\n"
    )


def task_prolog_text(run_dir: Path) -> str:
    """Prints `export DOCKER_HOST=...` for the node the task runs on."""
    return (
        "#!/bin/sh\n"
        "# Written by `cvs sandbox up --slurm`: each step's DOCKER_HOST is its node's dockerd.\n"
        f'echo "export DOCKER_HOST=unix://{run_dir}/$SLURMD_NODENAME/docker.sock"\n'
    )


def prepare(
    p: SlurmPaths,
    index: int,
    nodes: list[SlurmNodeSpec],
    gpus: int,
    env_file: Path,
    hosts_run_dir: Path,
) -> None:
    """Config, munge key, state and spool directories, `env_file`."""
    for d in (p.directory, p.state, p.spool):
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
    p.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    # munged refuses a key readable by others.
    fd = os.open(p.munge_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secrets.token_bytes(1024))
    p.conf.write_text(slurm_conf(p, index, network.gateway_address(index), nodes, gpus))
    if gpus:
        p.gres_conf.write_text(gres_conf(nodes, gpus))
    env_file.write_text(env_file_text(p))
    p.task_prolog.write_text(task_prolog_text(hosts_run_dir))
    p.task_prolog.chmod(0o755)


def munged_argv(p: SlurmPaths) -> list[str]:
    return [
        MUNGED, "--foreground", "--force",
        f"--socket={p.munge_socket}",
        f"--key-file={p.munge_key}",
        f"--log-file={p.log('munged')}",
        f"--pid-file={p.run_dir}/munged.pid",
        f"--seed-file={p.directory}/munged.seed",
    ]  # fmt: skip


def slurmctld_argv(p: SlurmPaths) -> list[str]:
    # -i: ignore state left by an earlier run of this sandbox (none, normally).
    return [SLURMCTLD, "-D", "-i", "-f", str(p.conf)]


def slurmd_argv(p: SlurmPaths, node: SlurmNodeSpec) -> list[str]:
    argv = [SLURMD, "-D", "-f", str(p.conf), "-N", node.name]
    if node.netns is None:
        return argv
    # nsenter, not `ip netns exec` (which remounts /sys).
    return ["nsenter", f"--net=/var/run/netns/{node.netns}", *argv]


def _env(p: SlurmPaths) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(p.conf)}


def node_states(p: SlurmPaths) -> dict[str, str]:
    """Node name -> state word as `sinfo` prints it (idle, down*, ...)."""
    out = procs.run_env(
        ["sinfo", "-h", "-N", "-o", "%N %t"], env=_env(p), timeout=10.0, check=False
    )
    states = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def start(p: SlurmPaths, nodes: list[SlurmNodeSpec], record: Callable[[str, int], None]) -> None:
    """munged, slurmctld, one slurmd per node; wait until every node is idle.

    `record(name, pid)` is called as soon as each daemon is spawned (the
    sandbox saves it, so a failure half-way is torn down by pid)."""
    record("munged", procs.spawn(munged_argv(p), p.log("munged-out")))
    procs.wait_for(
        p.munge_socket.exists, timeout=START_TIMEOUT, what=f"munged's socket {p.munge_socket}"
    )
    record("slurmctld", procs.spawn(slurmctld_argv(p), p.log("slurmctld-out")))
    for node in nodes:
        record(f"slurmd:{node.name}", procs.spawn(slurmd_argv(p, node), p.log(f"{node.name}-out")))
    names = {n.name for n in nodes}

    def all_idle() -> bool:
        states = node_states(p)
        return all(states.get(name) == "idle" for name in names)

    try:
        procs.wait_for(all_idle, timeout=START_TIMEOUT, what="every slurmd idle", interval=0.5)
    except TimeoutError as exc:
        try:
            seen = procs.run_env(["sinfo", "-h", "-N", "-o", "%N %t"], env=_env(p), timeout=10.0)
        except procs.CommandError as sinfo_exc:
            seen = str(sinfo_exc)
        raise SandboxError(f"{exc} (sinfo: {seen.strip()!r}); {_log_tails(p)}") from exc


def _log_tails(p: SlurmPaths) -> str:
    """The last line of each daemon log (the directory goes with the teardown)."""
    tails = []
    for log in sorted(p.directory.glob("*.log")):
        lines = log.read_text(errors="replace").strip().splitlines()
        if lines:
            tails.append(f"{log.name}: {lines[-1][:200]}")
    return "; ".join(tails)


def stop(p: SlurmPaths, pids: dict[str, int]) -> None:
    """Stop every daemon recorded in `pids`, slurmds first, by pid and only
    while its command line still names this sandbox's files."""
    order = sorted(pids, key=lambda name: (not name.startswith("slurmd:"), name == "munged"))
    for name in order:
        marker = str(p.munge_socket) if name == "munged" else str(p.conf)
        procs.stop(pids[name], marker, timeout=10.0)
