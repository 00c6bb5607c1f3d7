"""The programs cvs runs on hosts and in containers: POSIX sh files.

Every shell program cvs sends is a `.sh` file in this package (package data),
read by shellcheck in CI and run under dash, `bash --posix` and busybox sh by
the tests. A program takes its inputs as arguments (`sh -c PROGRAM cvs-NAME
ARG…`) or on stdin, never by text replacement: what varies is data, and the
program text is the same on every call.

Libraries (`access.sh`, `listen.sh`, `records.sh`) define functions only and
are prepended to the programs that use them, so one rule ("is sshd
listening", "which docker", "where the records live") is written once and
still costs no process on the host. `program(NAME)` is the text sent: the
libraries and the program, full-line comments and blank lines left out (the
attach path sends the probe on every `up`).

    frames.py   the `@@cvs:` output grammar: one parser for what the programs print
    records.py  the host's records of containers (provisioned, adopted)
    runtime.py  how to reach the container runtime on a host (ContainerRuntime)
"""

from __future__ import annotations

import functools
from importlib import resources

from orchestrator.events import name_program

# Which libraries each program needs, in order. A program not named here
# needs none.
_LIBRARIES: dict[str, tuple[str, ...]] = {
    "probe": ("access", "capacity", "listen", "records", "podman", "cgroup"),
    "check": ("listen",),
    "sshd": ("listen", "iface"),
    "record": ("records",),
    "runtime": ("access",),
    "diagnose": ("access",),
    "job_containers": ("access",),
}
LIBRARIES = frozenset(lib for libs in _LIBRARIES.values() for lib in libs)
# Programs whose text another program's follows in one shell: ssh_run.sh
# prepares the sshd's session, then run.sh runs the command (one shell fewer
# per command than ssh_run.sh exec'ing run.sh).
_FOLLOWED_BY: dict[str, tuple[str, ...]] = {"ssh_run": ("run",)}
PROGRAMS = frozenset(
    {
        "probe",
        "check",
        "lock",
        "record",
        "runtime",
        "setup",
        "setup_kill",
        "sshd",
        "kill_tree",
        "run",
        "ssh_run",
        "copy_receive",
        "copy_send",
        "gpus",
        "diagnose",
        "bounded",
        "mpi_check",
        "slurm_holder",
        "slurm_epilog",
        "spread_load",
        "spread_send",
        "spread_space",
        "spread_lease",
        "spread_fan",
        "spread_reach",
        "job_containers",
    }
)


def source(name: str) -> str:
    """The text of `NAME.sh` as it is in the package (comments and all)."""
    if name not in PROGRAMS and name not in LIBRARIES:
        raise ValueError(f"no remote program or library named {name!r}")
    return resources.files(__name__).joinpath(f"{name}.sh").read_text(encoding="utf-8")


def _compact(text: str) -> str:
    # Full-line comments and blank lines only: no program has a multi-line
    # string whose lines start with '#' (tests/test_remote.py checks each
    # compacted program parses as the file does).
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if line.strip() and not line.lstrip().startswith("#")
    )


@functools.cache
def program(name: str) -> str:
    """What is sent to run program `name`: its libraries, then the program."""
    if name not in PROGRAMS:
        raise ValueError(f"no remote program named {name!r}")
    parts = [source(lib) for lib in _LIBRARIES.get(name, ())] + [source(name)]
    parts += [source(then) for then in _FOLLOWED_BY.get(name, ())]
    text = "".join(_compact(p) for p in parts)
    name_program(name, text)  # events name it, never carry its text
    return text


def argv(name: str, *args: str) -> list[str]:
    """`sh -c PROGRAM cvs-NAME ARG…`: ready for `docker exec` or an SSH exec
    (`shlex.join`), whatever the login shell is."""
    return ["sh", "-c", program(name), f"cvs-{name}", *args]
