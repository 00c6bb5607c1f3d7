"""One error model: the exit codes and the expected failures that carry them.

Every expected failure is a `CvsError` subclass with its `ExitCode`; the CLI
turns any of them into one line on stderr and that code (`cli.main`). The
README's exit-code table is tested against `ExitCode` (tests/test_layout.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum


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


# The short meanings `cvs --help` lists and the README table starts with (both tested).
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


class UsageError(CvsError):
    """Bad command-line or file input: exit 2."""

    exit_code = ExitCode.USAGE


class PolicyRefused(CvsError):
    """The lifetime policy or image identity forbids acting: exit 4, nothing changed."""

    exit_code = ExitCode.REFUSED

    def __init__(self, reasons: list[str], changed: list[str] | None = None) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons
        # What was done before the refusal (an image pulled or loaded on some
        # hosts), so the CLI never says "nothing was changed" when it was.
        self.changed = list(changed or [])
