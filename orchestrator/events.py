"""Typed events the core emits, and the sinks that render or record them.

The core never prints. It calls `sink.emit(event)`; the CLI picks a sink: a
rich live view on a TTY, plain `host | line` text when piped (or `CI` /
`NO_COLOR` set), JSON lines with `--json`. A run directory records every event
with `JsonLinesSink` as well (see `TeeSink`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import IO, Any, Literal, Protocol

from orchestrator.errors import API_STYLE, Style, Text, restyled, say
from orchestrator.errortext import SeenErrors
from orchestrator.results import HostResult

Level = Literal["info", "warning", "error"]

# Steps that can take minutes (a multi-GB pull, an apt install): plain output
# announces them even without -v, so a quiet terminal is never a mystery.
SLOW_STEPS = frozenset({"pull", "load", "provision"})


@dataclass(frozen=True)
class Event:
    """Something that happened while cvs worked, as an EventSink receives it
    (`ts`: when, as time.time())."""

    ts: float = field(default_factory=time.time, kw_only=True)

    @property
    def kind(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if isinstance(getattr(self, "result", None), HostResult):
            data["result"] = self.result.to_dict()  # type: ignore[attr-defined]
        return {"event": self.kind, **data}


@dataclass(frozen=True)
class Connecting(Event):
    """The handshake with `host` (at `address`) starts."""

    host: str
    address: str


@dataclass(frozen=True)
class Connected(Event):
    """`host` is connected: the handshake took `seconds`, in `attempts` tries."""

    host: str
    seconds: float
    attempts: int = 1


@dataclass(frozen=True)
class ConnectFailed(Event):
    """`host` could not be connected to after `attempts` tries: its result's
    `status` and the error."""

    host: str
    status: str
    error: str
    attempts: int = 1


@dataclass(frozen=True)
class SentProgram:
    """A program cvs sent as one word of a command (orchestrator/remote): its
    name and the sha256 of its text, which events carry instead of the text."""

    name: str
    sha256: str


@dataclass(frozen=True)
class CommandStarted(Event):
    """`command` started on `host` (`label`: what cvs ran it for, e.g. exec).

    Build it with `started`: the programs sent in the command (11-15 KB each,
    the same on every host) are named in `command` and listed in `programs`,
    never copied into every host's event."""

    host: str
    command: str
    label: str | None = None
    programs: tuple[SentProgram, ...] = ()


# A program's text is a shell word of its own, single-quoted by shlex.quote
# (`'...'"'"'...'`); one this long, or over several lines, is a program.
_QUOTED_WORD = re.compile(r"""(?<![^\s=])(?:'[^']*'|"'")+(?![^\s;|&)])""")
_PROGRAM_WORD = 512
# sha256 -> name, filled by orchestrator.remote as it builds each program.
_NAMES: dict[str, str] = {}


def name_program(name: str, text: str) -> None:
    """Remember that `text` is program `name` (orchestrator.remote.program)."""
    _NAMES[hashlib.sha256(text.encode()).hexdigest()] = name


def started(host: str, command: str, label: str | None = None) -> CommandStarted:
    """CommandStarted for `command`, its programs named (`SentProgram`)."""
    shown, programs = _named(command)
    return CommandStarted(host=host, command=shown, label=label, programs=programs)


def named_here(event: Event) -> Event:
    """`event` as this process names its programs. A worker process
    (ssh/workers) builds its CommandStarted without the names: programs are
    built, and so named, in the main process, and the worker cannot import
    orchestrator.remote (a layer above). Its events pass through the main
    process, which names what it knows (a program passed as an argument has
    no `cvs-NAME` after it to fall back on)."""
    if not isinstance(event, CommandStarted):
        return event
    programs, command = [], event.command
    for sent in event.programs:
        name = _NAMES.get(sent.sha256, sent.name)
        if name != sent.name:
            short = sent.sha256[:12]
            command = command.replace(
                f"<program {sent.name} sha256:{short}>", f"<program {name} sha256:{short}>", 1
            )
        programs.append(SentProgram(name, sent.sha256))
    return replace(event, command=command, programs=tuple(programs))


