"""Per-host locks by intent, held by a remote process tied to the SSH channel.

Who takes what (docs/design.md, "Sharing a cluster"):

- a run, `exec`, and an `up` that only attaches hold the host's lock SHARED,
  so any number of them use the same containers at once;
- whatever starts, replaces or removes a container (an `up` that changes
  something, `down`) holds it EXCLUSIVELY.

The lock is `flock(2)` on a directory `/tmp/cvs-<container>-<host>.lock`,
taken by a shell on the host (remote/lock.sh) that then probes (one round
trip: lock + probe) and waits on its stdin. Closing the channel (or our process dying, which
closes the connection) ends that shell, which releases the lock: a lock can
never outlive its invocation, and it never waits on our own output. Where the
connection dies without a word (a silent network, no FIN: the host's sshd may
take hours to notice), the lease ends it: we renew it every RENEW_SECONDS
(`LeaseRenewer`) and the shell lets go after LEASE_SECONDS without a renewal.

A directory, not a file: flock(1) opens a directory read-only, which works
whoever created it, where an existing file in sticky /tmp cannot be opened
with O_CREAT by another user (fs.protected_regular).

The directory is removed by the last one out, without a race: a holder
removes it only while holding it exclusively AND after checking that the path
still names the inode it locked; whoever locks a directory that was removed
meanwhile (the check fails) drops it and locks the new one. So a removed lock
is never mistaken for a held one, and nothing accumulates under /tmp.

Each holder leaves one line in the directory (`h.<pid>`: user@machine, pid,
what it does), so an invocation that has to wait says on whom.

Acquisition, in the uncontended case one round trip for all hosts at once:
every host's lock is tried without waiting. Only when some host's lock is
busy are they taken in the one order every invocation shares, sorted host
names: what sorts after the first busy host is let go, that host waited on,
the rest tried again, and so on (`_take_in_order`). An invocation waits on a
host only while holding none that sorts after it, so two invocations can
never each hold a host the other waits for, whatever their `--hosts` subsets
and modes (a head-first order could: `--hosts` changes the head).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import re
import shlex
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from orchestrator import remote
from orchestrator.config import ClusterConfig, container_name
from orchestrator.containers.invocation import Invocation
from orchestrator.containers.probe import HostState, parse_probe_output
from orchestrator.errors import ConnectError, Option, PolicyRefused, Refusal, WayOut
from orchestrator.events import EventSink, Message
from orchestrator.remote.frames import FRAME, READY, split_lock_frames
from orchestrator.remote.runtime import runtime_hung
from orchestrator.ssh.envpass import new_token
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.seam import HeldRequest, HostRunner

Mode = Literal["shared", "exclusive"]
# The lock's lease (issue 22): we renew it every RENEW_SECONDS over the SSH
# channel; a holder on the host that hears nothing for LEASE_SECONDS lets go.
RENEW_SECONDS = 5.0
LEASE_SECONDS = 20
# The holder looks for a renewal LEASE_TICKS times a lease and lets go after
# LEASE_TICKS - 1 looks in a row found none: (3/4, 1] of the lease after the
# last renewal, never more (looking once a lease would give up to two). At
# 20 s and a renewal every 5 s: a coordinator silent for up to 15 s keeps its
# locks, and one gone for good frees them within 20 s of its last word.
LEASE_TICKS = 4
LOCK_ROOT = "/tmp"
_HOST_PART_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_DESCRIPTION_UNSAFE = re.compile(r"[^A-Za-z0-9@._:/ ()+=,-]")


def lock_path(container: str, host: str) -> str:
    """The host's lock directory for this container name.

    The host's name is in the path as well as the container's: hosts that
    share a filesystem (the sandbox's namespaces do) must not share a lock.
    """
    for part in (container, host):
        if not _HOST_PART_RE.fullmatch(part):
            raise ValueError(f"cannot build a lock path from {part!r}")
    return f"{LOCK_ROOT}/cvs-{container}-{host}.lock"


def holder_description(purpose: str) -> str:
    """`user@machine pid N: purpose`, in characters safe for one line anywhere."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    text = f"{user}@{socket.gethostname()} pid {os.getpid()}: {purpose}"
    return _DESCRIPTION_UNSAFE.sub("?", text)[:200]


def lock_command(
    path: str,
    mode: Mode,
    *,
    wait: float | None,
    description: str,
    probe: Sequence[str] | None = None,
    lease: float | None = LEASE_SECONDS,
) -> str:
    """The remote command (remote/lock.sh): lock `path` (waiting up to `wait` s,
    None = not at all), run `probe` while holding it, then hold until stdin
    closes, or until no line came on stdin for `lease` seconds (None: no
    lease; `LeaseRenewer` keeps it; a fraction of a second is for tests: the
    host's sleep(1) must take it). `probe` is a program's argv, `sh -c
    PROGRAM $0 ARG…`: it runs in the lock's shell (a subshell; no new process)."""
    seconds = "no" if wait is None else str(max(0, int(wait)))
    flag = "s" if mode == "shared" else "x"
    then: list[str] = []
    if probe is not None:
        if list(probe[:2]) != ["sh", "-c"] or len(probe) < 4:
            raise ValueError("the program run under the lock must be `sh -c PROGRAM NAME ARG…`")
        then = [probe[2], *probe[4:]]
    held_for = "none" if lease is None else f"{_seconds(lease / LEASE_TICKS)}:{LEASE_TICKS - 1}"
    return shlex.join(remote.argv("lock", path, flag, seconds, description, held_for, *then))


def _seconds(value: float) -> str:
    """What any sleep(1) takes: 5 stays "5", 0.15 is "0.15"; never 0."""
    return f"{max(0.01, value):.3f}".rstrip("0").rstrip(".")


# --- reading the holder's answer ---------------------------------------------

LockStatus = Literal["held", "busy", "timeout", "noflock", "error", "unreachable"]


@dataclass
class LockAnswer:
    """What one host's lock attempt came to."""

    host: str
    status: LockStatus
    holders: list[str] = field(default_factory=list)
    state: HostState | None = None  # the probe, when one ran under the lock
    error: str | None = None


def describe_holders(holders: Sequence[str]) -> str:
    """The holders for a message. The lines come from a directory any local
    user can write to: only the characters cvs itself writes get through
    (no terminal escapes, no markup), each line cut at 200."""
    if not holders:
        return "another cvs invocation"
    shown = ", ".join(dict.fromkeys(_DESCRIPTION_UNSAFE.sub("?", h)[:200] for h in holders))
    return shown if len(shown) <= 300 else shown[:297] + "..."


# --- holding locks on a set of hosts ---------------------------------------------


class HostLocks:
    """The locks one invocation holds on a cluster's hosts, one remote holder each."""

    def __init__(
        self,
        pool: HostRunner,
        sink: EventSink,
        container: str,
        *,
        head: str,
        wait_seconds: float,
        probe_seconds: float = 30.0,
        runtime: str = "docker",
        on_release: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        self.pool = pool
        self.sink = sink
        self.container = container
        self.head = head
        self.wait_seconds = wait_seconds
        # The probe under the lock runs docker (container.runtime_timeout): a
        # frozen dockerd must not hold the invocation, nor the lock, forever.
        self.probe_seconds = probe_seconds
        self.runtime = runtime  # docker or podman: what a hang message names
        self.description = holder_description("cvs")
        self.mode: Mode | None = None
        self._held: dict[str, tuple[contextlib.AsyncExitStack, Any]] = {}
        # Told the hosts let go, on every release (containers/invocation.py:
        # what an `up` left ready there is no longer held).
        self._on_release = on_release
        self._guarded: set[str] = set()

    @property
    def hosts(self) -> list[str]:
        return list(self._held)

    def holds(self, hosts: Sequence[str]) -> bool:
        return bool(hosts) and all(h in self._held for h in hosts)

    async def acquire(
        self,
        hosts: Sequence[str],
        mode: Mode,
        *,
        wait: bool = True,
        probe: Callable[[str], Sequence[str]] | None = None,
        purpose: str = "cvs",
    ) -> dict[str, LockAnswer]:
        """Lock every host in `mode` (probing under the lock when `probe`, the
        probe's argv for a host, is given).

        Raises PolicyRefused, with nothing held, when a host has no `flock`,
        a lock stays busy (`wait` False) or the wait times out. Unreachable
        hosts come back as answers with an unreachable state.
        """
        await self.release()
        self.mode = mode
        self.description = holder_description(purpose)

        def script(host: str) -> Sequence[str] | None:
            return probe(host) if probe is not None else None

        answers = await fan_out(list(hosts), lambda h: self._take(h, mode, None, script(h)))
        busy = [h for h, a in answers.items() if a.status == "busy"]
        if busy:
            if not wait:
                await self.release()
                raise PolicyRefused(self._busy_reasons(answers, busy, waited=False))
            answers = await self._take_in_order(hosts, answers, mode, script)
        problems = self._problems(answers)
        if problems:
            await self.release()
            raise PolicyRefused(problems)
        return answers

    async def _take_in_order(
        self,
        hosts: Sequence[str],
        tried: Mapping[str, LockAnswer],
        mode: Mode,
        script: Callable[[str], Sequence[str] | None],
    ) -> dict[str, LockAnswer]:
        """Every host's lock, waiting, in the one order every invocation shares:
        sorted host names. It waits on a host only while it holds none that
        sorts after it, so no two invocations can each hold what the other
        waits for, whatever their host subsets (a waits-for cycle would need
        a host sorting before itself). What a try got before the first busy
        host is kept; the rest is let go, the busy host waited on, the rest
        tried again without waiting (one round trip each, in parallel)."""
        order = sorted(hosts)
        answers = dict(tried)
        while busy := [h for h in order if answers[h].status == "busy"]:
            first = order.index(busy[0])
            after = order[first + 1 :]
            await self.release(after)
            answer = await self._take(order[first], mode, self.wait_seconds, script(order[first]))
            answers[order[first]] = answer
            if answer.status not in ("held", "unreachable"):
                # Refused below; queue on nothing after it.
                answers = {h: answers[h] for h in order[: first + 1]}
                break
            answers.update(await fan_out(after, lambda h: self._take(h, mode, None, script(h))))
        return {h: answers[h] for h in hosts if h in answers}

    def _problems(self, answers: Mapping[str, LockAnswer]) -> list[Refusal | str]:
        """Why the acquisition must be refused (empty: it may go on)."""
        reasons: list[Refusal | str] = []
        no_flock = [h for h, a in answers.items() if a.status == "noflock"]
        if no_flock:
            reasons.append(
                f"{', '.join(no_flock)}: no `flock` on the host (util-linux); cvs does not "
                "touch containers it cannot lock against other invocations: install "
                "util-linux there, or remove those hosts from the cluster file"
            )
        timed_out = [h for h, a in answers.items() if a.status == "timeout"]
        reasons += self._busy_reasons(answers, timed_out, waited=True)
        reasons += [
            f"{h}: cannot take the lock: {a.error}"
            for h, a in answers.items()
            if a.status == "error"
        ]
        return reasons

    def _busy_reasons(
        self, answers: Mapping[str, LockAnswer], hosts: list[str], *, waited: bool
    ) -> list[Refusal]:
        how = f"still held after waiting {self.wait_seconds:g}s" if waited else "held (not waiting)"
        ways = [WayOut("retry later")]
        if not waited:
            ways.append(WayOut("wait for it", options=(Option("wait"),)))
        return [
            Refusal(
                "lock_busy",
                f"{h}: the lock on container {self.container} is {how} by "
                f"{describe_holders(answers[h].holders)}; nothing was changed",
                (h,),
                tuple(ways),
            )
            for h in hosts
        ]

    async def _take(
        self, host: str, mode: Mode, wait: float | None, probe: Sequence[str] | None
    ) -> LockAnswer:
        path = lock_path(self.container, host)
        command = lock_command(path, mode, wait=wait, description=self.description, probe=probe)
        stack = contextlib.AsyncExitStack()
        try:
            process = await stack.enter_async_context(
                self.pool.held_process(host, HeldRequest(command))
            )
        except ConnectError as exc:
            await stack.aclose()
            return LockAnswer(host, "unreachable", state=HostState.unreachable(host, exc.message))
        # Renew the lease from the start: the holder lets go of a lock whose
        # renewals stop (a dead coordinator, a silent network), LEASE_SECONDS on.
        stack.callback(LeaseRenewer(process, on_lost=lambda: self._lost(host)).cancel)
        answer = await self._read(host, process, path, probe is not None)
        if answer.state is not None and answer.state.error_kind == "runtime_hung":
            # The probe is stuck in the runtime: stop it (TERM to the remote
            # process group; the lock program's traps release the lock and
            # remove its directory) instead of holding the lock behind it.
            with contextlib.suppress(Exception):
                process.send_signal("TERM")
            await stack.aclose()
            return answer
        if answer.status == "held":
            self._held[host] = (stack, process)
        else:
            await stack.aclose()
        return answer

    async def _read(self, host: str, process: Any, path: str, probing: bool) -> LockAnswer:
        lines: list[str] = []
        holders: list[str] = []
        probe_hung = False
        with anyio.CancelScope(deadline=anyio.current_time() + self.wait_seconds + 60) as scope:
            while line := await process.stdout.readline():
                lines.append(line)
                word = line.strip()
                if probing and word.startswith(FRAME + "lock held"):
                    # Locked: from here on the probe's docker calls run.
                    scope.deadline = anyio.current_time() + self.probe_seconds
                    probe_hung = True
                elif word.startswith(FRAME + "holder "):
                    holders.append(word[len(FRAME + "holder ") :])
                elif word == FRAME + "lock waiting":
                    self._say_waiting(host, path, holders)
                    holders = []
                elif word == READY or word.startswith(
                    tuple(FRAME + "lock " + w for w in ("busy", "timeout", "noflock", "error"))
                ):
                    probe_hung = False
                    break
            else:
                probe_hung = False
        if probe_hung and scope.cancelled_caught:
            why = runtime_hung(self.runtime, self.probe_seconds, "the probe")
            return LockAnswer(host, "held", holders, HostState.hung(host, why))
        status, _, rest = split_lock_frames("".join(lines))
        kind, _, detail = (status or "").partition(" ")
        if kind == "held":
            state = None
            if probing:
                done = lines[-1].strip() == READY
                state = parse_probe_output(host, 0 if done else 1, rest, "" if done else "lost")
            return LockAnswer(host, "held", holders, state)
        if kind in ("busy", "timeout", "noflock"):
            return LockAnswer(host, kind, holders)  # type: ignore[arg-type]
        if kind == "error":
            return LockAnswer(host, "error", holders, error=detail)
        err = await _drain(process.stderr)
        tail = (err or rest).strip().splitlines()[-1:] or ["no answer from the lock program"]
        return LockAnswer(host, "error", holders, error=f"{path}: {tail[0]}")

    def _lost(self, host: str) -> None:
        if host not in self._held:
            return
        self.sink.emit(
            Message(
                level="warning",
                host=host,
                text=f"the lock on container {self.container} was lost on {host} (its lease "
                f"of {LEASE_SECONDS}s ran out: the host did not hear from cvs); another "
                "invocation may change the container there now",
            )
        )

    def _say_waiting(self, host: str, path: str, holders: list[str]) -> None:
        self.sink.emit(
            Message(
                level="info",
                host=host,
                text=f"waiting for the lock on container {self.container} held by "
                f"{describe_holders(holders)} ({path}, up to {self.wait_seconds:g}s)",
            )
        )

    async def downgrade(self) -> None:
        """Exclusive -> shared, on every held host (never blocks: we hold it)."""
        if self.mode != "exclusive":
            return
        for _, process in self._held.values():
            with contextlib.suppress(Exception):
                process.stdin.write("shared\n")
        self.mode = "shared"

    def guard(self, host: str, text: str) -> None:
        """Give `host`'s holder `text`, host shell text that ends this
        invocation's commands there (once per host): the holder runs it when
        it ends without our `release` (we died, or went silent past the
        lease), so the commands go with the lock (remote/lock.sh)."""
        held = self._held.get(host)
        if held is None or host in self._guarded:
            return
        end = new_token()
        with contextlib.suppress(Exception):
            held[1].stdin.write(f"guard {end}\n{text}\n{end}\n")
            self._guarded.add(host)

    async def release(self, hosts: Sequence[str] | None = None) -> None:
        """Close the holders (all, or those of `hosts`): the remote shells
        release, told first that this is in order (no guard to run)."""
        chosen = [h for h in (hosts if hosts is not None else list(self._held)) if h in self._held]
        for h in chosen:
            self._guarded.discard(h)
            with contextlib.suppress(Exception):
                self._held[h][1].stdin.write("release\n")
        stacks = [self._held.pop(h)[0] for h in chosen]
        if self._on_release is not None:
            self._on_release(chosen)
        if not stacks:
            return
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for stack in stacks:
                    tg.start_soon(stack.aclose)
        if not self._held:
            self.mode = None


class LeaseRenewer:
    """Writes `renew` to a lock holder's stdin every RENEW_SECONDS while we hold it.

    A holder that hears nothing for LEASE_SECONDS lets go (the lock program's
    watchdog): so a lock never outlives its invocation by more than that,
    whatever happened to the network or to us (SIGKILL, a host whose packets
    are dropped: its sshd would notice the dead connection only after minutes
    to hours). A timer on the event loop, not a task: locks outlive the calls
    that take them (`up` ... `down`), and no task group spans those.
    """

    def __init__(
        self,
        process: Any,
        interval: float | None = None,
        *,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self._process = process
        self._on_lost = on_lost
        self._interval = RENEW_SECONDS if interval is None else interval
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._schedule()

    def _schedule(self) -> None:
        self._handle = self._loop.call_later(self._interval, self._renew)

    def _renew(self) -> None:
        if getattr(self._process, "exit_status", None) is not None:
            # The holder ended while we still hold it: its lease ran out (our
            # renewals did not arrive) or it was killed. Say so, once.
            self._handle = None
            if self._on_lost is not None:
                self._on_lost()
            return
        try:
            # Buffered by asyncssh when the window is shut: a few bytes a tick.
            self._process.stdin.write("renew\n")
        except Exception:  # the channel is gone: there is nothing left to renew
            self._handle = None
            return
        self._schedule()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def _drain(stream: Any) -> str:
    with anyio.move_on_after(1), contextlib.suppress(Exception):
        return str(await stream.read())
    return ""


def host_locks(
    cluster: ClusterConfig, pool: HostRunner, sink: EventSink, invocation: Invocation | None = None
) -> HostLocks:
    """The lock set for this cluster's container on its hosts; what it lets go
    `invocation` hears of."""
    cfg = cluster.container
    wait = float(cfg.start_timeout) if cfg is not None else 900.0
    return HostLocks(
        pool,
        sink,
        container_name(cluster),
        head=cluster.head_host.name,
        wait_seconds=wait,
        probe_seconds=cfg.runtime_timeout if cfg is not None else 30.0,
        runtime=cfg.runtime if cfg is not None else "docker",
        on_release=invocation.let_go if invocation is not None else None,
    )
