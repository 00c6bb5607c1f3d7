"""One error model: the exit codes and the expected failures that carry them.

Every expected failure is a `CvsError` subclass with its `ExitCode`; the CLI
turns any of them into one line on stderr and that code (`cli.main`). The
docs/cli.md's exit-code table is tested against `ExitCode` (tests/test_layout.py).
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import errno
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeVar, cast

T = TypeVar("T")


class ExitCode(IntEnum):
    """What the process exit status of `cvs` means. The higher, the worse: when
    several apply, the worst wins (`worst`)."""

    OK = 0
    FAILED = 1  # a command failed on some host
    USAGE = 2  # usage or config error (nothing contacted, nothing changed)
    UNREACHABLE = 3  # some host could not be reached
    REFUSED = 4  # refused by policy: partial persistent set, image skew, unreadable image
    INTERRUPTED = 130  # Ctrl-C / SIGTERM


def worst(codes: Iterable[int]) -> ExitCode:
    """The exit code that wins when several apply (OK when none does)."""
    return ExitCode(max(codes, default=ExitCode.OK))


# The short meanings `cvs --help` lists and the docs/cli.md table starts with (both tested).
EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.FAILED: "a command failed on some host",
    ExitCode.USAGE: "usage or config error",
    ExitCode.UNREACHABLE: "some host unreachable",
    ExitCode.REFUSED: "refused by policy",
    ExitCode.INTERRUPTED: "interrupted",
}


class CvsError(Exception):
    """A failure with a one-line message for the user and the exit code it means."""

    exit_code: ExitCode = ExitCode.FAILED


# What became of one host's remote work (results.HostResult.status); defined
# here so that ConnectError, the lowest layer's, can carry it.
Status = Literal["ok", "failed", "timeout", "unreachable", "auth", "host_key"]


class ConnectError(CvsError):
    """Connecting to a host failed; `status` is unreachable, auth or host_key
    (results.Status): exit 3, as for any host cvs cannot reach."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, host: str, status: Status, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.host = host
        self.status = status
        self.message = message
        self.attempts = attempts


class UsageError(CvsError):
    """Bad command-line or file input: exit 2."""

    exit_code = ExitCode.USAGE


# --- the expected failures, by where they arise (one module: the error model) ---


class ConfigError(UsageError):
    """A cluster (or suite) file is unusable. `str()` is one line for the user."""


class ResourceError(ConfigError, ValueError):
    """A resource request or cap is unusable. `str()` names the key.

    A ConfigError, so the CLI exits 2 on it like on any other bad value in the
    cluster file, whichever command met it first."""


class HostSelectionError(UsageError, ValueError):
    """A `--hosts` pattern matched no host of the cluster."""


class IdentityError(UsageError):
    """An identity file from the cluster file cannot be used (exit 2)."""


class StateDirError(CvsError):
    """cvs's state directory (the cluster's keys) cannot be written."""

    def __init__(self, state_dir: Path, exc: OSError) -> None:
        reason = exc.strerror or str(exc) or type(exc).__name__
        where = exc.filename or state_dir
        super().__init__(f"cannot write cvs's state directory {state_dir}: {where}: {reason}")
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR):
            self.exit_code = ExitCode.USAGE


class RecordError(CvsError):
    """The run directory could not be written: the run was stopped, not its tear-down."""

    def __init__(self, path: Path, exc: OSError) -> None:
        reason = exc.strerror or str(exc) or type(exc).__name__
        super().__init__(f"cannot write the run record {path}: {reason}; the run was stopped")
        self.path = path


class RunDirError(UsageError):
    """The run directory cannot be created or written (exit 2, nothing started)."""


class SandboxError(UsageError):
    """The sandbox cannot do what was asked. `str()` is one line for the user
    (the CLI prints it and exits 2)."""


# --- refusals: data, rendered by whoever talks to the user ----------------------


@dataclass(frozen=True)
class Option:
    """A keyword argument of a call (`force=True`); the CLI shows it as a flag."""

    name: str
    value: bool = True


@dataclass(frozen=True)
class Call:
    """A call of the API (`down(force=True)`); the CLI shows it as a command."""

    name: str
    options: tuple[Option, ...] = ()


