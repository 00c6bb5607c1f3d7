"""Start and stop the daemons the sandbox owns, strictly by pid.

A pid recorded in sandbox.json may be stale after a crash or a reboot and may
by now belong to some unrelated process, so before signalling we check that
/proc/PID/cmdline still contains what we started (the config path or socket
that is unique to this sandbox). Zombies have an empty cmdline and count as
gone.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class CommandError(subprocess.CalledProcessError):
    """A helper command failed; `str()` names it and quotes its stderr."""

    def __str__(self) -> str:
        return f"`{shlex.join(self.cmd)}` exited {self.returncode}: {self.stderr or '(no stderr)'}"


def run(argv: Sequence[str], *, check: bool = True, input: bytes | None = None) -> str:
    """Run a short helper command; on failure raise `CommandError` with its stderr."""
    proc = subprocess.run(list(argv), input=input, capture_output=True)
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise CommandError(proc.returncode, list(argv), proc.stdout, err)
    return proc.stdout.decode(errors="replace")


def run_env(argv: Sequence[str], *, env: dict[str, str], timeout: float, check: bool = True) -> str:
    """`run` with an environment and a time bound (a hang is a CommandError too)."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        if not check:
            return ""
        raise CommandError(124, list(argv), b"", f"no answer within {timeout:.0f}s") from None
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise CommandError(proc.returncode, list(argv), proc.stdout, err)
    return proc.stdout.decode(errors="replace")


def spawn(argv: Sequence[str], log_file: Path, *, tmpdir: Path | None = None) -> int:
    """Start a long-running daemon in its own session, output to `log_file`.

    `tmpdir` becomes the daemon's TMPDIR (created 0700): what it and its
    children leave in their temp directory (containerd writes a stack dump,
    `containerd.<pid>.stacks.log`, whenever dockerd restarts or stops it
    roughly) stays in the sandbox and goes with it, not in the machine's /tmp.
    """
    env = None
    if tmpdir is not None:
        tmpdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {**os.environ, "TMPDIR": str(tmpdir)}
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    return proc.pid


def alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[:1] != ["Z"]


def cmdline(pid: int, *, retry: bool = True) -> list[str]:
    # While a process is in execve (nsenter -> dockerd) its cmdline reads as
    # empty for a moment; retry briefly instead of calling it gone. Scans of
    # all of /proc skip that (kernel threads have an empty cmdline for good).
    for _ in range(20 if retry else 1):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return []
        if raw or not alive(pid):
            break
        time.sleep(0.01)
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_ours(pid: int | None, marker: str, *, retry: bool = True) -> bool:
    """True if `pid` is alive and its command line still mentions `marker`."""
    if not pid or pid <= 0:
        return False
    return any(marker in arg for arg in cmdline(pid, retry=retry))


def _reap(pid: int) -> None:
    # Daemons spawned by this very process turn into zombies when they exit;
    # collect them so they do not linger (no-op when not our child).
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(pid: int | None, marker: str, *, timeout: float = 10.0) -> str:
    """SIGTERM, wait up to `timeout`, then SIGKILL; only if the pid is still ours.

    Returns "gone" (was not running, or no longer ours), "terminated" or "killed".
    """
    if not is_ours(pid, marker):
        if pid:
            _reap(pid)
        return "gone"
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_ours(pid, marker):
            return "terminated"
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and is_ours(pid, marker):
        _reap(pid)
        time.sleep(0.05)
    return "killed"


def wait_for(
    predicate: Callable[[], object], *, timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll `predicate()` until true; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc/*/stat)."""
    found = []
    for candidate in _all_pids():
        try:
            stat = Path(f"/proc/{candidate}/stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may contain spaces; fields after it are fixed.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(candidate)
    return found


def pids_mentioning(marker: str) -> list[int]:
    """Live processes whose command line mentions `marker` (a path unique to us)."""
    me = os.getpid()
    return [pid for pid in _all_pids() if pid != me and is_ours(pid, marker, retry=False)]


def kill_now(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)


def mounts_under(roots: Sequence[Path]) -> list[str]:
    """Mount points at or below any of `roots`, deepest first (for unmounting)."""
    prefixes = [str(r).rstrip("/") + "/" for r in roots]
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if any((point + "/").startswith(p) for p in prefixes):
                found.append(point)
    return sorted(found, key=len, reverse=True)
