"""PURE: our HostResults in the shapes CVS's suites read, and CVS's mpirun line.

CVS's `exec` returns `{host: output}`, the output being stdout then stderr
as one string, every line ending in a newline, tabs as three spaces; with
`detailed=True`, `{host: {"output": str, "exit_code": int}}`. A host that was
not reached is still there, its output saying why and ending in CVS's
"ABORT: Host Unreachable Error" marker (which suites grep for); a timeout
ends in "ABORT: Timeout Error in Host: H"; detailed, both have exit code -1.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.config import ENV_NAME_RE, HOST_NAME_RE
from orchestrator.results import HostResult

# CVS's exit code for "unknown / aborted": a timeout, a host not reached, a
# command that ended without an exit status (its Pssh gives -1 for all three).
ABORTED_EXIT = -1
UNREACHABLE_MARK = "ABORT: Host Unreachable Error"
TIMEOUT_MARK = "ABORT: Timeout Error in Host"
# CVS's Pssh turns each tab of the output into three spaces.
TAB = "   "
# Where CVS writes the hostfile of distribute_using_mpi (on the head, in the container).
MPI_HOSTFILE = "/tmp/mpi_hosts.txt"


def _lines(text: str) -> str:
    """Each line ending in a newline, tabs as three spaces: how CVS collects output."""
    if not text:
        return ""
    text = text.replace("\t", TAB)
    return text if text.endswith("\n") else text + "\n"


def cvs_output(result: HostResult) -> str:
    """stdout, then stderr, then (when it did not run to the end) why, in CVS's words.

    A timeout: the reason, then `ABORT: Timeout Error in Host: H`. A host not
    reached: the reason, then a blank line and `ABORT: Host Unreachable Error`
    (CVS appends that marker after the output, without a newline).
    """
    text = _lines(result.stdout) + _lines(result.stderr)
    if not result.reached:
        why = f"{result.status}: {result.error or 'not reached'!s}".replace("\t", TAB)
        return f"{text}{why}\n\n{UNREACHABLE_MARK}"
    if result.status == "timeout":
        why = str(result.error or "timed out").replace("\t", TAB)
        return f"{text}{why}\n{TIMEOUT_MARK}: {result.host}\n"
    if result.exit_code is None and result.error:
        text += f"ABORT: {result.error!s}\n".replace("\t", TAB)
    return text


def cvs_exit_code(result: HostResult) -> int:
    """The command's exit code; -1 (CVS's "unknown / aborted") when it has none:
    a timeout, a host not reached, a command killed before it ended."""
    if result.status == "timeout" or not result.reached or result.exit_code is None:
        return ABORTED_EXIT
    return result.exit_code


def cvs_shape(results: Mapping[str, HostResult], *, detailed: bool) -> dict[str, Any]:
    """`{host: output}`, or `{host: {"output", "exit_code"}}` when detailed."""
    if detailed:
        return {
            h: {"output": cvs_output(r), "exit_code": cvs_exit_code(r)} for h, r in results.items()
        }
    return {h: cvs_output(r) for h, r in results.items()}


def not_in_cluster(host: str) -> HostResult:
    """The result for a host a suite named that the cluster file does not have."""
    return HostResult(
        host=host,
        status="unreachable",
        error=f"{host!r} is not a host of the cluster file (not in node_dict)",
    )


def mpi_hostfile_text(mpi_hosts: Sequence[str], ranks_per_host: int) -> str:
    """CVS's hostfile: `HOST slots=N` per host, in the given order."""
    if isinstance(ranks_per_host, bool) or not isinstance(ranks_per_host, int):
        raise ValueError(f"ranks_per_host must be an integer, got {ranks_per_host!r}")
    if ranks_per_host < 1:
        raise ValueError(f"ranks_per_host must be at least 1, got {ranks_per_host}")
    if not mpi_hosts:
        raise ValueError("mpi_hosts is empty")
    for host in mpi_hosts:
        if not isinstance(host, str) or not HOST_NAME_RE.fullmatch(host):
            raise ValueError(f"mpi_hosts: {host!r} is not a host name or address")
    return "".join(f"{h} slots={ranks_per_host}\n" for h in mpi_hosts)


def mpirun_command(
    rank_cmd: str,
    *,
    ranks: int,
    env_vars: Mapping[str, Any] | None,
    mpi_install_dir: str,
    mpi_extra_args: Sequence[str] | None = None,
    hostfile: str = MPI_HOSTFILE,
) -> str:
    """`MPI_DIR/mpirun --np N --allow-run-as-root --hostfile F EXTRA -x K=V ... RANK_CMD`.

    No `plm_rsh_args` disabling host-key checks (CVS's line has them): every
    container's ssh config already maps each peer to its sshd port with strict
    host keys. `mpi_extra_args` and `rank_cmd` are shell text, as under CVS;
    env values are quoted.
    """
    if ranks < 1:
        raise ValueError(f"the number of ranks must be at least 1, got {ranks}")
    mpirun = f"{str(mpi_install_dir).rstrip('/')}/mpirun"
    parts = [shlex.quote(mpirun), "--np", str(ranks), "--allow-run-as-root"]
    parts += ["--hostfile", shlex.quote(hostfile)]
    parts += [str(a) for a in (mpi_extra_args or [])]
    for key, value in (env_vars or {}).items():
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
            raise ValueError(f"env_vars: {key!r} is not an environment variable name")
        parts += ["-x", shlex.quote(f"{key}={value}")]
    parts.append(rank_cmd)
    return " ".join(parts)


def mpi_command_line(
    rank_cmd: str,
    mpi_runner_args: Sequence[str],
    env_vars: Mapping[str, Any] | None,
    mpi_install_dir: str,
) -> str:
    """CVS's `get_mpi_command`: `MPI_DIR/mpirun RUNNER_ARGS -x K=V ... RANK_CMD`.

    Without CVS's `plm_rsh_args` that turn host-key checks off (see
    mpirun_command); runner args and `rank_cmd` are shell text, env values quoted.
    """
    mpirun = f"{str(mpi_install_dir).rstrip('/')}/mpirun"
    parts = [shlex.quote(mpirun), *(str(a) for a in mpi_runner_args)]
    for key, value in (env_vars or {}).items():
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
            raise ValueError(f"env_vars: {key!r} is not an environment variable name")
        parts += ["-x", shlex.quote(f"{key}={value}")]
    parts.append(rank_cmd)
    return " ".join(parts)
