"""A scripted `HostRunner` (orchestrator/ssh/seam.py): hosts that answer from a
script instead of over SSH, shipped with the package as httpx ships
`MockTransport`, for fast tests of what the lifecycle, the locks and the
fan-out do with the answers (rollback, the barrier, lock refusals, partial
failures, timeouts). Everything that crosses SSH or touches a container
runtime is still tested for real on the sandbox; this adds tests, it
replaces none.

    hosts = ScriptedHosts({"h1": PROBE, "h2": PROBE})
    hosts.succeed("setup", "verify")
    hosts.answer("run", lambda host, text: (1, "", "no space") if host == "h2" else None)

A command is answered by the first rule for its label that returns an
answer. One nobody scripted fails the test (`Unscripted`): a wrong argv or
an unexpected step cannot pass for a success. An answer may take time
(`Delay`): one that takes longer than the command's timeout comes back as
a `timeout` result when that timeout has passed, as over SSH; one with no
timeout that never ends is an error (every remote operation is bounded).

A command to a container's sshd (an `Endpoint` target) is answered by the
same rules, as its host's (`endpoints` records where each went).

Every command is recorded (`calls`). The remote programs' argv (`sh -c
PROGRAM cvs-NAME ARG…`, orchestrator/remote) is read by the program's name
and its arguments' names (`RemoteProgram`), never by position in the argv.
"""

from __future__ import annotations

import contextlib
import math
import shlex
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.seam import Command, HeldRequest, HostRunner, Request
from orchestrator.ssh.target import Endpoint, Target, host_of

__all__ = [
    "HANG",
    "Answer",
    "Delay",
    "HeldProcess",
    "RemoteProgram",
    "Rule",
    "ScriptedHosts",
    "Unscripted",
    "remote_program",
]


@dataclass(frozen=True)
class Delay:
    """An answer that takes `seconds` (inf: never ends)."""

    seconds: float
    then: tuple[int, str, str] = (0, "", "")


HANG = Delay(math.inf)

# (exit code, stdout, stderr), a Delay, or None: the next rule.
Answer = tuple[int, str, str] | Delay | None
Rule = Callable[[str, str], Answer]  # (host, command text) -> answer


class Unscripted(AssertionError):
    """A command the script did not say how to answer, or one that would wait
    forever: the test is wrong, or the code under test is."""


# The arguments of the remote programs the fake reads, by name, in the order
# of each program's usage line (remote/NAME.sh; tests/test_scripted.py holds
# them to it).
PROGRAM_ARGS: Mapping[str, tuple[str, ...]] = {
    "lock": ("lockdir", "mode", "wait", "description", "lease"),
}


@dataclass(frozen=True)
class RemoteProgram:
    """A remote program's call: its name (`lock` for `cvs-lock`), its named
    arguments and whatever follows them."""

    name: str
    args: Mapping[str, str]
    rest: tuple[str, ...] = ()