@functools.lru_cache(maxsize=64)
def _named(command: str) -> tuple[str, tuple[SentProgram, ...]]:
    """`command` with each program word as `<program NAME sha256:12HEX>`.
    Cached: a fan-out sends the same text to every host."""
    if len(command) < _PROGRAM_WORD:
        return command, ()
    programs: list[SentProgram] = []

    def name(match: re.Match[str]) -> str:
        word = match.group(0)
        if len(word) < _PROGRAM_WORD and "\n" not in word:
            return word
        text = word.replace("'\"'\"'", "'")[1:-1]  # shlex.quote undone
        digest = hashlib.sha256(text.encode()).hexdigest()
        after = command[match.end() :].split(None, 1)
        fallback = after[0].removeprefix("cvs-") if after and after[0].startswith("cvs-") else "?"
        program = SentProgram(_NAMES.get(digest, fallback), digest)
        programs.append(program)
        return f"<program {program.name} sha256:{digest[:12]}>"

    return _QUOTED_WORD.sub(name, command), tuple(programs)


@dataclass(frozen=True)
class OutputLine(Event):
    """One line of a command's output, without its newline. A line longer
    than 64 KiB comes in pieces: `continues` is true on all but the last."""

    host: str
    stream: Literal["stdout", "stderr"]
    line: str
    continues: bool = False


@dataclass(frozen=True)
class CommandFinished(Event):
    """A command ended on `host`: its result."""

    host: str
    result: HostResult
    label: str | None = None


@dataclass(frozen=True)
class HostStep(Event):
    """Progress of a per-host pipeline (pull, run, provision, sshd, ...)."""

    host: str
    step: str
    status: Literal["started", "ok", "failed", "skipped"]
    detail: Text = ""


@dataclass(frozen=True)
class ImageProgress(Event):
    """The image moving onto `host` (containers/spread.py): `done` of `total`
    bytes (0: not known), at `rate` bytes/s, from `source` (the host feeding
    it, or `registry`: the host's own pull, containers/pull_progress.py);
    `eta`: seconds until every receiving host has it (None: not known
    yet). At most one a second per host."""

    host: str
    done: int
    total: int
    rate: float
    eta: float | None = None
    source: str = ""


@dataclass(frozen=True)
class Message(Event):
    """A line for the reader (information, a warning, an error), about `host` or none."""

    level: Level
    text: Text
    host: str | None = None


def in_words(event: Event, style: Style) -> Event:
    """`event` with its Phrases (errors.Phrase) in `style`'s words; an output
    line (the hot path, and never one) as it is."""
    return event if isinstance(event, OutputLine) else restyled(event, style)


class EventSink(Protocol):
    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


class NullSink:
    def emit(self, event: Event) -> None:
        pass

    def close(self) -> None:
        pass


