"""Hosts (and their GPUs) from a Slurm allocation, asked of Slurm itself.

Inside `salloc` or an `sbatch` script, a cluster file that says
`hosts: {from: slurm}` (or `cvs --hosts-from slurm`) takes its hosts from
the running job: `scontrol show job -d $SLURM_JOB_ID` gives its state, its
nodes and, per node, the GPU indices Slurm allocated (`GRES=gpu:2(IDX:2-3)`);
`scontrol show hostnames` expands the node list; `scontrol show node` gives
each node's `NodeAddr`, so a cluster file need not list addresses. A host
the file does list keeps what the file says of it (address, port, user,
limits); everything else (ssh, container, limits) still comes from the file.

The parsers are pure; `query_job` is the thin IO around them (three local
`scontrol` calls, each bounded). Every failure is one `ConfigError` line:
outside a job, no scontrol, a slurmctld that does not answer, a job that is
not running, GPUs without indices.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config.documents import ConfigError
from orchestrator.config.hostlist import HostlistError, expand_hostlist, split_patterns
from orchestrator.errors import Call, ExitCode, Phrase, Text

JOB_ID_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")
HOST_SOURCES = ("slurm",)
# Each scontrol call; slurmctld's own MessageTimeout defaults to 10 s.
SCONTROL_TIMEOUT = 20.0

JOB_ID_RE = re.compile(r"[0-9]{1,12}")
_NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ADDRESS_RE = re.compile(r"[A-Za-z0-9:][A-Za-z0-9._:-]{0,252}")
# One GRES entry of a node line: gpu[:type]:count[(IDX:...)]
_GRES_RE = re.compile(r"gpu(?::[^:(,]+)?:(\d+)(?:\(IDX:([^)]*)\))?")


class SlurmError(ConfigError):
    """Slurm cannot tell us the allocation (exit 2, nothing started)."""


class SlurmOutsideJob(SlurmError):
    """Hosts come from Slurm, but this process is not in a job (exit 2)."""


class SlurmUnanswered(SlurmError):
    """slurmctld did not answer within the bound: not a usage error but a
    controller out of reach (exit 3, as for a host), nothing started."""

    exit_code = ExitCode.UNREACHABLE


@dataclass(frozen=True)
class SlurmNode:
    """A node of the job: its name, its address and the GPUs the job holds there."""

    name: str
    address: str
    # Slurm's indices of the GPUs the job holds on this node (the node's own
    # numbering, as gres.conf lists them); () when it holds none.
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class SlurmJob:
    """The running job the hosts come from: its id and its nodes."""

    job_id: str
    nodes: tuple[SlurmNode, ...]

    def node(self, name: str) -> SlurmNode | None:
        return next((n for n in self.nodes if n.name == name), None)


@dataclass(frozen=True)
class JobFacts:
    """What `scontrol show job -d` says that matters here."""

    job_id: str
    state: str
    nodelist: str
    # node hostlist expression -> that line's GRES field ("gpu:2(IDX:0-1)", "")
    node_gres: tuple[tuple[str, str], ...]


# ---------------------------------------------------------------- pure parts

# The in-container sshd's port inside a job when the file fixes none: one per
# job, so two jobs packed onto the same nodes (host network) do not both want
# 2224. Below Linux's ephemeral range (32768-60999): no outgoing connection
# holds it by chance.
JOB_PORT_BASE = 20000
JOB_PORT_SPAN = 10000


def job_sshd_port(job_id: str) -> int:
    """20000 + job ID mod 10000: jobs whose IDs differ by less than 10000 (any
    two running at once on a node, in practice) get different ports."""
    return JOB_PORT_BASE + int(job_id) % JOB_PORT_SPAN


def slurm_job_id(env: Mapping[str, str]) -> str | None:
    for name in JOB_ID_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def _fields(text: str) -> list[tuple[str, str]]:
    """`Key=Value` words of scontrol's output, in order (values hold no spaces
    for the keys read here)."""
    pairs = []
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            pairs.append((key, value))
    return pairs


def parse_job(text: str) -> JobFacts:
    """`scontrol show job -d J` (multi-line or --oneliner) -> JobFacts.

    Per-node detail lines read `Nodes=node[1-2] CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)`.
    """
    job_id = state = nodelist = ""
    node_gres: list[tuple[str, str]] = []
    current: str | None = None
    for key, value in _fields(text):
        if key == "JobId" and not job_id:
            job_id = value
        elif key == "JobState":
            state = value
        elif key == "NodeList" and not nodelist:
            nodelist = value
        elif key == "Nodes":
            current = value
            node_gres.append((value, ""))
        elif key == "GRES" and current is not None:
            node_gres[-1] = (current, value)
    return JobFacts(job_id, state, nodelist, tuple(node_gres))


def parse_gpu_indices(gres: str) -> tuple[int, ...] | None:
    """GPU indices of one node line's GRES (`gpu:2(IDX:0-1)`,
    `gpu:a100:1(IDX:3),gpu:h100:2(IDX:4-5)`); () without GPUs; None when it
    holds GPUs but Slurm printed no indices."""
    indices: list[int] = []
    for m in _GRES_RE.finditer(gres):
        count, idx = int(m.group(1)), m.group(2)
        if count == 0:
            continue
        if idx is None:
            return None
        for part in idx.split(","):
            if part in ("", "N/A"):
                return None
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                return None
            indices.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(indices)))


def parse_node_addresses(text: str) -> dict[str, str]:
    """`scontrol show node [--oneliner] NODES` -> {NodeName: NodeAddr}."""
    found: dict[str, str] = {}
    name: str | None = None
    for key, value in _fields(text):
        if key == "NodeName":
            name = value
        elif key == "NodeAddr" and name is not None:
            found[name] = value
    return found


def expand_nodes(value: str, *, what: Text) -> list[str]:
    """A Slurm hostlist (`gpu[01-03,07],login2`) -> names, in Slurm's order."""
    names: list[str] = []
    try:
        for part in split_patterns(value):
            names.extend(expand_hostlist(part))
    except HostlistError as exc:
        raise SlurmError(Phrase(what, f"={value!r} is not a hostlist: {exc}")) from None
    return list(dict.fromkeys(names))  # a node named twice is one host


