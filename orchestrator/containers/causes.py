"""Causes, not just codes: why a command in a container failed.

An exit code says little: 137 is SIGKILL, whether the kernel's out-of-memory
killer sent it, the container stopped under the command, or its runtime
restarted. What cvs can tell, it tells, from two kinds of facts:

- what the command's own run printed: the in-container wrapper (exec.py)
  reads the container's memory cgroup `oom_kill` counter before and after
  the command and, when it grew, prints one line starting `OOM_LINE` on
  stderr; a `No space left on device` anywhere in the output names a full
  disk;
- after a failure that looks like a kill (no exit status, 125, 128+N), one
  more round trip (remote/diagnose.sh) asks the host's runtime (docker or
  podman, as the cluster names it) about the container: stopped (and
  `State.OOMKilled`), started again during the command, removed, or the
  runtime itself gone or hung. Every message names that runtime.

The decisions are pure functions of those facts (tested table by table);
`diagnosis_command` is the only IO-facing piece, and it only builds text.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace
from datetime import datetime

from orchestrator import remote
from orchestrator.containers.argv import image_registry, validate_container_name
from orchestrator.errors import Call, Phrase, Text
from orchestrator.remote.runtime import ContainerRuntime, runtime_hung
from orchestrator.results import HostResult

# The wrapper's line (exec.py `_RUN`): the prefix, then the counter's values.
OOM_LINE = "cvs: out of memory:"
_NO_SPACE_RE = re.compile(r"no space left on device", re.IGNORECASE)
_DAEMON_GONE_RE = re.compile(
    r"cannot connect to the docker daemon|is the docker daemon running|"
    r"error during connect|connection refused|"
    # podman: its binary or its store gone from under it.
    r"podman: (?:command )?not found|executable file not found",
    re.IGNORECASE,
)
_DOCKER_TIME_RE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")
_STAMP_RE = re.compile(r"\d+(?:\.\d+)?")
# Clocks: StartedAt and `date +%s` come from the same host; this is only the
# slack for the round trips between our measuring the step and its start.
_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class ContainerFacts:
    """What the runtime said about the container after a failed command."""

    now: float | None = None  # the host's clock (epoch seconds)
    container_id: str | None = None
    status: str | None = None  # running, exited, ...
    oom_killed: bool = False
    exit_code: int | None = None
    started_at: float | None = None  # epoch seconds, None when never
    finished_at: float | None = None
    restarts: int = 0
    error: str | None = None  # the runtime could not say, and why
    # The command's pidfile (remote/run.sh), read in the running container:
    # True when it was left behind (run.sh itself was killed), False when the
    # command ended and removed it, None when not looked at.
    pidfile_left: bool | None = None
    command_started: float | None = None  # the pidfile's mtime: when the command began


_PIDFILE_RE = re.compile(r"/tmp/\.cvs-exec-[0-9a-f]{1,64}\.pid")


def diagnosis_command(
    name: str, runtime: ContainerRuntime | None = None, pidfile: str | None = None
) -> list[str]:
    """argv for the host: remote/diagnose.sh [--podman|--podman-rootless] NAME
    [PIDFILE] (the runtime's flag: a podman host's diagnosis asks podman, not
    docker; PIDFILE: the failed command's, exec.py, read in the container)."""
    validate_container_name(name)
    if pidfile is not None and not _PIDFILE_RE.fullmatch(pidfile):
        raise ValueError(f"invalid pidfile {pidfile!r}")
    flag = runtime.flag if runtime is not None else []
    return remote.argv("diagnose", *flag, name, *([pidfile] if pidfile else []))


def wants_diagnosis(result: HostResult) -> bool:
    """Worth asking docker why: a kill or a docker failure, not an ordinary exit."""
    if result.status != "failed":
        return False
    return result.exit_code is None or result.exit_code == 125 or result.exit_code >= 128


def _epoch(text: str) -> float | None:
    match = _DOCKER_TIME_RE.fullmatch(text.strip())
    if not match or text.startswith("0001-"):
        return None
    stamp, fraction, zone = match.groups()
    micro = (fraction or "0")[:6].ljust(6, "0")
    zone = "+00:00" if zone == "Z" else zone
    try:
        return datetime.fromisoformat(f"{stamp}.{micro}{zone}").timestamp()
    except ValueError:
        return None


def read_diagnosis(text: str, runtime: str = "docker") -> ContainerFacts:
    """Parse diagnose.sh's lines (unknown lines are ignored); `runtime` names
    who did not answer."""
    now: float | None = None
    found: ContainerFacts | None = None
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "pidfile" and found is not None:
            what, _, when = rest.partition(" ")
            stamp = _STAMP_RE.match(when.strip())
            found = replace(
                found,
                pidfile_left=what == "left",
                command_started=float(stamp.group()) if stamp and what == "left" else None,
            )
        elif found is not None:
            continue
        elif word == "now":
            try:
                now = float(rest)
            except ValueError:
                now = None
        elif word == "error":
            return ContainerFacts(now=now, error=rest.strip()[:300] or f"{runtime} failed")
        elif word == "state":
            parts = rest.split()
            if len(parts) < 7:
                break
            cid, status, oom, code, started, finished, restarts = parts[:7]
            found = ContainerFacts(
                now=now,
                container_id=cid,
                status=status,
                oom_killed=oom == "true",
                exit_code=int(code) if code.lstrip("-").isdigit() else None,
                started_at=_epoch(started),
                finished_at=_epoch(finished),
                restarts=int(restarts) if restarts.isdigit() else 0,
            )
    return found or ContainerFacts(now=now, error=f"no answer from {runtime}")


def output_cause(stdout: str, stderr: str) -> str | None:
    """A cause the command's own output names (the wrapper's OOM line, ENOSPC)."""
    for line in reversed(stderr.splitlines()[-5:]):
        if line.startswith(OOM_LINE):
            detail = line[len(OOM_LINE) :].strip()
            return (
                "killed by the out-of-memory killer: the container's memory limit was "
                f"reached while the command ran ({detail})"
            )
    if _NO_SPACE_RE.search(stderr[-4096:]) or _NO_SPACE_RE.search(stdout[-4096:]):
        return "the disk is full on this host (no space left on device)"
    return None


_PULL_NOT_FOUND = re.compile(
    r"manifest unknown|manifest for \S+ not found|not found: manifest|repository does not exist|"
    r"name unknown|no such image|image not known|\bnot found\b",
    re.IGNORECASE,
)
_PULL_REFUSED = re.compile(
    r"unauthorized|authentication required|access denied|denied:|forbidden|\b40[13]\b",
    re.IGNORECASE,
)
_PULL_UNREACHED = re.compile(
    r"no such host|network is unreachable|connection refused|i/o timeout|"
    r"handshake timeout|dial tcp|no route to host|server misbehaving",
    re.IGNORECASE,
)
_DAEMON_PREFIX = re.compile(r"^(?:Error response from daemon:|Error:|error:)\s*", re.IGNORECASE)


def pull_cause(image: str, output: str) -> str:
    """Why `docker pull IMAGE` (or podman's) failed, naming the image and the
    registry it went to: not found there, refused by it, or not reached;
    `output` is what the pull printed (its last line says it)."""
    registry = image_registry(image) or "docker.io"
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    detail = _DAEMON_PREFIX.sub("", lines[-1])[:300] if lines else "no message"
    # Docker Hub answers "pull access denied ... repository does not exist" for
    # both a missing and a private image: not found, and says so.
    if _PULL_NOT_FOUND.search(detail):
        return f"image {image} not found: {registry} has no such image or tag ({detail})"
    if _PULL_REFUSED.search(detail):
        return f"{registry} refused image {image} ({detail})"
    if _PULL_UNREACHED.search(detail):
        return (
            f"image {image} is not on the host, and {registry} was not reached to pull it "
            f"({detail})"
        )
    return f"image {image} could not be pulled from {registry} ({detail})"


def container_cause(
    facts: ContainerFacts,
    *,
    elapsed: float,
    runtime: str = "docker",
    exit_code: int | None = None,
) -> Text | None:
    """What happened to the container (or its runtime, `docker` or `podman`)
    under a command that ran for `elapsed` seconds and just failed with
    `exit_code`; None when nothing did (or nothing read on the host says)."""
    if facts.error is not None:
        if "no such container" in facts.error.lower():
            return "the container was removed while the command ran"
        if _DAEMON_GONE_RE.search(facts.error):
            return Phrase(
                f"the container runtime went away: {runtime} on this host does not answer "
                f"({facts.error}); ",
                Call("status"),
                " tells when it is back",
            )
        return f"{runtime} could not say what happened to the container ({facts.error})"
    began = None if facts.now is None else facts.now - elapsed - _SLACK_SECONDS
    if facts.status != "running":
        if facts.oom_killed:
            return (
                f"the container was killed by the out-of-memory killer ({runtime}: OOMKilled): "
                "its memory limit was reached"
            )
        when = ""
        if facts.finished_at is not None and began is not None and facts.finished_at >= began:
            when = " while the command ran"
        code = "" if facts.exit_code is None else f", its main process exited {facts.exit_code}"
        return Phrase(
            f"the container stopped{when} (now {facts.status}{code}; a runtime restart or "
            "a host reboot does this): ",
            Call("up"),
            " starts it again, keeping its overlay",
        )
    return _running_cause(facts, elapsed=elapsed, runtime=runtime, exit_code=exit_code)


def _running_cause(
    facts: ContainerFacts, *, elapsed: float, runtime: str, exit_code: int | None
) -> str | None:
    """The container runs now. It restarted under the command only when the
    evidence says so: the command's pidfile was left behind (run.sh itself was
    killed) and the container started after the command did. An exit code
    alone (255, 137) says nothing about the container."""
    started, begun = facts.started_at, facts.command_started
    if facts.pidfile_left and started is not None and begun is not None and started > begun:
        return (
            f"the container restarted while the command ran ({runtime} started it again"
            + (f", restart count {facts.restarts}" if facts.restarts else "")
            + "); what the command had started in it was killed"
        )
    # Started before the command began: before its pidfile, or before the
    # earliest the command can have started (now - elapsed, our clock's span).
    kept = started is not None and (
        (begun is not None and started <= begun)
        or (facts.now is not None and started < facts.now - elapsed)
    )
    if not kept or exit_code is None or not 128 < exit_code < 128 + 65:
        return None
    number = exit_code - 128
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return (
        f"what a shell reports for a process killed by signal {number} ({name}); "
        "the container kept running (not restarted, not stopped)"
    )


def _ended(facts: ContainerFacts, runtime: str, began: float | None) -> str | None:
    """Why this peer's container is not there for an MPI job, from what its
    runtime said: not running (state, exit code, OOMKilled), or removed; None
    when it runs, or when the runtime could not say (no evidence either way)."""
    if facts.error is not None:
        gone = "no such container" in facts.error.lower() or "no such object" in facts.error.lower()
        return f"its container is gone ({runtime}: no such container)" if gone else None
    if facts.status is None or facts.status == "running":
        return None
    ended = facts.finished_at is not None and began is not None and facts.finished_at >= began
    code = "?" if facts.exit_code is None else str(facts.exit_code)
    return (
        f"its container {'exited while the job ran' if ended else 'is not running'} ({runtime}: "
        f"state {facts.status}, exit code {code}, OOMKilled {str(facts.oom_killed).lower()})"
    )


def peers_cause(
    peers: dict[str, ContainerFacts | None], *, elapsed: float, runtime: str = "docker"
) -> Text | None:
    """After an MPI job failed (it ran `elapsed` seconds): the hosts whose
    container exited or disappeared, each with what its runtime said (issue
    42, item 4); None when every container answered running. An exit code
    alone names no host: only these facts do. `None` facts: not looked at
    (the host was not reached)."""
    named: list[str] = []
    for host, facts in peers.items():
        if facts is None:
            continue
        began = None if facts.now is None else facts.now - elapsed - _SLACK_SECONDS
        why = _ended(facts, runtime, began)
        if why is not None:
            named.append(f"{host}: {why}")
    if not named:
        return None
    unreached = [h for h, f in peers.items() if f is None]
    tail = f"; not looked at: {', '.join(unreached)} (not reached)" if unreached else ""
    return f"an MPI peer's container ended: {'; '.join(named)}{tail}"


def with_cause(result: HostResult, cause: Text | None) -> HostResult:
    """`result` whose `error` names `cause` after the code (`exit code 137: ...`)
    and whose `cause` holds it alone."""
    if cause is None:
        return result
    base = result.error or result.status
    return replace(result, error=Phrase(base, ": ", cause), cause=cause)


def hung_cause(seconds: float, runtime: str = "docker") -> str:
    return runtime_hung(runtime, seconds, "the diagnosis (what happened to the container)")


__all__ = [
    "OOM_LINE",
    "ContainerFacts",
    "container_cause",
    "diagnosis_command",
    "hung_cause",
    "output_cause",
    "peers_cause",
    "pull_cause",
    "read_diagnosis",
    "wants_diagnosis",
    "with_cause",
]
