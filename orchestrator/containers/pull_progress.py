"""Bytes done of the total while a host pulls the image (the `registry` mode).

    progress = PullProgress.for_pool(pool, sink, runtime, image)  # None: not watched
    result = await progress.run(pool, host, argv, timeout=..., label="pull")

Only what the hosts have: the runtime's own CLI prints each layer's bytes
(`docker pull`: `4f4fb700ef54: Downloading [==>  ] 12.35MB/45.67MB`;
`podman pull`: `Copying blob 4f4fb700ef54 [==>--] 1.2MiB / 10.5MiB`) when its
output is a terminal, and only then (piped, both print the layer steps
without bytes). So the pull runs on a pseudo-terminal of its SSH channel
(ssh/transport.py) and this module reads the bars as they come: one
`ImageProgress` per host at most once a second, like the spread's.

Honest about what is not known: the CLI names every layer at once but a
layer's size only once its download starts (three at a time), so the total
is 0 ("not known") until every layer's size has been read; a layer already
on the host (`Already exists`) moves nothing and counts for nothing. The
numbers are the CLI's rounded ones (4 digits for docker, one decimal for
podman): progress, not an account; the final event says done = total.

Memory: the reader keeps one partial segment (at most `SEGMENT_MAX`
characters) and one entry per layer, whatever the output's length.
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.containers.argv import image_registry
from orchestrator.events import EventSink, ImageProgress, Message
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.results import HostResult
from orchestrator.ssh.seam import Command, HostRunner
from orchestrator.ssh.stdin import ExecIO

# What asyncssh says when sshd refuses the terminal (ChannelOpenError's text).
PTY_REFUSED = "PTY request failed"
# At most one event a second per host (as containers/spread.py).
PROGRESS_EVERY = 1.0
# A terminal segment longer than this is no progress line: dropped.
SEGMENT_MAX = 4096

_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
# Terminal control: CSI sequences (cursor moves, line clears) and lone ESCs.
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b.?")
# Segments: the CLIs redraw a line with \r, move between lines with CSI;
# a segment that followed an ESC starts with the rest of its sequence.
_BREAKS = re.compile(r"[\r\n\x1b]")
_CSI_REST = re.compile(r"^(?:\x1b?(?:\[[0-9;?]*[A-Za-z]|[()][A-Za-z0-9]))+")
_DOCKER = re.compile(r"^([0-9a-f]{12}): (.*)$")
_PODMAN = re.compile(r"^Copying blob (?:sha256:)?([0-9a-f]{12})[0-9a-f]*(.*)$")
_COUNTS = re.compile(
    r"([0-9]+(?:\.[0-9]+)?)\s*([kKMGT]?i?B|b)\s*/\s*([0-9]+(?:\.[0-9]+)?)\s*([kKMGT]?i?B|b)"
)
_DONE_WORDS = ("Verifying Checksum", "Download complete", "Extracting", "Pull complete", "done")
_SKIP_WORDS = ("Already exists", "skipped")


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit.lower()])


def clean_terminal(text: str) -> str:
    """`text` from a terminal as plain lines: control sequences out, each
    redrawn line's last state kept (what the reader would see)."""
    lines = []
    for line in _CONTROL.sub("", text).split("\n"):
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
        if line.strip():
            lines.append(line.rstrip())
    return "\n".join(lines)


@dataclass
class _Layer:
    done: int = 0
    total: int | None = None
    complete: bool = False


@dataclass
class PullState:
    """What one host's pull output has said so far (pure: fed segments)."""

    layers: dict[str, _Layer] = field(default_factory=dict)

    def segment(self, text: str) -> bool:
        """One redrawn line; True when it changed a layer."""
        text = _CSI_REST.sub("", text).strip()
        m = _DOCKER.match(text) or _PODMAN.match(text)
        if m is None:
            return False
        layer_id, rest = m.group(1), m.group(2).strip(" |")
        if any(rest.startswith(w) or rest.endswith(w) for w in _SKIP_WORDS):
            return self.layers.pop(layer_id, None) is not None
        layer = self.layers.setdefault(layer_id, _Layer())
        counts = _COUNTS.search(rest)
        if counts is not None and not rest.startswith("Extracting"):
            done, total = _bytes(*counts.group(1, 2)), _bytes(*counts.group(3, 4))
            layer.done, layer.total = max(layer.done, min(done, total)), total
        elif any(rest.startswith(w) or rest.endswith(w) for w in _DONE_WORDS):
            layer.complete = True
        return True

    @property
    def done(self) -> int:
        return sum((x.total or x.done) if x.complete else x.done for x in self.layers.values())

    @property
    def total(self) -> int:
        """The sum of the layers' sizes; 0 while one is not known yet."""
        if not self.layers or any(x.total is None for x in self.layers.values()):
            return 0
        return sum(x.total or 0 for x in self.layers.values())