def remote_program(command: Command) -> RemoteProgram | None:
    """The program `command` runs (`sh -c PROGRAM cvs-NAME ARG…`), else None."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if len(argv) < 4 or argv[:2] != ["sh", "-c"] or not argv[3].startswith("cvs-"):
        return None
    name = argv[3].removeprefix("cvs-")
    names = PROGRAM_ARGS.get(name, ())
    given = argv[4:]
    return RemoteProgram(name, dict(zip(names, given, strict=False)), tuple(given[len(names) :]))


class _Lines:
    def __init__(self, text: str) -> None:
        self._lines = text.splitlines(keepends=True)

    async def readline(self) -> str:
        return self._lines.pop(0) if self._lines else ""

    async def read(self) -> str:
        rest, self._lines = "".join(self._lines), []
        return rest


@dataclass
class _Stdin:
    written: list[str] = field(default_factory=list)

    def write(self, data: str) -> None:
        self.written.append(data)

    def write_eof(self) -> None:
        pass


@dataclass
class HeldProcess:
    """A lock holder: prints its frames (and the probe's output), then holds."""

    host: str
    command: str
    program: RemoteProgram | None
    stdout: _Lines
    stderr: _Lines = field(default_factory=lambda: _Lines(""))
    stdin: _Stdin = field(default_factory=_Stdin)
    closed: bool = False

    @property
    def mode(self) -> str:
        """The lock's mode: s (shared) or x (exclusive)."""
        return self.program.args.get("mode", "") if self.program else ""


class ScriptedHosts(HostRunner):
    """Hosts answering from a script; see the module doc."""

    def __init__(self, probes: Mapping[str, str]) -> None:
        self.probes = dict(probes)  # host -> what its probe prints under the lock
        self.lock: dict[str, str] = {}  # host -> lock frames instead of "held"
        self.calls: list[tuple[str, str, str]] = []  # (host, label, command text)
        self.timeouts: list[tuple[str, str, float | None]] = []  # (host, label, timeout)
        self.held: list[HeldProcess] = []
        self.endpoints: list[Endpoint] = []  # the Endpoint targets, in order
        self._rules: dict[str, list[Rule]] = {}
        self._succeeding: set[str] = set()  # labels answered with success after every rule

    def answer(self, label: str, rule: Rule) -> None:
        """Answer commands labelled `label` with `rule` (after the rules before it)."""
        self._rules.setdefault(label, []).append(rule)

    def succeed(self, *labels: str) -> None:
        """Answer these labels with success and no output when no rule for
        them answers (whenever those rules were added)."""
        self._succeeding.update(labels)

    def labels(self, host: str | None = None) -> list[str]:
        return [label for h, label, _ in self.calls if host is None or h == host]

    async def send(self, target: Target, request: Request) -> HostResult:
        host, text, label, timeout = host_of(target), request.text, request.label, request.timeout
        if isinstance(target, Endpoint):
            self.endpoints.append(target)
        self.calls.append((host, label or "", text))
        self.timeouts.append((host, label or "", timeout))
        await anyio.sleep(0.001)  # other hosts' work goes on meanwhile, as over SSH
        got = self._answer(host, label or "", text)
        if isinstance(got, Delay):
            if math.isinf(got.seconds) and timeout is None:
                raise Unscripted(f"{host}: {label or text!r} never ends and has no timeout")
            if timeout is not None and got.seconds > timeout:
                await anyio.sleep(timeout)
                return HostResult(
                    host, "timeout", error=f"timed out after {timeout:g}s", duration=timeout
                )
            await anyio.sleep(got.seconds)
            got = got.then
        rc, out, err = got
        if rc == 0:
            return HostResult(host, "ok", 0, out, err)
        return HostResult(host, "failed", rc, out, err, error=err.strip() or f"exit {rc}")

    async def send_many(
        self, requests: Mapping[str, Request], *, limit: int | None = None
    ) -> dict[str, HostResult]:
        """`send` for each host, all at once (as over SSH, a slow host delays only itself)."""

        async def one(host: str) -> HostResult:
            return await self.send(host, requests[host])

        return await fan_out(list(requests), one, limit=limit)

    def _answer(self, host: str, label: str, text: str) -> tuple[int, str, str] | Delay:
        for rule in self._rules.get(label, []):
            got = rule(host, text)
            if got is not None:
                return got
        if label in self._succeeding:
            return (0, "", "")
        raise Unscripted(f"{host}: no answer scripted for label {label!r}: {text[:200]}")

    @contextlib.asynccontextmanager
    async def held_process(self, target: Target, held: HeldRequest) -> AsyncIterator[Any]:
        host, text = host_of(target), held.text
        self.calls.append((host, "held", text))
        program = remote_program(held.command) if isinstance(target, str) else None
        if program is None or program.name != "lock":
            raise Unscripted(f"{host}: only the lock is a held process here, not {text[:200]}")
        frames = self.lock.get(host, f"@@cvs:lock held {program.args['mode']}\n")
        body = frames
        if frames.startswith("@@cvs:lock held"):
            body += self.probes.get(host, "") + "@@cvs:ready\n"
        process = HeldProcess(host, text, program, _Lines(body))
        self.held.append(process)
        try:
            yield process
        finally:
            process.closed = True
