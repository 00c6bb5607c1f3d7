"""Containers of Slurm jobs, seen from outside any job.

Inside a job a per_run or per_job container is named for the job
(`<name>-j<job ID>`), so `cvs status` and `cvs down` run outside a job, which
look for `<name>`, would not see it: a container whose job ended while its
holder could not act (a node that failed, slurmd down, a holder that was
never started) would hold its GPUs unseen, and `down` would say "nothing
left". So outside a job they also list this cluster's containers labelled
with a job (remote/job_containers.sh), ask slurmctld whether each job is
over, and `down` removes those whose job is over, by ID. A running job's
containers are its own: never removed from outside it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator import remote
from orchestrator.config.model import CONTAINER_NAME_RE
from orchestrator.config.slurm import GONE, JOB_ID_RE, LIVE_STATES
from orchestrator.containers.argv import CONTAINER_ID_RE
from orchestrator.errors import first_line
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.seam import HostRunner

_WORD = re.compile(r"[A-Za-z_]{1,32}")


@dataclass(frozen=True)
class JobContainer:
    """One container a job's invocation started, as the host lists it."""

    host: str
    id: str
    name: str
    state: str  # the runtime's word: running, exited, created, ...
    job: str
    lifetime: str


@dataclass(frozen=True)
class Verdict:
    """What becomes of one such container: removed (its job is over) or kept, and why."""

    container: JobContainer
    remove: bool
    why: str


def listing_argv(flag: Sequence[str], identity: str) -> list[str]:
    """The listing on a host no probe has seen (remote/job_containers.sh):
    `flag` names the runtime (ContainerRuntime.flag)."""
    return remote.argv("job_containers", *flag, "list", identity)


def remove_argv(flag: Sequence[str], ids: Sequence[str]) -> list[str]:
    """`rm -f -v` of these containers, by ID (validated here and on the host)."""
    for cid in ids:
        if not CONTAINER_ID_RE.fullmatch(cid):
            raise ValueError(f"invalid container ID {cid!r}")
    return remote.argv("job_containers", *flag, "remove", *ids)


def parse_listing(host: str, text: str) -> list[JobContainer]:
    """`ID NAME STATE JOB LIFETIME` lines; anything else is skipped (pure)."""
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) != 5:
            continue
        cid, name, state, job, lifetime = words
        name = name.lstrip("/")  # docker inspect's .Name has a leading slash
        if not (
            CONTAINER_ID_RE.fullmatch(cid)
            and CONTAINER_NAME_RE.fullmatch(name)
            and JOB_ID_RE.fullmatch(job)
            and _WORD.fullmatch(state)
            and _WORD.fullmatch(lifetime)
        ):
            continue
        found.append(JobContainer(host, cid, name, state, job, lifetime))
    return found


def decide(
    found: Sequence[JobContainer],
    states: Mapping[str, tuple[str | None, str]],
    *,
    current_job: str | None = None,
) -> list[Verdict]:
    """Per container: removed when slurmctld says its job is over (or no
    longer knows it); kept while the job holds its nodes, or when Slurm could
    not be asked (pure). `states`: job -> job_state's answer."""
    verdicts = []
    for c in found:
        state, why = states.get(c.job, (None, "not asked"))
        if c.lifetime == "persistent":
            verdicts.append(Verdict(c, False, "persistent: never removed with its job"))
        elif c.job == current_job:
            verdicts.append(Verdict(c, False, f"job {c.job} is this one"))
        elif state is None:
            verdicts.append(
                Verdict(
                    c,
                    False,
                    f"could not ask Slurm whether job {c.job} is over ({why}): kept; run "
                    "cvs where scontrol reaches slurmctld",
                )
            )
        elif state in LIVE_STATES:
            verdicts.append(
                Verdict(c, False, f"job {c.job} is {state}: its end removes it (scancel {c.job})")
            )
        else:
            said = "no longer known to Slurm" if state == GONE else state
            verdicts.append(Verdict(c, True, f"job {c.job} is over ({said})"))
    return verdicts


def job_states(
    jobs: Sequence[str], ask: Callable[[str], tuple[str | None, str]]
) -> dict[str, tuple[str | None, str]]:
    """Each distinct job asked once (config/slurm.job_state)."""
    return {job: ask(job) for job in dict.fromkeys(jobs)}


def describe(v: Verdict) -> str:
    c = v.container
    return f"{c.name} ({c.state}): {v.why}"


async def survey(
    pool: HostRunner,
    hosts: Sequence[str],
    flag: Sequence[str],
    identity: str,
    ask: Callable[[str], tuple[str | None, str]],
    *,
    timeout: float,
    remove: bool,
) -> list[Verdict]:
    """List the job containers on `hosts` (one round trip; none to probe
    first), decide, and (`remove`) remove those whose job is over, by ID: a
    failed removal is kept, saying why. A host that does not answer is
    skipped (the command's own probe names it)."""
    found: list[JobContainer] = []

    async def listing(host: str) -> None:
        r = await pool.run(
            host, listing_argv(flag, identity), timeout=timeout, stream_output=False,
            label="job containers",
        )  # fmt: skip
        if r.ok:
            found.extend(parse_listing(host, r.stdout))

    await fan_out(list(hosts), listing)
    verdicts = decide(found, job_states([c.job for c in found], ask))
    if not remove:
        return verdicts
    out = [v for v in verdicts if not v.remove]
    by_host: dict[str, list[Verdict]] = {}
    for v in verdicts:
        if v.remove:
            by_host.setdefault(v.container.host, []).append(v)

    async def rm(host: str) -> None:
        gone = by_host[host]
        argv = remove_argv(flag, [v.container.id for v in gone])
        r = await pool.run(host, argv, timeout=timeout, stream_output=False, label="remove")
        why = "" if r.ok else first_line(str(r.error or r.stderr or r.status))
        for v in gone:
            if r.ok:
                out.append(replace(v, why=f"{v.why}: removed"))
            else:
                out.append(replace(v, remove=False, why=f"{v.why}: removing it failed ({why})"))

    await fan_out(list(by_host), rm)
    return out