class PullProgress:
    """Every pulling host's state; ImageProgress events at most once a
    second per host, with the fleet's ETA once every host's total is known."""

    @classmethod
    def for_pool(
        cls, pool: HostRunner, sink: EventSink, runtime: ContainerRuntime, image: str
    ) -> PullProgress | None:
        """A watcher when `pool` can hand this process the output as it comes
        (SSHPool; a worker runner cannot): None, and the pull runs as before,
        without progress, when not. podman on a terminal asks which registry
        a short name means, so its pull is watched only when `image` names one."""
        if not pool.raw_output or (runtime.pull_asks_on_a_terminal and not image_registry(image)):
            return None
        return cls(sink)

    def __init__(self, sink: EventSink, *, every: float = PROGRESS_EVERY) -> None:
        self.sink, self.every = sink, every
        self.states: dict[str, PullState] = {}
        self.started: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def reader(self, host: str) -> Callable[[str, bytes], None]:
        """The `raw` output callback for `host`'s pull (ssh/stdin.py's RawOutput)."""
        state = self.states[host] = PullState()
        self.started[host] = time.monotonic()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = [""]

        def take(stream: str, data: bytes) -> None:
            *whole, pending[0] = _BREAKS.split(pending[0] + decoder.decode(data))
            if len(pending[0]) > SEGMENT_MAX:
                pending[0] = ""
            if any([state.segment(s) for s in whole]):
                self._emit(host)

        return take

    async def run(
        self, pool: HostRunner, host: str, command: Command, **options: Any
    ) -> HostResult:
        """`command` (the pull) on `host` on a terminal, its bars read as
        they come. An sshd that refuses a terminal (`PermitTTY no`, a key's
        `no-pty`) gets the pull as before, without progress, and that is
        said once per host."""
        result = await pool.run(host, command, io=self.io(host), pty=True, **options)
        if result.status == "unreachable" and PTY_REFUSED in (result.error or ""):
            self.states.pop(host, None)
            why = "no pull progress: its sshd refused a terminal (PermitTTY, no-pty)"
            self.sink.emit(Message(level="info", host=host, text=why))
            return await pool.run(host, command, **options)
        return self.finish(host, result)

    def io(self, host: str) -> ExecIO:
        return ExecIO(raw=self.reader(host))

    def finish(self, host: str, result: HostResult) -> HostResult:
        """The pull ended: when it succeeded, a last event with done = total.
        The result's output as plain lines (the terminal's stdout carried
        stderr too: it is where an error's words are)."""
        state = self.states.get(host)
        if state is not None and result.ok:
            for layer in state.layers.values():
                layer.complete = True
            self._emit(host, force=True)
        return replace(result, stdout=clean_terminal(result.stdout + result.stderr), stderr="")

    def _emit(self, host: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last.get(host, 0.0) < self.every:
            return
        self.last[host] = now
        state = self.states[host]
        done, total = state.done, state.total
        elapsed = max(now - self.started[host], 1e-6)
        self.sink.emit(
            ImageProgress(
                host=host,
                done=done,
                total=total,
                rate=done / elapsed,
                eta=self._eta(now),
                source="registry",
            )
        )

    def _eta(self, now: float) -> float | None:
        """The slowest host's remaining bytes at its rate; None while a
        host's total or rate is not known."""
        etas = []
        for host, state in self.states.items():
            done, total = state.done, state.total
            if total == 0 or done == 0:
                return None
            elapsed = max(now - self.started[host], 1e-6)
            etas.append(max(total - done, 0) * elapsed / done)
        return max(etas) if etas else None