def _outside_job(where: Text) -> SlurmError:
    return SlurmOutsideJob(
        Phrase(
            where,
            ": hosts come from Slurm, but SLURM_JOB_ID is not set: run cvs inside an "
            "allocation (salloc -N2 cvs ..., or in an sbatch script), or list hosts in the "
            "cluster file",
        )
    )


def job_nodes(
    facts: JobFacts, names: Sequence[str], addresses: Mapping[str, str], *, where: Text
) -> tuple[SlurmNode, ...]:
    """The job's nodes with their addresses and GPU indices (pure)."""
    gpus: dict[str, tuple[int, ...]] = {}
    for expr, gres in facts.node_gres:
        indices = parse_gpu_indices(gres)
        for name in expand_nodes(expr, what=Phrase(where, ": Nodes")):
            if indices is None:
                raise SlurmError(
                    Phrase(
                        where,
                        f": Slurm gave job {facts.job_id} GPUs on {name} without indices "
                        f"(GRES={gres}); cvs cannot tell which devices are the job's: "
                        "declare them with File= in gres.conf",
                    )
                )
            gpus[name] = indices
    nodes = []
    for name in names:
        address = addresses.get(name)
        if not address or not _ADDRESS_RE.fullmatch(address):
            raise SlurmError(
                Phrase(
                    where,
                    f": Slurm lists node {name!r} in job {facts.job_id} but gives it no "
                    f"usable address (NodeAddr={address!r})",
                )
            )
        nodes.append(SlurmNode(name, address, gpus.get(name, ())))
    return tuple(nodes)


# ---------------------------------------------------------------- thin IO

# argv, timeout -> (exit status, stdout, stderr); raises FileNotFoundError
# when scontrol is not installed, subprocess.TimeoutExpired on a hang.
Run = Callable[[Sequence[str], float], tuple[int, str, str]]