class CollectingSink:
    """Keeps every event; for tests and for building summaries."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class TeeSink:
    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = list(sinks)

    def emit(self, event: Event) -> None:
        for sink in self.sinks:
            sink.emit(event)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class _PipeWriter:
    """Writes that survive the reader going away (`cvs exec ... | head -1`).

    A closed pipe never raises into the core (an exception in an SSH callback
    would tear the connection down, and with it the tear-down): the sink stops
    writing, points the stream at /dev/null (so the interpreter's last flush is
    quiet too) and calls `on_broken`, which the CLI uses to stop the remote
    commands.
    """

    on_broken: Callable[[], None] | None = None
    broken: bool = False

    def _put(self, stream: IO[str], text: str) -> None:
        if self.broken:
            return
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:
            self.broken = True
            _to_devnull(stream)
            if self.on_broken is not None:
                self.on_broken()


def _to_devnull(stream: IO[str]) -> None:
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, stream.fileno())
        os.close(fd)


class JsonLinesSink(_PipeWriter):
    """One JSON object per event; used for `--json` and for run directories.
    `output` False: the hosts' output is not what the command is for (status,
    up, plan, ...): no OutputLine events, and CommandFinished without stdout."""

    def __init__(self, stream: IO[str], *, output: bool = True) -> None:
        self.stream = stream
        self.output = output
        self.style: Style = API_STYLE  # whose words its messages are in (the CLI sets its own)
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        if not self.output and isinstance(event, OutputLine):
            return
        event = in_words(event, self.style)
        doc = event.to_dict()
        if not self.output and isinstance(event, CommandFinished) and event.result.stdout:
            # Not what the command is for (a program's frames, read by cvs: a
            # probe's inspect JSON): the result line says what it found.
            doc["result"]["stdout"] = ""
            doc["stdout_left_out"] = len(event.result.stdout)
        with self._lock:
            self._put(self.stream, json.dumps(doc, default=str) + "\n")

    def close(self) -> None:
        if not self.broken:
            with contextlib.suppress(BrokenPipeError):
                self.stream.flush()


class PlainSink(_PipeWriter):
    """`host | line` text: for pipes, CI logs and `NO_COLOR`."""

    def __init__(
        self, stream: IO[str] | None = None, *, verbose: bool = False, output: bool = True
    ) -> None:
        self.stream = stream or sys.stdout
        self.err = sys.stderr if stream is None else stream
        self.verbose = verbose
        self.output = output
        # Errors already printed: the same one on the next host is a pointer.
        self.seen = SeenErrors()
        # False when the command reports connect failures itself (`cvs status`).
        self.connect_failures = True
        self.style: Style = API_STYLE  # whose words its messages are in (the CLI sets its own)

    def emit(self, event: Event) -> None:
        line = self.render(in_words(event, self.style))
        if line is not None:
            if isinstance(event, OutputLine):
                self._put(self.stream, line + "\n")
            else:
                self.err.write(line + "\n")
                self.err.flush()

    def render(self, event: Event) -> str | None:
        match event:
            case OutputLine(host=host, line=line) if self.output:
                return f"{host} | {line}"
            case Message(level=level, text=text, host=host):
                prefix = f"{host}: " if host else ""
                tag = "" if level == "info" else f"{level}: "
                return f"{tag}{prefix}{text}"
            case ConnectFailed(host=host, status=status, error=error) if self.connect_failures:
                return f"{host} ! {self.seen.line(host, f'{status}: {error}')}"
            case CommandFinished(host=host, result=r) if self.verbose and not r.ok:
                code = f" (exit {r.exit_code})" if r.exit_code is not None else ""
                why = f": {say(r.error, self.style)}" if r.error else ""
                return f"{host} ! {r.status}{code}{why}"
            case HostStep(host=host, step=step, status=status, detail=detail) if (
                self.verbose or status == "failed" or (status == "started" and step in SLOW_STEPS)
            ):
                if status == "failed" and detail:
                    detail = self.seen.line(host, say(detail, self.style), context=step)
                said = say(detail, self.style)
                return f"{host} - {step}: {status}{' - ' + said if said else ''}"
            case ImageProgress(host=host, done=done, total=total, rate=rate, eta=eta) if (
                self.verbose
            ):
                return f"{host} - image: {progress_text(done, total, rate, eta)}"
            case Connected(host=host, seconds=s, attempts=n) if self.verbose:
                return f"{host} - connected in {s:.2f}s ({n} attempt{'s' if n > 1 else ''})"
        return None

    def close(self) -> None:
        if not self.broken:
            with contextlib.suppress(BrokenPipeError):
                self.stream.flush()


def wants_plain(stream: IO[str]) -> bool:
    """Plain text when not a TTY, or when CI / NO_COLOR ask for it."""
    if os.environ.get("CI") or os.environ.get("NO_COLOR"):
        return True
    return not (hasattr(stream, "isatty") and stream.isatty())


def progress_text(done: int, total: int, rate: float, eta: float | None) -> str:
    """`120.0 MiB of 244.0 MiB at 28.1 MiB/s, all hosts in ~5s`."""

    def size(n: float) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if n < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            n /= 1024
        return f"{n:.1f} GiB"

    of = f" of {size(total)}" if total else ""
    left = f", all hosts in ~{eta:.0f}s" if eta is not None else ""
    return f"{size(done)}{of} at {size(rate)}/s{left}"