@dataclass(frozen=True)
class WayOut:
    """One way out of a refusal: `text` says what it does; `options` (the same
    call again, with these) or `calls` (these, in order) say how, when it is
    something cvs does. Neither: a change the user makes."""

    text: str
    options: tuple[Option, ...] = ()
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True)
class Param:
    """A parameter named by itself (`run_dir`, `hosts`): what a value given to
    it is; the CLI shows its flag (`--run-dir`)."""

    name: str


class Style(Protocol):
    """How options, parameters and calls are shown: as keyword arguments (the
    API, `API_STYLE`) or as flags and commands (the CLI's style)."""

    def again(self, options: Sequence[Option]) -> str:
        """The same call again with `options` ("call again with force=True")."""
        ...

    def calls(self, calls: Sequence[Call]) -> str:
        """Other calls, in order ("`down(force=True)` then `up()`")."""
        ...

    def option(self, option: Option) -> str:
        """One option on its own ("force=True")."""
        ...

    def param(self, param: Param) -> str:
        """A parameter's name ("run_dir")."""
        ...


class _ApiStyle:
    def again(self, options: Sequence[Option]) -> str:
        return "call again with " + _keywords(options)

    def calls(self, calls: Sequence[Call]) -> str:
        return " then ".join(f"`{c.name}({_keywords(c.options)})`" for c in calls)

    def option(self, option: Option) -> str:
        return _keywords([option])

    def param(self, param: Param) -> str:
        return param.name


def _keywords(options: Sequence[Option]) -> str:
    return ", ".join(f"{o.name}={o.value}" for o in options)


API_STYLE: Style = _ApiStyle()


# --- text that names the API: data, like refusals ---------------------------------

# A piece of a Phrase: text, or what the Style renders (a tuple: calls in order).
Part = str | Option | Param | Call | tuple[Call, ...]


def _render(parts: Iterable[Part], style: Style) -> str:
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, Option):
            out.append(style.option(part))
        elif isinstance(part, Param):
            out.append(style.param(part))
        elif isinstance(part, Call):
            out.append(style.calls([part]))
        else:
            out.append(style.calls(part))
    return "".join(out)


class Phrase:
    """A warning, a reason or an error message that names options, parameters
    or calls of the API: `Phrase(Option("force"), ": replacing it")`.

    Not a str: it keeps its parts, so the CLI renders the sentence with its
    flags and commands (`render(style)`, `restyled`: "--force: replacing
    it") and an API caller reads keyword arguments ("force=True: replacing
    it", also what `str()` and an f-string give). Since it is no str, an
    operation that would drop the parts (`+`, a slice, `.splitlines()`,
    passing it where a str is typed) is a type error: compose with
    Phrase(...), which takes Phrases among its parts, and type what carries
    one as `Text`. An f-string is the one drop mypy cannot see:
    tests/test_cli_words.py finds the f-strings that format a field typed
    `Text` without saying in whose words (`say(x, style)`, or `{x!s}` for
    the API's)."""

    __slots__ = ("parts",)
    parts: tuple[Part, ...]

    def __init__(self, *parts: Part | Phrase) -> None:
        flat: list[Part] = []
        for part in parts:
            for piece in part.parts if isinstance(part, Phrase) else (part,):
                # Adjacent text is one part, empty text none: equal sentences
                # have equal parts however they were composed.
                if isinstance(piece, str) and flat and isinstance(flat[-1], str):
                    flat[-1] += piece
                elif piece != "":
                    flat.append(piece)
        object.__setattr__(self, "parts", tuple(flat))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Phrase does not change")

    def render(self, style: Style = API_STYLE) -> str:
        return _render(self.parts, style)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"Phrase{self.parts!r}"

    def __eq__(self, other: object) -> bool:
        """Another Phrase: the same parts. A str: the same API words (what a
        Python caller compares with)."""
        if isinstance(other, Phrase):
            return other.parts == self.parts
        return isinstance(other, str) and other == self.render()

    def __hash__(self) -> int:
        return hash(self.render())

    def __contains__(self, text: str) -> bool:
        """Whether the API's words hold `text` (what a test or a caller asks)."""
        return text in self.render()

    def __reduce__(self) -> tuple[Any, ...]:
        # copy, deepcopy (dataclasses.asdict) and pickle keep the parts.
        return (Phrase, self.parts)