def run_scontrol(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return proc.returncode, proc.stdout, proc.stderr


def _ask(run: Run, argv: list[str], where: Text, timeout: float) -> str:
    shown = " ".join(argv)
    try:
        code, out, err = run(argv, timeout)
    except FileNotFoundError:
        raise SlurmError(
            Phrase(
                where,
                ": hosts come from Slurm, but scontrol is not installed on this machine "
                "(Debian: slurm-client); run cvs where Slurm's commands are",
            )
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmUnanswered(
            Phrase(
                where,
                f": slurmctld did not answer `{shown}` within {timeout:.0f}s; check "
                "`scontrol ping` (is slurmctld up, is SLURM_CONF right?)",
            )
        ) from None
    if code != 0:
        first = next((line for line in err.splitlines() if line.strip()), f"exit {code}")
        raise SlurmError(Phrase(where, f": `{shown}` failed: {first.strip()[:300]}"))
    return out


# States in which a job still holds its nodes: its containers are its own.
LIVE_STATES = frozenset(
    {"RUNNING", "PENDING", "SUSPENDED", "COMPLETING", "CONFIGURING", "RESIZING", "REQUEUED",
     "STOPPED", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
)  # fmt: skip
# What job_state says of a job slurmctld no longer knows (ended, then purged).
GONE = "GONE"


def job_state(
    job_id: str, *, run: Run = run_scontrol, timeout: float = SCONTROL_TIMEOUT
) -> tuple[str | None, str]:
    """(state, why) of any job, asked of slurmctld: its JobState, GONE when
    slurmctld no longer knows it, or None with why it could not be asked."""
    if not JOB_ID_RE.fullmatch(job_id):
        return None, f"{job_id!r} is not a job ID"
    try:
        code, out, err = run(["scontrol", "show", "job", "-o", job_id], timeout)
    except FileNotFoundError:
        return None, "scontrol is not installed on this machine"
    except subprocess.TimeoutExpired:
        return None, f"slurmctld did not answer within {timeout:.0f}s"
    if code != 0:
        if "invalid job id" in err.lower():
            return GONE, ""
        first = next((line for line in err.splitlines() if line.strip()), f"exit {code}")
        return None, f"scontrol: {first.strip()[:200]}"
    state = parse_job(out).state
    return (state, "") if state else (None, "scontrol printed no JobState")


def query_job(
    env: Mapping[str, str],
    *,
    where: Text,
    run: Run = run_scontrol,
    timeout: float = SCONTROL_TIMEOUT,
    over_ok: bool = False,
) -> SlurmJob:
    """The running job this process is in, asked of Slurm (SlurmError otherwise).
    `over_ok` (`cvs down`, `cvs status`): a job that is over still gives its
    nodes, so what it left there can be seen and removed."""
    job_id = slurm_job_id(env)
    if job_id is None:
        raise _outside_job(where)
    if not JOB_ID_RE.fullmatch(job_id):
        raise SlurmError(Phrase(where, f": SLURM_JOB_ID={job_id!r} is not a job ID"))
    facts = parse_job(_ask(run, ["scontrol", "show", "job", "-d", job_id], where, timeout))
    over = facts.state not in LIVE_STATES and bool(facts.state)
    if facts.state != "RUNNING" and not (over_ok and over):
        after = (
            Phrase(
                "; what it left on its nodes: ",
                Call("status"),
                " and ",
                Call("down"),
                " (they take a job that is over)",
            )
            if over
            else ""
        )
        raise SlurmError(
            Phrase(
                where,
                f": job {job_id} is {facts.state or 'in an unknown state'}, not running: "
                "run cvs inside a running allocation",
                after,
            )
        )
    if not facts.nodelist or facts.nodelist == "(null)":
        raise SlurmError(Phrase(where, f": job {job_id} has no nodes"))
    listed = _ask(run, ["scontrol", "show", "hostnames", facts.nodelist], where, timeout)
    names = [line.strip() for line in listed.splitlines() if line.strip()]
    for name in names:
        if not _NODE_NAME_RE.fullmatch(name):
            raise SlurmError(Phrase(where, f": Slurm named a node {name!r}: not a host name"))
    shown = _ask(run, ["scontrol", "show", "node", "--oneliner", facts.nodelist], where, timeout)
    return SlurmJob(job_id, job_nodes(facts, names, parse_node_addresses(shown), where=where))
