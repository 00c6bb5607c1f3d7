"""A scripted `HostRunner` (orchestrator/ssh/seam.py): hosts that answer from
a script instead of over SSH, for fast tests of what the lifecycle does with
the answers (rollback, the barrier, lock refusals, partial failures).

Not a test module: tests import it as they import private_dockerd.

    hosts = ScriptedHosts({"h1": absent(), "h2": absent()})
    hosts.answer("run", lambda host, text: (1, "", "no space") if host == "h2" else None)

Every command is recorded (`calls`: host, label, command text). A command is
answered by the first rule for its label that returns an answer, else with
success and no output.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchestrator.results import HostResult

Answer = tuple[int, str, str] | None  # (exit code, stdout, stderr); None: next rule
Rule = Callable[[str, str], Answer]  # (host, command text) -> answer

IMAGE_ID = "sha256:" + "a" * 64


def probe_output(
    name: str = "ctr",
    image: str = "img:1",
    *,
    image_id: str | None = IMAGE_ID,
    cpus: int = 8,
    memory_kb: int = 64 * 1024 * 1024,
) -> str:
    """What remote/probe.sh prints for a host where container `name` is
    absent and `image` resolves to `image_id` (None: not on the host)."""
    objects, errors = [], [f"Error: No such object: {name}"]
    if image_id is not None:
        objects.append(json.dumps({"Id": image_id, "RepoDigests": [], "RootFS": {}}))
    else:
        errors.append(f"Error: No such object: {image}")
    return "".join(
        [
            "@@cvs:probe 3\n",
            f"@@cvs:args {name} {image}\n",
            f"@@cvs:capacity {cpus} {memory_kb}\n",
            "@@cvs:section inspect.direct 1 raw\n",
            *(f"J {o}\n" for o in objects),
            *(f"E {e}\n" for e in errors),
            "@@cvs:end inspect.direct\n",
            "@@cvs:facts - - no\n",
            "@@cvs:done\n",
        ]
    )


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
    mode: str  # the lock's: s (shared) or x (exclusive)
    stdout: _Lines
    stderr: _Lines = field(default_factory=lambda: _Lines(""))
    stdin: _Stdin = field(default_factory=_Stdin)
    closed: bool = False


class ScriptedHosts:
    """Hosts answering from a script; see the module doc."""

    def __init__(self, probes: dict[str, str]) -> None:
        self.probes = probes  # host -> what its probe prints
        self.lock: dict[str, str] = {}  # host -> lock frames instead of "held"
        self.calls: list[tuple[str, str, str]] = []
        self.held: list[HeldProcess] = []
        self._rules: dict[str, list[Rule]] = {}

    def answer(self, label: str, rule: Rule) -> None:
        self._rules.setdefault(label, []).append(rule)

    def labels(self, host: str | None = None) -> list[str]:
        return [label for h, label, _ in self.calls if host is None or h == host]

    async def run(
        self,
        host: str,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        input: str | bytes | None = None,
        env: dict[str, str] | None = None,
        stream_output: bool = True,
        label: str | None = None,
        on_timeout: Callable[[], str | Sequence[str]] | None = None,
    ) -> HostResult:
        text = command if isinstance(command, str) else shlex.join(command)
        self.calls.append((host, label or "", text))
        await anyio.sleep(0.001)  # other hosts' work goes on meanwhile, as over SSH
        for rule in self._rules.get(label or "", []):
            got = rule(host, text)
            if got is not None:
                rc, out, err = got
                status = "ok" if rc == 0 else "failed"
                error = None if rc == 0 else (err.strip() or f"exit {rc}")
                return HostResult(host, status, rc, out, err, error=error)
        return HostResult(host, "ok", 0, "", "")

    @contextlib.asynccontextmanager
    async def held_process(
        self, host: str, command: str | Sequence[str], *, encoding: str | None = "utf-8"
    ) -> AsyncIterator[Any]:
        text = command if isinstance(command, str) else shlex.join(command)
        self.calls.append((host, "held", text))
        argv = shlex.split(text)  # sh -c LOCK cvs-lock PATH s|x WAIT DESC [PROBE ARG…]
        mode = argv[5] if len(argv) > 5 else "s"
        frames = self.lock.get(host, f"@@cvs:lock held {mode}\n")
        body = frames
        if frames.startswith("@@cvs:lock held"):
            body += self.probes.get(host, "") + "@@cvs:ready\n"
        process = HeldProcess(host, text, mode, _Lines(body))
        self.held.append(process)
        try:
            yield process
        finally:
            process.closed = True