# What a message, a reason or a warning is: plain text, or a Phrase that
# names the API (rendered by whoever talks to the user: `say`, `restyled`).
Text = str | Phrase


def first_line(text: Text) -> Text:
    """The first line of `text` (a Phrase's parts kept up to its first newline)."""
    if isinstance(text, str):
        return text.split("\n", 1)[0]
    parts: list[Part] = []
    for part in text.parts:
        if isinstance(part, str) and "\n" in part:
            parts.append(part.split("\n", 1)[0])
            break
        parts.append(part)
    return Phrase(*parts)


def join_text(separator: str, texts: Iterable[Text]) -> Text:
    """`separator.join(texts)`, a Phrase when any of them is one."""
    items = list(texts)
    if all(isinstance(t, str) for t in items):
        return separator.join(t for t in items if isinstance(t, str))
    parts: list[Part | Phrase] = []
    for i, t in enumerate(items):
        parts += [separator, t] if i else [t]
    return Phrase(*parts)


def say(text: Text, style: Style) -> str:
    """`text` in `style`'s words (a plain str is already in everyone's)."""
    return text.render(style) if isinstance(text, Phrase) else text


def restyled(value: T, style: Style) -> T:
    """`value` with every Phrase in it rendered in `style`: through dicts (and
    read-only views of them), lists, tuples and dataclass instances (copied,
    never changed in place); anything else is kept as it is. What the CLI
    applies to what the API hands it, at its boundary, before it prints or
    writes JSON."""
    return cast(T, _restyled(value, style))


def _restyled(value: Any, style: Style) -> Any:
    if isinstance(value, Phrase):
        return value.render(style)
    if isinstance(value, str | int | float | bytes) or value is None:
        return value
    if type(value) in (dict, MappingProxyType):
        items = {k: _restyled(v, style) for k, v in value.items()}
        if all(items[k] is v for k, v in value.items()):
            return value  # nothing to render: the same object, not a copy
        return items if type(value) is dict else MappingProxyType(items)
    if type(value) in (list, tuple):
        new = [_restyled(v, style) for v in value]
        if all(n is v for n, v in zip(new, value, strict=True)):
            return value
        return new if type(value) is list else tuple(new)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name, None)
            new = _restyled(old, style)
            if new is not old:
                changed[f.name] = new
        if not changed:
            return value
        copy = _copy.copy(value)
        for name, new in changed.items():
            object.__setattr__(copy, name, new)  # frozen ones too: a fresh copy
        return copy
    return value


@dataclass(frozen=True)
class Refusal:
    """Why cvs will not act: one line's worth, the hosts it is about, and the
    ways out. `kind` names the rule (tests and programs match on it, never on
    the words)."""

    kind: str
    reason: Text
    hosts: tuple[str, ...] = ()
    ways_out: tuple[WayOut, ...] = ()

    def render(self, style: Style = API_STYLE) -> str:
        reason = self.reason.render(style) if isinstance(self.reason, Phrase) else self.reason
        ways = []
        for way in self.ways_out:
            if way.options:
                ways.append(f"{style.again(way.options)} to {way.text}")
            elif way.calls:
                ways.append(f"{way.text} ({style.calls(way.calls)})")
            else:
                ways.append(way.text)
        if not ways:
            return reason
        return f"{reason}: {', or '.join(ways)}"


class PolicyRefused(CvsError):
    """The lifetime policy or image identity forbids acting: exit 4, nothing changed.

    `refusals` are the data; `reasons` the same rendered for an API caller
    (keyword arguments). The CLI renders `refusals` with its flags."""

    exit_code = ExitCode.REFUSED

    def __init__(self, reasons: Sequence[Refusal | str], changed: list[str] | None = None) -> None:
        self.refusals = [
            r if isinstance(r, Refusal) else Refusal(kind="other", reason=r) for r in reasons
        ]
        self.reasons = [r.render() for r in self.refusals]
        # What was done before the refusal (an image pulled or loaded on some
        # hosts), so neither the message nor the CLI says "nothing was
        # changed" when it was.
        self.changed = list(changed or [])
        done = f"; no container was started; done before: {'; '.join(self.changed)}"
        super().__init__("; ".join(self.reasons) + (done if self.changed else ""))
