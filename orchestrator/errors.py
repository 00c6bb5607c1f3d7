"""Errors the CLI maps to exit codes (DESIGN.md)."""

from __future__ import annotations


class CvsError(Exception):
    """A failure with a one-line message for the user and the exit code it means."""

    exit_code = 1


class UsageError(CvsError):
    """Bad command-line or file input: exit 2."""

    exit_code = 2


class PolicyRefused(CvsError):
    """The lifetime policy or image identity forbids acting: exit 4, nothing changed."""

    exit_code = 4

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons
