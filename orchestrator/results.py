"""Typed per-host outcomes of remote work."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import ExitCode, Status, Text

__all__ = ["CONNECTION_STATUSES", "HostResult", "Status", "exit_code_for"]

# Statuses that mean "we never got to run anything on that host".
CONNECTION_STATUSES: frozenset[str] = frozenset({"unreachable", "auth", "host_key"})


@dataclass(frozen=True)
class HostResult:
    """What one command did on one host.

    `status` separates a command that ran and failed (`failed`, with its exit
    code) from one that never ran (`unreachable`, `auth`, `host_key`) and from
    one we stopped (`timeout`). `error` says why in one line when not `ok`.
    """

    host: str
    status: Status
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    error: Text | None = None
    # Output is kept as a bounded tail per stream (SSHPool's `output_tail`):
    # how many characters were dropped from the front of each, and the file
    # holding the whole of it when there is one (a run's per-host log).
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    output_file: str | None = None
    # Bytes of each stream that were not UTF-8 text: `stdout`/`stderr` (and
    # the streamed lines) show each as a `\xNN` escape, never silently changed.
    stdout_not_text: int = 0
    stderr_not_text: int = 0
    # Why the command ended as it did, read on the host (containers/causes.py:
    # the OOM killer, the container's end), kept apart from `error`, which
    # says it after the code (`exit code 137: <cause>`), so readers need not
    # take the line apart.
    cause: Text | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def truncated(self) -> bool:
        """True when `stdout` or `stderr` is only the tail of what the command printed."""
        return bool(self.stdout_dropped or self.stderr_dropped)

    def not_text_note(self) -> str | None:
        """One line saying how many bytes of each stream were not text, if any."""
        parts = [
            f"{n} byte{'s' if n != 1 else ''} of {name}"
            for name, n in (("stdout", self.stdout_not_text), ("stderr", self.stderr_not_text))
            if n
        ]
        if not parts:
            return None
        return f"{' and '.join(parts)} not UTF-8 text, shown as \\xNN escapes"

    @property
    def reached(self) -> bool:
        return self.status not in CONNECTION_STATUSES

    def tail(self, lines: int = 20) -> str:
        """Last lines of combined output, for failure reports."""
        text = (self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr).rstrip()
        return "\n".join(text.splitlines()[-lines:])

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "status": self.status,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "duration": round(self.duration, 3),
            "error": self.error,
            "truncated": self.truncated,
            "dropped": {"stdout": self.stdout_dropped, "stderr": self.stderr_dropped},
            "output_file": self.output_file,
            "not_text": {"stdout": self.stdout_not_text, "stderr": self.stderr_not_text},
        }


def exit_code_for(results: list[HostResult]) -> ExitCode:
    """CLI exit code per docs/design.md: 3 if any host unreachable, else 1 if any failed."""
    if any(not r.reached for r in results):
        return ExitCode.UNREACHABLE
    if any(not r.ok for r in results):
        return ExitCode.FAILED
    return ExitCode.OK
